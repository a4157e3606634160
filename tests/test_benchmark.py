"""scripts/benchmark.py: the quick mode runs every code path and writes the promised report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from seq2seq.benchmark import Spread, attention_costs

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "data.train_size=120",
    "data.val_size=20",
    "data.test_size=20",
    "data.batch_size=32",
    "model.hidden_size=16",
    "model.embedding_size=8",
    "trainer.max_epochs=1",
    "logger=none",
    "threads=1",
]


def run_script(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/benchmark.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_quick_benchmark_writes_the_promised_json_table_and_plot(tmp_path: Path) -> None:
    report_path, plot = tmp_path / "bench.json", tmp_path / "cost.png"
    completed = run_script(
        "--json", str(report_path), "--plot", str(plot), "--quick", "--peer", "none", "--",
        *TINY, "model.decoder=luong", "attention=dot",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(report_path.read_text())
    for key in ("train_tgt_tok_per_s", "greedy_sent_per_s", "beam5_sent_per_s", "peak_rss_mb"):
        assert report[key] > 0, key
    assert "time_to_bleu95_s" in report  # None: a tiny model never reaches BLEU 95
    assert report["model"]["decoder"] == "seq2seq.decoder.LuongDecoder"
    assert set(report["attention_ms"]["parallel"]) == {"additive", "dot", "general", "scaled_dot"}
    assert "| train target tok/s |" in completed.stdout
    assert plot.stat().st_size > 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--json", "OUT", "--quick", "--peer", "none", "--", "attention=foo"], "attention"),
        (["--json", "OUT", "--quick", "--peer", "none", "--", "data=parallel"], "data.root"),
        (["--json", "OUT", "--peer", "joeynmt", "--quick", "--", *TINY], "--peer joeynmt"),
        (["--json", "OUT", "--repeats", "0"], "--repeats"),
    ],
)
def test_bad_arguments_get_one_paragraph_and_no_traceback(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    args = [str(tmp_path / "out.json") if arg == "OUT" else arg for arg in args]
    completed = run_script(*args, timeout=120)
    assert completed.returncode == 2
    assert expected in completed.stderr
    assert "Traceback" not in completed.stderr


def test_attention_costs_cover_every_scoring_function_and_length() -> None:
    costs = attention_costs(lengths=(4, 6), batch_size=2, hidden_size=8, repeats=1)
    for mode in ("parallel", "stepwise"):
        assert set(costs[mode]) == {"additive", "dot", "general", "scaled_dot"}
        for by_length in costs[mode].values():
            assert set(by_length) == {4, 6}
            assert all(
                spread.median is not None and spread.median > 0 for spread in by_length.values()
            )


def test_spread_is_the_median_with_min_and_max_of_the_known_values() -> None:
    spread = Spread.of([3.0, None, 1.0, 2.0])
    assert (spread.median, spread.min, spread.max) == (2.0, 1.0, 3.0)
    assert Spread.of([None]).text() == "n/a"
    assert spread.text() == "2 (1–3)"
