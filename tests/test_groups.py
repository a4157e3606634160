"""Runs as results: grouping ignores the seed and nothing else, and a real multirun of two scoring
functions over two seeds reads, through compare_runs.py, as two groups with intervals and paired
tests whose p-values are sacreBLEU's own command line's on the runs' kept test files."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from seq2seq.analysis.compare import RunsError, find_runs, read_run, read_runs
from seq2seq.analysis.groups import (
    Comparison,
    compare_groups,
    group_runs,
    groups_table,
    run_labels,
    significance_table,
    untested_groups,
)
from seq2seq.analysis.intervals import mean_interval
from seq2seq.analysis.metrics import TEST_ALIGNMENTS, TEST_HYPOTHESES, TEST_REFERENCES
from tests.configs import ROOT, TINY


def fake_run(directory: Path, config: dict[str, Any], test_bleu: float) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (directory / "summary.json").write_text(json.dumps({"test_bleu": test_bleu}))
    return directory


def config(seed: int, **changes: Any) -> dict[str, Any]:
    base = {
        "seed": seed, "run_dir": f"outputs/{seed}", "threads": 1,
        "attention": {"_target_": "seq2seq.attention.AdditiveAttention", "normalizer": "softmax"},
        "model": {"hidden_size": 256}, "data": {"module": {"seed": seed}, "cache_dir": ".cache"},
        "logger": {"group": f"sweep-{seed}"},
    }  # fmt: skip
    for key, value in changes.items():
        section, name = key.split("__")
        base[section] = {**base[section], name: value}
    return base


def test_grouping_ignores_the_seed_and_nothing_else(tmp_path: Path) -> None:
    runs = [
        fake_run(tmp_path / "a1", config(1), 90.0),
        fake_run(tmp_path / "a2", config(2), 91.0),
        fake_run(tmp_path / "b1", config(1, attention__normalizer="sparsemax"), 92.0),
        fake_run(tmp_path / "b2", config(2, attention__normalizer="sparsemax"), 93.0),
        fake_run(tmp_path / "c1", config(1, model__hidden_size=128), 80.0),
    ]
    groups = group_runs([read_run(path) for path in runs])
    assert [(g.label, [r.path.name for r in g.runs]) for g in groups] == [
        ("attention.normalizer=softmax, model.hidden_size=256", ["a1", "a2"]),
        ("attention.normalizer=sparsemax, model.hidden_size=256", ["b1", "b2"]),
        ("attention.normalizer=softmax, model.hidden_size=128", ["c1"]),
    ]
    by_model = group_runs([read_run(path) for path in runs], by=["model"])
    assert [g.label for g in by_model] == ["model.hidden_size=256", "model.hidden_size=128"]
    # Seeds as groups would put intervals and tests over settings: refused.
    with pytest.raises(RunsError, match="--by seed would make each seed a group"):
        group_runs([read_run(path) for path in runs], by=["seed"])
    with pytest.raises(RunsError, match=re.escape("--by model.hiden_size: no run's config.yaml")):
        group_runs([read_run(path) for path in runs], by=["model.hiden_size"])


@pytest.fixture(scope="module")
def multirun(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two scoring functions × two seeds, one tiny epoch each, through train.py -m, logged to
    W&B offline (no server)."""
    sweep = tmp_path_factory.mktemp("sweep")
    completed = subprocess.run(
        [sys.executable, "train.py", "-m", "attention=additive,scaled_dot", "seed=1,2", *TINY,
         "trainer.max_epochs=1", "logger=wandb", "threads=1", f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    return sweep


def test_a_run_keeps_its_test_translations_references_and_link_counts(multirun: Path) -> None:
    run = multirun / "0"
    hypotheses = (run / TEST_HYPOTHESES).read_text().splitlines()
    references = (run / TEST_REFERENCES).read_text().splitlines()
    counts = [line.split("\t") for line in (run / TEST_ALIGNMENTS).read_text().splitlines()]
    assert len(hypotheses) == len(references) == len(counts) == 50  # data.test_size
    assert all(len(row) == 4 for row in counts)
    # The summary's test BLEU is sacreBLEU's on the kept files (the toy data: tokenize none).
    from sacrebleu.metrics.bleu import BLEU

    summary = json.loads((run / "summary.json").read_text())
    bleu = BLEU(tokenize="none").corpus_score(hypotheses, [references]).score
    assert bleu == pytest.approx(summary["test_bleu"], abs=1e-3)


def test_compare_runs_reads_a_multirun_as_groups_with_intervals_and_paired_tests(
    multirun: Path, tmp_path: Path
) -> None:
    completed = subprocess.run(
        [sys.executable, "scripts/compare_runs.py", str(multirun), "--out", str(tmp_path),
         "--pair", str(multirun / "0"), str(multirun / "1"), "--test", "bs"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    out = completed.stdout
    # mean ± half-width, or an interval cut at BLEU's 100, [low, high]†
    interval = r"([0-9.]+) (?:± [0-9.]+|\[[0-9.]+, [0-9.]+\]†)"
    groups = re.findall(rf"^\| attention=(\w+) \| 2 \| {interval} \|", out, re.MULTILINE)
    assert sorted(name for name, _ in groups) == ["additive", "scaled_dot"]
    assert "fewer than 3 seeds" in out  # two seeds each: the table says so
    assert "| attention=additive | attention=scaled_dot | BLEU |" in out
    assert (tmp_path / "bleu_bands.png").is_file()
    # --pair: the first two jobs (seeds 1 and 2 of additive): sacreBLEU's CLI on their files.
    executable = shutil.which("sacrebleu")
    if executable is None:
        pytest.skip("the sacrebleu command is not on PATH")
    cli = subprocess.run(
        [executable, str(multirun / "0" / TEST_REFERENCES), "-i",
         str(multirun / "0" / TEST_HYPOTHESES), str(multirun / "1" / TEST_HYPOTHESES),
         "--paired-bs", "-m", "bleu", "chrf", "-f", "text", "--tokenize", "none"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    expected = re.findall(r"\(p = ([0-9.]+)\)", cli.stdout)
    pair_table = out.split("--pair (")[1]
    per_pair = (
        r"\| (?:BLEU|chrF) \| [-+0-9.]+ \| 1 \| ([≤0-9.]+)\*? \| "
        r"[0-9/]+: [-+0-9.]+, p ([≤0-9.]+)\*? \|"
    )
    rows = re.findall(per_pair, pair_table)
    first, second = ((multirun / job / TEST_HYPOTHESES).read_text() for job in ("0", "1"))
    if first == second:  # sacreBLEU's floor for two runs that translate alike; ours: p = 1
        assert rows == [("1.0000", "1.0000")] * 2
    else:
        assert [pair for _, pair in rows] == expected


def test_the_multirun_leaves_its_comparison_in_a_file_and_in_wandb(multirun: Path) -> None:
    """What compare_runs.py prints, the multirun wrote when it ended: comparison.md, and the same
    tables in a W&B summary run of the sweep (offline files: each table a JSON file)."""
    completed = subprocess.run(
        [sys.executable, "scripts/compare_runs.py", str(multirun), "--out",
         str(multirun.parent / f"{multirun.name}-cmp")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    printed = completed.stdout.split("Groups (mean ± 95 % interval over seeds):")[1]
    summary = (multirun / "comparison.md").read_text()
    assert "fewer than 3 seeds" in summary  # the groups table's notes, as compare prints them
    for table in ("| group | runs |", "| baseline | system | metric |"):
        start = printed.index(table)
        block = printed[start : printed.index("\n\n", start) if "\n\n" in printed[start:] else None]
        assert block.strip() in summary
    tables = {}
    for path in multirun.glob("wandb/offline-run-*/files/media/table/*.table.json"):
        tables[path.name.split("_")[0]] = json.loads(path.read_text())
    assert set(tables) == {"groups", "group", "paired"}  # group_numbers: "group"
    groups_markdown = printed[printed.index("| group | runs |") :].splitlines()
    header = [cell.strip() for cell in groups_markdown[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in groups_markdown[2:4]]
    assert tables["groups"]["columns"] == header
    assert tables["groups"]["data"] == rows
    # The same figures as numbers, which W&B can sort and plot.
    numbers = tables["group"]
    assert numbers["columns"] == ["group", "runs", "figure", "mean", "half_width", "low", "high"]
    for row in rows:
        [(mean, half, low, high)] = [
            tuple(number[3:7])
            for number in numbers["data"]
            if number[0] == row[0] and number[2] == "test BLEU"
        ]
        cut = f"{mean:.2f} [{low:.2f}, {high:.2f}]†"  # an interval cut at BLEU's range
        assert row[2] in (f"{mean:.2f} ± {half:.2f}", cut)


def run_compare(*arguments: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/compare_runs.py", *map(str, arguments)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def with_test_records(run: Path, references: list[str], hypotheses: list[str]) -> Path:
    (run / TEST_REFERENCES).write_text("".join(f"{r}\n" for r in references))
    (run / TEST_HYPOTHESES).write_text("".join(f"{h}\n" for h in hypotheses))
    return run


def test_bad_comparisons_are_one_paragraph(tmp_path: Path) -> None:
    first = with_test_records(
        fake_run(tmp_path / "a", config(1), 90.0), ["a b", "c d"], ["a b", "c"]
    )
    other_set = with_test_records(
        fake_run(tmp_path / "b", config(1, model__hidden_size=128), 80.0), ["x y", "z"], ["x", "z"]
    )
    no_records = fake_run(tmp_path / "c", config(2, model__hidden_size=64), 70.0)
    for arguments, expected in [
        (["--pair", first, other_set], "were tested on different sentences"),
        (["--pair", first, no_records], "has no test_hypotheses.txt"),
        (["--by", "model.hidden_size"], "puts every run in a group of its own"),
    ]:
        completed = run_compare(first, other_set, no_records, "--out", tmp_path / "out", *arguments)
        assert completed.returncode == 2, completed.stderr[-2000:]
        assert "Traceback" not in completed.stderr
        [error] = [line for line in completed.stderr.splitlines() if line.startswith("error: ")]
        assert expected in error
    # Without --pair the groups still print; the paired tests say why they are missing.
    completed = run_compare(first, no_records, "--out", tmp_path / "out")
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "| group | runs |" in completed.stdout
    assert (
        "no paired tests" in completed.stderr and "has no test_hypotheses.txt" in completed.stderr
    )


def overridden_run(
    directory: Path, seed: int, overrides: list[str], test_bleu: float, **changes: Any
) -> Path:
    """A fake run whose .hydra/overrides.yaml holds ``overrides`` and seed=SEED."""
    run = fake_run(directory, config(seed, **changes), test_bleu)
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([*overrides, f"seed={seed}"]))
    return run


def test_a_setting_left_at_its_default_is_named_by_its_config(tmp_path: Path) -> None:
    """additive is the default: its runs override no attention, dot's do. Labels from the
    overrides would call the additive group "all runs"; the config's keys name both."""
    runs = [
        overridden_run(tmp_path / "a1", 1, ["data.train_size=500"], 90.0),
        overridden_run(tmp_path / "a2", 2, ["data.train_size=500"], 91.0),
        overridden_run(
            tmp_path / "d1", 1, ["data.train_size=500", "attention=dot"], 80.0,
            attention___target_="seq2seq.attention.DotProductAttention",
        ),
    ]  # fmt: skip
    groups = group_runs([read_run(path) for path in runs])
    assert [g.label for g in groups] == [
        "attention=AdditiveAttention", "attention=DotProductAttention",
    ]  # fmt: skip
    # A sweep that overrides the same keys in every group is named by its overrides.
    sweep = [
        overridden_run(
            tmp_path / f"s{i}", 1, [f"attention={name}"], 90.0,
            attention___target_=f"seq2seq.attention.{target}",
        )
        for i, (name, target) in enumerate(
            [("additive", "AdditiveAttention"), ("scaled_dot", "DotProductAttention")]
        )
    ]  # fmt: skip
    assert [g.label for g in group_runs([read_run(p) for p in sweep])] == [
        "attention=additive", "attention=scaled_dot",
    ]  # fmt: skip


def test_by_a_section_groups_by_every_key_under_it(tmp_path: Path) -> None:
    runs = [
        fake_run(tmp_path / "a1", config(1), 90.0),
        fake_run(tmp_path / "b1", config(1, attention__normalizer="sparsemax"), 92.0),
        fake_run(tmp_path / "b2", config(2, attention__normalizer="sparsemax"), 93.0),
    ]
    groups = group_runs([read_run(path) for path in runs], by=["attention"])
    assert [[r.path.name for r in g.runs] for g in groups] == [["a1"], ["b1", "b2"]]


def test_repeated_seeds_in_a_group_are_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runs = [fake_run(tmp_path / f"r{i}", config(1), 90.0 + i) for i in range(2)]
    with caplog.at_level("WARNING"):
        group_runs([read_run(path) for path in runs])
    assert "holds several runs of seed 1" in caplog.text


def test_a_run_given_twice_is_read_once_and_said(
    multirun: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The same multirun twice, or a job beside its multirun: each run once, with a warning."""
    once = find_runs([multirun])
    with caplog.at_level("WARNING"):
        assert find_runs([multirun, multirun]) == once
    # One line for the directory given twice, not one for each of its runs.
    assert caplog.text.count("given before") == 1
    assert f"{len(once)} of its {len(once)} runs were given before" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert find_runs([multirun / "0", multirun]) == [multirun / "0", *once[1:]]
    assert f"1 of its {len(once)} runs was given before" in caplog.text


def test_an_untestable_pair_leaves_out_only_itself(tmp_path: Path) -> None:
    """A run without its test records costs its own pairs, not every paired test."""
    sentences = ["a b", "c d", "e f"]
    runs = [
        with_test_records(fake_run(tmp_path / "a1", config(1), 90.0), sentences, sentences),
        with_test_records(fake_run(tmp_path / "a2", config(2), 91.0), sentences, sentences),
        with_test_records(
            fake_run(tmp_path / "b1", config(1, model__hidden_size=128), 80.0),
            sentences, ["a b", "c", "e f"],
        ),
        fake_run(tmp_path / "b2", config(2, model__hidden_size=128), 81.0),  # no records
    ]  # fmt: skip
    completed = run_compare(*runs, "--out", tmp_path / "out", "--samples", "200")
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "Paired tests" in completed.stdout and "| BLEU |" in completed.stdout
    assert "left out of the paired tests" in completed.stderr and "b2 has no" in completed.stderr


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--samples", "100000000"], "--samples: at most 100,000"),
        (["--pair", "RUN", "/nonexistent/run"], "--pair /nonexistent/run: no such run directory"),
    ],
)
def test_more_bad_comparisons_are_one_paragraph(
    tmp_path: Path, arguments: list[str], message: str
) -> None:
    run = fake_run(tmp_path / "a", config(1), 90.0)
    arguments = [str(run) if a == "RUN" else a for a in arguments]
    completed = run_compare(run, "--out", tmp_path / "out", *arguments)
    assert completed.returncode == 2 and "Traceback" not in completed.stderr
    assert message in completed.stderr


def test_a_corrupt_summary_is_one_paragraph(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "a", config(1), 90.0)
    (run / "summary.json").write_text('{"test_bleu": 9')
    completed = run_compare(run, "--out", tmp_path / "out")
    assert completed.returncode == 2 and "Traceback" not in completed.stderr
    assert "summary.json is not valid JSON" in completed.stderr


def test_an_interval_never_reaches_past_what_the_figure_can_be() -> None:
    """Two seeds at 99.5 and 100 BLEU: the t interval (±3.2) would reach 103; it is cut at 100
    and marked, its low end kept."""
    plain = mean_interval([99.5, 100.0])
    cut = mean_interval([99.5, 100.0], bounds=(0.0, 100.0))
    assert plain.high > 100 and not plain.clipped
    assert (cut.low, cut.high, cut.clipped) == (plain.low, 100.0, True)
    assert cut.format(1) == f"99.8 [{plain.low:.1f}, 100.0]†"
    inside = mean_interval([40.0, 41.0, 42.0], bounds=(0.0, 100.0))
    assert not inside.clipped and inside.format(1) == "41.0 ± 2.5"


def test_the_groups_table_says_when_seeds_are_too_few_and_intervals_cut(tmp_path: Path) -> None:
    runs = [
        fake_run(tmp_path / "a1", config(1), 99.5),
        fake_run(tmp_path / "a2", config(2), 100.0),
        fake_run(tmp_path / "b1", config(1, attention__normalizer="sparsemax"), 90.0),
        fake_run(tmp_path / "b2", config(2, attention__normalizer="sparsemax"), 91.0),
        fake_run(tmp_path / "b3", config(3, attention__normalizer="sparsemax"), 92.0),
    ]
    table = groups_table(group_runs([read_run(path) for path in runs]))
    assert "100.00]†" in table and "shown cut there" in table
    assert "attention.normalizer=softmax: fewer than 3 seeds" in table
    assert "sparsemax: fewer" not in table


def test_every_run_is_named_by_its_groups_setting_and_its_seed(tmp_path: Path) -> None:
    """The same name in the runs' table, the plots and the explorer; the group table's label
    is its prefix. A repeated seed, or a run without one, adds its directory's name."""
    paths = [
        fake_run(tmp_path / "a1", config(1), 90.0),
        fake_run(tmp_path / "a2", config(2), 91.0),
        fake_run(tmp_path / "b2", config(2, attention__normalizer="sparsemax"), 92.0),
        fake_run(tmp_path / "b2again", config(2, attention__normalizer="sparsemax"), 93.0),
    ]
    runs = [read_run(path) for path in paths]
    groups = group_runs(runs)
    assert run_labels(runs, groups) == [
        "attention.normalizer=softmax, seed 1",
        "attention.normalizer=softmax, seed 2",
        "attention.normalizer=sparsemax, seed 2 (b2)",
        "attention.normalizer=sparsemax, seed 2 (b2again)",
    ]
    for group in groups:
        assert re.search(rf"\| {re.escape(group.label)}( ‡)? \|", groups_table(groups))
    one_group = [read_run(path) for path in paths[:2]]
    for run in one_group:
        run.summary["attention"] = "additive"
    assert run_labels(one_group, group_runs(one_group)) == ["additive, seed 1", "additive, seed 2"]
    unseeded = fake_run(tmp_path / "c", {k: v for k, v in config(3).items() if k != "seed"}, 1.0)
    [label] = run_labels([read_run(unseeded)], group_runs([read_run(unseeded)]))
    assert label.endswith("(c)") and "seed" not in label


def test_a_comparisons_explorer_holds_what_a_page_holds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """More runs than MAX_MODELS: every group's first seed, then every group's second, ... up to
    the limit; the others named in the log."""
    from seq2seq.commands.compare import page_models
    from seq2seq.explorer import MAX_MODELS

    sizes = (64, 128, 256, 512, 1024, 2048)
    paths = [
        fake_run(tmp_path / f"{size}-{seed}", config(seed, model__hidden_size=size), 90.0)
        for size in sizes
        for seed in (3, 1, 2)
    ]
    runs = [read_run(path) for path in paths]
    groups = group_runs(runs)
    candidates = list(zip(run_labels(runs, groups), runs, strict=True))
    assert len(candidates) == 18 > MAX_MODELS == 16
    with caplog.at_level(logging.WARNING):
        chosen = page_models(candidates, groups)
    names = [run.path.name for _, run in chosen]
    assert names == [f"{size}-{seed}" for seed in (1, 2, 3) for size in sizes][:16]
    assert "holds 16 models at most" in caplog.text
    assert "model.hidden_size=2048, seed 3" in caplog.text.split("; not ")[1]
    # Fewer: all of them, in the same turns, so that the first models shown are one a setting.
    few = page_models(candidates[:6], groups)  # 64's seeds 3, 1, 2 and 128's
    assert [run.path.name for _, run in few] == ["64-1", "128-1", "64-2", "128-2", "64-3", "128-3"]


def test_a_group_of_one_run_and_a_repeated_seed_are_said(tmp_path: Path) -> None:
    """One run: the table says it has no interval. A seed run twice in a group: one pair."""
    paths = [
        fake_run(tmp_path / "a1", config(1), 90.0),
        fake_run(tmp_path / "a1again", config(1), 90.5),
        fake_run(tmp_path / "b1", config(1, attention__normalizer="sparsemax"), 92.0),
    ]
    groups = group_runs([read_run(path) for path in paths])
    table = groups_table(groups)
    assert "attention.normalizer=sparsemax: one run" in table
    from seq2seq.analysis.groups import seed_pairs

    assert [(a.path.name, b.path.name) for a, b in seed_pairs(*groups)] == [("a1", "b1")]


def test_two_copies_of_a_sweep_are_no_finding_over_seeds(multirun: Path, tmp_path: Path) -> None:
    """The same runs twice, told apart by one config key only: every pooled p (BLEU, chrF, AER)
    is 1, where a test that never gives a large p would find them different."""
    copies = []
    for job in ("0", "1"):  # seeds 1 and 2 of one setting
        for copy in ("first", "second"):
            target = tmp_path / copy / job
            shutil.copytree(multirun / job, target)
            config = yaml.safe_load((target / "config.yaml").read_text())
            config["note"] = copy
            (target / "config.yaml").write_text(yaml.safe_dump(config))
            copies.append(read_run(target))
    groups = group_runs(copies)
    assert [group.label for group in groups] == ["note=first", "note=second"]
    comparisons = compare_groups(groups, "none")
    assert {c.metric for c in comparisons} == {"BLEU", "chrF", "AER"}
    assert all(c.p_value == 1.0 and c.difference == 0 for c in comparisons)


def test_one_group_is_named_by_its_overrides_and_says_there_is_nothing_to_test(
    tmp_path: Path,
) -> None:
    """A sweep of one setting: the group and its runs are named by what it overrides (not
    "all runs" and the scoring function), and compare prints its interval and why no tests."""
    paths = [
        overridden_run(tmp_path / f"s{seed}", seed, ["attention.normalizer=sparsemax"], 90.0 + seed)
        for seed in (1, 2, 3)
    ]
    runs = [read_run(path) for path in paths]
    groups = group_runs(runs)
    assert [group.label for group in groups] == ["attention.normalizer=sparsemax"]
    assert run_labels(runs, groups)[1] == "attention.normalizer=sparsemax, seed 2"
    completed = subprocess.run(
        [sys.executable, "scripts/compare_runs.py", *map(str, paths), "--out",
         str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "| attention.normalizer=sparsemax | 3 |" in completed.stdout
    assert "One group: every run has the same setting" in completed.stdout


def comparison(metric: str, difference: float, p: float, beyond: bool | None) -> Comparison:
    return Comparison("softmax", "sparsemax", metric, difference, beyond, p, 10_000, (p, p, p))


@pytest.mark.parametrize(
    ("comparisons", "verdict_line"),
    [
        (
            [comparison("BLEU", 0.3, 0.01, False), comparison("AER", -0.1, 0.0001, True)],
            "Findings: 1 of the 2 differences: sparsemax against softmax, AER -0.100.",
        ),
        (
            [comparison("BLEU", 0.3, 0.01, False), comparison("chrF", 0.1, 0.4, False)],
            "Findings: none of the 2 differences; 1 with p (seeds pooled) below 0.05, none beyond "
            "the seed spread.",
        ),
        (
            [comparison("BLEU", 0.3, 0.01, None)],
            "Findings: none can be read: in every pair, one group",
        ),
    ],
    ids=["one", "none", "one seed"],
)
def test_the_paired_tests_end_in_a_verdict(
    comparisons: list[Comparison], verdict_line: str
) -> None:
    """A skimmer reads the stars of p per seed pair as differences: the finding column and the
    last line say which differences are findings (p over seeds small and beyond the spread)."""
    table = significance_table(comparisons, "ar")
    assert verdict_line in table
    rows = [line for line in table.splitlines() if line.startswith("| softmax |")]
    expected = ["**yes**" if c.beyond_spread and c.p_value < 0.05 else
                "–" if c.beyond_spread is None else "no" for c in comparisons]  # fmt: skip
    assert [row.rstrip(" |").rsplit("| ", 1)[1] for row in rows] == expected


def test_two_sweeps_of_one_setting_fall_apart_by_input(tmp_path: Path) -> None:
    """Two sweeps whose configs differ only in where they ran are one group by default (its
    seeds repeated, said); --by input makes a group of each directory given."""
    for sweep in ("first", "second"):
        for seed in (1, 2):
            run = fake_run(tmp_path / sweep / str(seed), config(seed), 90.0 + seed)
            (run / "metrics.csv").write_text("step\n")  # what makes it a multirun's job
    runs = read_runs([tmp_path / "first", tmp_path / "second"])
    assert [group.label for group in group_runs(runs)] == ["all runs"]
    groups = group_runs(runs, by=["input"])
    assert [group.label for group in groups] == [
        f"input={tmp_path / 'first'}", f"input={tmp_path / 'second'}",
    ]  # fmt: skip
    assert [[run.path.name for run in group.runs] for group in groups] == [["1", "2"]] * 2


def test_each_seed_pairs_p_names_its_seed_and_a_floor_is_shown_as_one() -> None:
    """p per seed pair reads "seed: p"; a randomization's smallest p, 1 / (shuffles + 1), is
    shown as ≤ it (the test cannot tell smaller ones apart)."""
    floor = 1 / 10_001
    row = Comparison(
        "softmax",
        "sparsemax",
        "AER",
        -0.1,
        True,
        floor,
        10_000,
        (0.3, floor, 0.02),
        ("1", "2", "3/4"),
    )
    [line] = [line for line in significance_table([row], "ar").splitlines() if "| AER |" in line]
    assert "| ≤0.0001* | 1: p 0.3000; 2: p ≤0.0001*; 3/4: p 0.0200* |" in line
    row = Comparison(
        "softmax", "sparsemax", "AER", -0.1, True, floor, 10_000, (0.3,), ("1",), (-0.032,)
    )
    assert "| 1: -0.032, p 0.3000 |" in significance_table([row], "ar")


def test_a_group_with_a_repeated_seed_gets_no_paired_test(tmp_path: Path) -> None:
    """Which run of a seed a test would use is arbitrary (its Δ mean is over all of them): no
    test is run, and the labels of a group of several settings name each run's own."""
    sentences = ["a b", "c d"]
    settings = [
        ("a1", {"normalizer": "softmax", "alpha": None}, sentences),
        ("s1", {"normalizer": "sparsemax", "alpha": None}, sentences),
        ("e1", {"normalizer": "entmax", "alpha": "learnable"}, ["a b", "c"]),
    ]
    paths = []
    for name, attention, hypotheses in settings:
        changes = {f"attention__{key}": value for key, value in attention.items()}
        run = fake_run(tmp_path / name, config(1, **changes), 90.0)
        paths.append(with_test_records(run, sentences, hypotheses))
    runs = [read_run(path) for path in paths]
    groups = group_runs(runs, by=["attention.alpha"])
    assert [g.label for g in groups] == ["attention.alpha=unset", "attention.alpha=learnable"]
    assert run_labels(runs, groups)[:2] == [
        "attention.alpha=unset: attention.normalizer=softmax, seed 1",
        "attention.alpha=unset: attention.normalizer=sparsemax, seed 1",
    ]
    with pytest.raises(RunsError, match="holds several runs of one seed"):
        compare_groups(groups, "none")


def test_seed_pairs_take_a_shared_seed_first_and_name_the_runs_left_untested(
    tmp_path: Path,
) -> None:
    """A single run of seed 2 pairs with the other group's seed 2 (identical runs: p = 1), and
    the other group's seeds 1 and 3, in Δ mean but in no test, are named in the table."""
    sentences = ["a b", "c d", "e f"]
    paths = [
        with_test_records(fake_run(tmp_path / f"a{seed}", config(seed), 90.0), sentences, hyps)
        for seed, hyps in [(1, ["a", "c d", "e f"]), (2, sentences), (3, ["a b", "c", "e"])]
    ]
    paths.append(
        with_test_records(
            fake_run(tmp_path / "b2", config(2, model__hidden_size=128), 90.0),
            sentences, sentences,
        )
    )  # fmt: skip
    runs = [read_run(path) for path in paths]
    groups = group_runs(runs)
    [bleu, *_] = compare_groups(groups, "none")
    assert bleu.seeds == ("2",) and bleu.p_value == 1.0 and bleu.pair_differences == (0.0,)
    first = groups[0].label
    assert bleu.untested == (f"{first}, seed 1", f"{first}, seed 3")
    table = significance_table([bleu], "ar")
    assert f"| 1 (untested: {first}, seed 1; {first}, seed 3) |" in table
    assert f"| {bleu.difference:+.2f} (pairs tested: +0.00) |" in table
    assert "in every pair, one group has a single run" in table


def test_a_group_of_repeated_seeds_is_marked_in_the_groups_table(tmp_path: Path) -> None:
    """Two sweeps of one setting read as one group: the row is marked and the note says why
    its interval is too narrow and what splits it."""
    paths = [
        fake_run(tmp_path / f"{sweep}{seed}", config(seed), 90.0 + seed)
        for sweep in "ab" for seed in (1, 2, 3)
    ]  # fmt: skip
    table = groups_table(group_runs([read_run(path) for path in paths]))
    assert "| all runs ‡ | 6 |" in table
    assert "‡ all runs: several runs of one seed" in table and "--by input" in table
    # Of several settings, the advice is to group by what tells them apart, not --by input.
    mixed = fake_run(tmp_path / "s1", config(1, attention__normalizer="sparsemax"), 90.0)
    runs = [read_run(path) for path in [*paths[:3], mixed]]
    [group] = group_runs(runs, by=["model"])
    table = groups_table([group])
    assert "its runs are of several settings" in table and "--by input" not in table
    assert untested_groups([group, *group_runs(runs[:1])]) == [
        f"{group_runs(runs[:1])[0].label} against {group.label}"
    ]


def test_a_bootstrap_floor_is_shown_as_at_most() -> None:
    floor = 1 / 1001
    row = Comparison(
        "softmax", "sparsemax", "BLEU", 1.0, True, 0.5, 10_000, (floor,), ("1",), (1.0,),
        resamples=1000,
    )  # fmt: skip
    assert "| 1: +1.00, p ≤0.0010* |" in significance_table([row], "bs")
