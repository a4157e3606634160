"""scripts/benchmark.py: the quick mode runs every code path and writes the promised report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks.benchmark import (
    BenchmarkOptions,
    attention_costs,
    benchmark_device,
    chosen_peers,
    compose_config,
    repeat_config,
)
from benchmarks.common import Spread, in_fresh_process, time_to_bleu
from benchmarks.joey import _joey_job, _quiet_joey, joey_config, joeynmt_available
from benchmarks.opennmt import (
    opennmt_available,
    opennmt_config,
    opennmt_python,
    parse_opennmt_log,
)
from benchmarks.report import markdown_table
from seq2seq.errors import ConfigError
from tests.scoring import SCORING_FUNCTIONS

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
    assert report["model"]["decoder"] == "seq2seq.models.LuongDecoder"
    assert sorted(report["attention_ms"]["parallel"]) == SCORING_FUNCTIONS
    assert "| train target tok/s |" in completed.stdout
    assert plot.stat().st_size > 0


NO_OPENNMT = ["--peer", "opennmt", "--opennmt-python", "MISSING"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--json", "OUT", "--quick", "--peer", "none", "--", "attention=foo"], "attention"),
        (["--json", "OUT", "--quick", "--peer", "none", "--", "data=parallel"], "data.root"),
        (["--json", "OUT", "--peer", "joeynmt", "--quick", "--", *TINY], "--peer joeynmt"),
        (["--json", "OUT", *NO_OPENNMT, "--quick", "--", *TINY], "--peer opennmt: OpenNMT-py"),
        (["--json", "OUT", "--repeats", "0"], "--repeats"),
    ],
)
def test_bad_arguments_get_one_paragraph_and_no_traceback(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    names = {"OUT": tmp_path / "out.json", "MISSING": tmp_path / "no-venv" / "bin" / "python"}
    args = [str(names[arg]) if arg in names else arg for arg in args]
    completed = run_script(*args, timeout=120)
    assert completed.returncode == 2
    assert expected in completed.stderr
    assert "Traceback" not in completed.stderr


def test_attention_costs_cover_every_scoring_function_and_length() -> None:
    costs = attention_costs(lengths=(4, 6), batch_size=2, hidden_size=8, repeats=1)
    for mode in ("parallel", "stepwise"):
        assert sorted(costs[mode]) == SCORING_FUNCTIONS
        for by_length in costs[mode].values():
            assert set(by_length) == {4, 6}
            assert all(
                spread.median is not None and spread.median > 0 for spread in by_length.values()
            )


def test_each_repeat_moves_the_seed_and_the_batch_order(tmp_path: Path) -> None:
    """A repeat is what ``train.py seed=S+r`` would run: the model's seed and the training batch
    order's, which the resolved config holds apart, both moved on; nothing else changes."""
    config = compose_config([*reverse_task(tmp_path, train_sentences=130), "seed=7"], tmp_path)
    again = compose_config([*reverse_task(tmp_path, train_sentences=130), "seed=9"], tmp_path)
    assert config["data"]["module"]["seed"] == 7  # resolved: a number of its own
    assert repeat_config(config, 2) == again
    assert repeat_config(config, 0) == config
    assert config["seed"] == 7 and config["data"]["module"]["seed"] == 7  # left as it was


def test_spread_is_the_median_with_min_and_max_of_the_known_values() -> None:
    spread = Spread.of([3.0, None, 1.0, 2.0])
    assert (spread.median, spread.min, spread.max) == (2.0, 1.0, 3.0)
    assert Spread.of([None]).text() == "n/a"
    assert spread.text() == "2 (1–3)"


def reverse_task(root: Path, train_sentences: int) -> list[str]:
    """A few lines of the peers' reverse task in ``root``; the overrides that read them."""
    for split, count in [("train", train_sentences), ("dev", 4), ("test", 4)]:
        (root / f"{split}.src").write_text("w1 w2 w3\n" * count)
        (root / f"{split}.trg").write_text("w3 w2 w1\n" * count)
    return [
        "experiment=bench_reverse", "data=parallel", f"data.root={root}", "data.train=train",
        "data.val=dev", "data.test=test", "data.src_lang=src", "data.tgt_lang=trg",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("attention", "expected"),
    [("additive", "mlp"), ("dot", "dot"), ("scaled_dot", "dot"), ("general", "general")],
)
def test_opennmt_config_is_the_same_work_as_ours(
    tmp_path: Path, attention: str, expected: str
) -> None:
    overrides = reverse_task(tmp_path, train_sentences=130)
    config = compose_config(
        [*overrides, f"attention={attention}", "optim.optimizer.lr=0.002", "optim.grad_clip=3"],
        tmp_path / "run",
    )
    onmt = opennmt_config(config, tmp_path / "work", val_check_interval=1.0, report_every=20)
    assert onmt["global_attention"] == expected
    assert (onmt["encoder_type"], onmt["rnn_type"], onmt["input_feed"]) == ("brnn", "GRU", 0)
    assert onmt["enc_hid_size"] == 256  # 2 directions x our encoder_hidden_size 128
    assert (onmt["dec_hid_size"], onmt["word_vec_size"], onmt["dropout"]) == (256, 128, [0.1])
    assert (onmt["learning_rate"], onmt["max_grad_norm"], onmt["optim"]) == (0.002, 3.0, "adam")
    assert (onmt["batch_size"], onmt["batch_type"], onmt["normalization"]) == (64, "sents", "sents")
    assert onmt["valid_batch_size"] == config["data"]["eval_batch_size"] == 64  # validation too
    assert onmt["train_steps"] == 3 * 3  # 3 epochs of ceil(130 / 64) batches
    assert onmt["save_checkpoint_steps"] == onmt["train_steps"]  # the end only
    assert (onmt["valid_steps"], onmt["valid_metrics"]) == (3, ["BLEU"])  # once an epoch
    assert (onmt["report_every"], onmt["num_workers"], onmt["bucket_size"]) == (20, 0, 20000)
    assert onmt["data"]["corpus_1"]["path_tgt"] == str(tmp_path / "train.trg")
    assert onmt["data"]["valid"]["path_src"] == str(tmp_path / "dev.src")


# Captured from OpenNMT-py 3.5.1's onmt_train on the reverse task (report_every 10, 1 thread).
ONMT_LOG = """\
[2026-11-22 13:15:24,522 INFO] Starting training on CPU, could be very slow
[2026-11-22 13:15:24,523 INFO] Start training loop and validate every 1000000 steps...
[2026-11-22 13:15:24,523 INFO] Scoring with: None
  with torch.cuda.amp.autocast(enabled=self.optim.amp):
[2026-11-22 13:15:27,730 INFO] Step 10/   30; acc: 6.8; ppl:  55.0; xent: 4.0; lr: 0.00100; \
sents:     640; bsz:  797/ 861/64; 2486/2686 tok/s;      3 sec;
[2026-11-22 13:15:28,808 INFO] Step 20/   30; acc: 7.5; ppl:  49.0; xent: 3.9; lr: 0.00100; \
sents:     640; bsz:  806/ 870/64; 7482/8075 tok/s;      4 sec;
[2026-11-22 13:15:30,235 INFO] Step 30/   30; acc: 6.3; ppl:  49.2; xent: 3.9; lr: 0.00100; \
sents:     640; bsz: 1088/1152/64; 7623/8072 tok/s;      6 sec;
[2026-11-22 13:15:30,236 INFO] Saving checkpoint /tmp/onmt/model_step_30.pt
"""


def test_opennmt_log_gives_steady_state_speed_after_the_warm_up_windows() -> None:
    steady = parse_opennmt_log(ONMT_LOG, warmup_batches=10)  # the first window is the warm-up
    seconds = 30.235 - 27.730
    assert steady["train_tgt_tok_per_s"] == pytest.approx((870 + 1152) * 10 / seconds)
    assert steady["train_tgt_tok_per_s"] == pytest.approx(8072, rel=0.01)  # as onmt says
    assert steady["train_sent_per_s"] == pytest.approx(1280 / seconds)
    assert steady["train_seconds"] == pytest.approx(30.235 - 24.523)
    assert [window["step"] for window in steady["windows"]] == [10, 20, 30]
    everything = parse_opennmt_log(ONMT_LOG, warmup_batches=0)
    assert everything["train_tgt_tok_per_s"] == pytest.approx(
        (861 + 870 + 1152) * 10 / (30.235 - 24.523)
    )
    assert parse_opennmt_log(ONMT_LOG, warmup_batches=30)["train_tgt_tok_per_s"] is None


# Captured from OpenNMT-py 3.5.1's onmt_train on 300 pairs of the reverse task (batches of 32,
# 2 epochs = 20 updates, report_every 2, valid_steps 5 with valid_metrics BLEU, 1 thread), from
# "Start training loop" on; of the data loader's "Weighted corpora loaded" messages and torch's
# warnings, only the first message is kept.
ONMT_VALID_LOG = """\
[2026-11-22 15:50:46,883 INFO] Start training loop and validate every 5 steps...
[2026-11-22 15:50:46,884 INFO] Scoring with: None
[2026-11-22 15:50:46,889 INFO] Weighted corpora loaded so far:
\t\t\t* corpus_1: 2
[2026-11-22 15:50:47,990 INFO] Step  2/   20; acc: 2.0; ppl:  56.2; xent: 4.0; \
lr: 0.00100; sents:      50; bsz:  484/ 510/25; 876/921 tok/s;      1 sec;
[2026-11-22 15:50:48,010 INFO] Step  4/   20; acc: 0.4; ppl:  56.4; xent: 4.0; \
lr: 0.00100; sents:      64; bsz:  218/ 250/32; 21989/25217 tok/s;      1 sec;
[2026-11-22 15:50:48,037 INFO] valid stats calculation
                           took: 0.005224943161010742 s.
[2026-11-22 15:50:48,066 INFO] The translation of the valid dataset for dynamic scoring
                               took : 0.028516530990600586 s.
[2026-11-22 15:50:48,066 INFO] UPDATING VALIDATION BLEU
[2026-11-22 15:50:48,075 INFO] validation BLEU: 0.15332277009202125
[2026-11-22 15:50:48,076 INFO] Train perplexity: 56.1742
[2026-11-22 15:50:48,076 INFO] Train accuracy: 1.78094
[2026-11-22 15:50:48,076 INFO] Sentences processed: 146
[2026-11-22 15:50:48,076 INFO] Average bsz:  420/ 449/29
[2026-11-22 15:50:48,076 INFO] Validation perplexity: 56.1162
[2026-11-22 15:50:48,076 INFO] Validation accuracy: 2.02703
[2026-11-22 15:50:48,093 INFO] Step  6/   20; acc: 2.2; ppl:  56.0; xent: 4.0; \
lr: 0.00100; sents:      64; bsz:  660/ 692/32; 15895/16665 tok/s;      1 sec;
[2026-11-22 15:50:48,122 INFO] Step  8/   20; acc: 1.5; ppl:  55.9; xent: 4.0; \
lr: 0.00100; sents:      64; bsz:  480/ 512/32; 33762/36013 tok/s;      1 sec;
[2026-11-22 15:50:48,155 INFO] Step 10/   20; acc: 1.5; ppl:  56.2; xent: 4.0; \
lr: 0.00100; sents:      64; bsz:  598/ 630/32; 36355/38302 tok/s;      1 sec;
[2026-11-22 15:50:48,160 INFO] valid stats calculation
                           took: 0.00488734245300293 s.
[2026-11-22 15:50:48,187 INFO] The translation of the valid dataset for dynamic scoring
                               took : 0.026815414428710938 s.
[2026-11-22 15:50:48,187 INFO] UPDATING VALIDATION BLEU
[2026-11-22 15:50:48,190 INFO] validation BLEU: 0.15701994769958616
[2026-11-22 15:50:48,190 INFO] Train perplexity: 56.0904
[2026-11-22 15:50:48,190 INFO] Train accuracy: 1.67727
[2026-11-22 15:50:48,190 INFO] Sentences processed: 306
[2026-11-22 15:50:48,190 INFO] Average bsz:  488/ 519/31
[2026-11-22 15:50:48,190 INFO] Validation perplexity: 55.9085
[2026-11-22 15:50:48,190 INFO] Validation accuracy: 2.36486
[2026-11-22 15:50:48,218 INFO] Step 12/   20; acc: 1.8; ppl:  56.0; xent: 4.0; \
lr: 0.00100; sents:      64; bsz:  476/ 508/32; 15128/16144 tok/s;      1 sec;
[2026-11-22 15:50:49,298 INFO] Step 14/   20; acc: 1.8; ppl:  55.8; xent: 4.0; \
lr: 0.00100; sents:      64; bsz:  250/ 282/32; 463/522 tok/s;      2 sec;
[2026-11-22 15:50:49,321 INFO] valid stats calculation
                           took: 0.005187273025512695 s.
[2026-11-22 15:50:49,352 INFO] The translation of the valid dataset for dynamic scoring
                               took : 0.03076171875 s.
[2026-11-22 15:50:49,352 INFO] UPDATING VALIDATION BLEU
[2026-11-22 15:50:49,354 INFO] validation BLEU: 0.15701994769958616
[2026-11-22 15:50:49,354 INFO] Train perplexity: 56.0343
[2026-11-22 15:50:49,355 INFO] Train accuracy: 1.65837
[2026-11-22 15:50:49,355 INFO] Sentences processed: 452
[2026-11-22 15:50:49,355 INFO] Average bsz:  452/ 482/30
[2026-11-22 15:50:49,355 INFO] Validation perplexity: 55.637
[2026-11-22 15:50:49,355 INFO] Validation accuracy: 2.7027
[2026-11-22 15:50:49,368 INFO] Step 16/   20; acc: 1.4; ppl:  55.6; xent: 4.0; \
lr: 0.00100; sents:      50; bsz:  456/ 481/25; 12964/13675 tok/s;      2 sec;
[2026-11-22 15:50:49,400 INFO] Step 18/   20; acc: 4.1; ppl:  55.4; xent: 4.0; \
lr: 0.00100; sents:      64; bsz:  572/ 604/32; 37080/39153 tok/s;      3 sec;
[2026-11-22 15:50:49,424 INFO] Step 20/   20; acc: 7.4; ppl:  55.3; xent: 4.0; \
lr: 0.00100; sents:      64; bsz:  405/ 437/32; 32745/35333 tok/s;      3 sec;
[2026-11-22 15:50:49,429 INFO] valid stats calculation
                           took: 0.004663228988647461 s.
[2026-11-22 15:50:49,438 INFO] The translation of the valid dataset for dynamic scoring
                               took : 0.008523225784301758 s.
[2026-11-22 15:50:49,438 INFO] UPDATING VALIDATION BLEU
[2026-11-22 15:50:49,440 INFO] validation BLEU: 0.0
[2026-11-22 15:50:49,440 INFO] Train perplexity: 55.8704
[2026-11-22 15:50:49,440 INFO] Train accuracy: 2.46612
[2026-11-22 15:50:49,440 INFO] Sentences processed: 612
[2026-11-22 15:50:49,440 INFO] Average bsz:  460/ 491/31
[2026-11-22 15:50:49,440 INFO] Validation perplexity: 55.2631
[2026-11-22 15:50:49,440 INFO] Validation accuracy: 6.75676
[2026-11-22 15:50:49,440 INFO] Saving checkpoint /tmp/onmtcap/opennmt/model_step_20.pt
"""


def clock(hms: str) -> float:
    """Seconds since midnight of a log time HH:MM:SS,mmm (the captured run is in one day)."""
    hours, minutes, seconds = hms.split(":")
    return 3600 * int(hours) + 60 * int(minutes) + float(seconds.replace(",", "."))


def test_opennmt_log_leaves_validation_out_of_training_time() -> None:
    loop_start = clock("15:50:46,883")
    # Each validation: from its dev loss line less the seconds it logs, to the last line of its
    # report ("Validation accuracy"); its BLEU. The first three lie between two report lines.
    spans = [
        (clock("15:50:48,037") - 0.005224943161010742, clock("15:50:48,076"), 0.15332277009202125),
        (clock("15:50:48,160") - 0.00488734245300293, clock("15:50:48,190"), 0.15701994769958616),
        (clock("15:50:49,321") - 0.005187273025512695, clock("15:50:49,355"), 0.15701994769958616),
        (clock("15:50:49,429") - 0.004663228988647461, clock("15:50:49,440"), 0.0),
    ]  # fmt: skip
    durations = [end - start for start, end, _ in spans]
    parsed = parse_opennmt_log(ONMT_VALID_LOG, warmup_batches=4)

    expected = [
        (start - loop_start - sum(durations[:index]), bleu)
        for index, (start, _, bleu) in enumerate(spans)
    ]
    assert len(parsed["validations"]) == len(expected)
    for (seconds, bleu), (expected_seconds, expected_bleu) in zip(
        parsed["validations"], expected, strict=True
    ):
        assert seconds == pytest.approx(expected_seconds, abs=1e-6)
        assert bleu == expected_bleu  # sacrebleu's 0-100 scale, as OpenNMT-py logs it
    # Each validation is taken from the report window it was logged in.
    by_step = {window["step"]: window["validation_s"] for window in parsed["windows"]}
    assert by_step[6] == pytest.approx(durations[0], abs=1e-6)  # after the report at step 4
    assert by_step[12] == pytest.approx(durations[1], abs=1e-6)  # after the report at step 10
    assert by_step[16] == pytest.approx(durations[2], abs=1e-6)
    # The 4th comes after the last report line, in no window.
    assert sum(by_step.values()) == pytest.approx(sum(durations[:3]), abs=1e-6)

    # Steady state: steps 5-20 (the windows after step 4), without the three validations.
    seconds = clock("15:50:49,424") - clock("15:50:48,010") - sum(durations[:3])
    tokens = 2 * (692 + 512 + 630 + 508 + 282 + 481 + 604 + 437)
    assert parsed["train_tgt_tok_per_s"] == pytest.approx(tokens / seconds)
    assert parsed["train_sent_per_s"] == pytest.approx((64 * 7 + 50) / seconds)
    assert parsed["train_seconds"] == pytest.approx(
        clock("15:50:49,424") - loop_start - sum(durations[:3])
    )

    # The first validation at or above the target counts, plus the start-up.
    startup = 2.5
    assert time_to_bleu(startup, parsed["validations"], 0.155) == pytest.approx(
        startup + expected[1][0]
    )
    assert time_to_bleu(startup, parsed["validations"], 0.0) == pytest.approx(
        startup + expected[0][0]
    )
    assert time_to_bleu(startup, parsed["validations"], 95.0) is None
    assert time_to_bleu(None, parsed["validations"], 0.0) is None


@pytest.mark.parametrize(
    ("sentences", "interval", "every", "logging"),
    [(1000, 0.25, 4, 4), (20000, 0.25, 78, 26), (130, 0.1, 1, 1), (130, 1.0, 3, 3)],
)
def test_both_peers_validate_at_our_cadence(
    tmp_path: Path, sentences: int, interval: float, every: int, logging: int
) -> None:
    # Ours validates every int(batches per epoch * interval) batches, batches of 64 sentences.
    config = compose_config(reverse_task(tmp_path, sentences), tmp_path / "run")
    joey = joey_config(config, tmp_path / "work", interval)
    onmt = opennmt_config(config, tmp_path / "work", interval)
    assert joey["training"]["validation_freq"] == onmt["valid_steps"] == every
    # Joey refuses a logging_freq that does not divide validation_freq; near 25 where it can.
    assert joey["training"]["logging_freq"] == logging
    assert joey["testing"]["eval_metrics"] == ["bleu"]
    assert joey["testing"]["sacrebleu_cfg"] == {"tokenize": "none"}
    assert onmt["valid_metrics"] == ["BLEU"]


def test_joey_accepts_the_config_and_validates_greedily(tmp_path: Path) -> None:
    if not joeynmt_available():
        pytest.skip("Joey NMT is not installed")
    from joeynmt.config import parse_global_args, set_validation_args

    config = compose_config(reverse_task(tmp_path, 1000), tmp_path / "run")
    joey = joey_config(config, tmp_path / "work", 0.25)
    joey["testing"]["beam_size"] = 5  # validation is greedy whatever testing says
    args = parse_global_args(joey, rank=0, mode="train")
    assert (args.train.validation_freq, args.train.logging_freq) == (4, 4)
    validation = set_validation_args(args.test)
    assert (validation.beam_size, validation.n_best) == (1, 1)
    assert validation.eval_metrics == ["bleu"]


@pytest.mark.slow
def test_joey_times_its_validations_out_of_its_training(tmp_path: Path) -> None:
    if not joeynmt_available():
        pytest.skip("Joey NMT is not installed")
    overrides = [
        *reverse_task(tmp_path, train_sentences=256), "model.hidden_size=16",
        "model.embedding_size=8", "model.encoder_hidden_size=8", "trainer.max_epochs=2",
    ]  # fmt: skip
    joey = joey_config(compose_config(overrides, tmp_path / "run"), tmp_path / "work", 0.5)
    result = in_fresh_process(_joey_job, joey, 1, 0.0, 1, time.time())
    # 4 updates an epoch, validation every 2: 4 validations in 2 epochs.
    seconds = [seconds for seconds, _ in result["validations"]]
    assert len(seconds) == 4
    assert 0 < seconds[0] < seconds[1] < seconds[2] < seconds[3] <= result["train_seconds"]
    assert all(0 <= bleu <= 100 for _, bleu in result["validations"])
    # Every BLEU reaches a target of 0: the first validation is the one.
    assert result["time_to_bleu95_s"] == pytest.approx(result["startup_s"] + seconds[0])
    assert result["train_tgt_tok_per_s"] > 0


@pytest.mark.slow
def test_quick_benchmark_runs_opennmt_side_by_side(tmp_path: Path) -> None:
    if not opennmt_available(opennmt_python()):
        pytest.skip("OpenNMT-py is not installed (set SEQ2SEQ_OPENNMT_PYTHON to its python)")
    overrides = reverse_task(tmp_path, train_sentences=256)
    report_path = tmp_path / "bench.json"
    completed = run_script(
        "--json", str(report_path), "--quick", "--peer", "opennmt", "--",
        *overrides, "model.decoder=luong", "attention=dot", "trainer.max_epochs=1", "threads=1",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(report_path.read_text())
    (peer,) = report["peers"]
    assert (peer["name"], peer["attention"]) == ("opennmt", "dot")
    for key in ("train_tgt_tok_per_s", "startup_s", "peak_rss_mb", "greedy_sent_per_s"):
        assert peer[key] > 0, key
    assert peer["dev_bleu"] is not None
    (run,) = peer["runs"]
    assert len(run["validations"]) == 1  # --quick validates once an epoch
    assert "time_to_bleu95_s" in peer  # None: a tiny run never reaches BLEU 95
    assert "| OpenNMT-py (dot) |" in completed.stdout


def test_the_benchmark_runs_on_a_gpu_only_when_the_config_asks_for_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def device(*overrides: str) -> str:
        return benchmark_device(compose_config([*TINY, *overrides], tmp_path / "run"))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # Lightning's "auto" would take a GPU that happens to be there; the peers run on the CPU.
    assert device() == "cpu"
    assert device("trainer=gpu") == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"trainer\.accelerator=gpu asks for a GPU"):
        device("trainer=gpu")


def test_peers_are_not_compared_with_a_run_on_a_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    config = compose_config([*TINY, "trainer=gpu"], tmp_path / "run")
    assert chosen_peers(BenchmarkOptions(peer="auto"), config) == []
    with pytest.raises(ConfigError, match="would compare hardware"):
        chosen_peers(BenchmarkOptions(peer="joeynmt"), config)


def test_the_table_names_the_gpu_and_its_memory_only_for_a_gpu_run() -> None:
    run = {"train_tgt_tok_per_s": 1000.0, "peak_rss_mb": 500.0, "peak_gpu_mb": 120.0}
    report = {
        "ours_runs": [run],
        "model": {"decoder": "seq2seq.models.LuongDecoder", "attention": "x.Dot"},
        "bleu_target": 95.0,
        "machine": {"cpu": "some CPU", "gpu": "Some GPU"},
    }
    on_gpu = markdown_table(report, {})
    assert "| peak GPU memory MB (training) | 120 |" in on_gpu
    assert "seq2seq (LuongDecoder, Dot, Some GPU)" in on_gpu
    cpu_run = {key: value for key, value in run.items() if key != "peak_gpu_mb"}
    on_cpu = markdown_table({**report, "ours_runs": [cpu_run], "machine": {"cpu": "c"}}, {})
    assert "GPU" not in on_cpu


@pytest.mark.skipif(not joeynmt_available(), reason="needs joeynmt==2.3.0")
def test_joey_keeps_its_messages_and_progress_bars_off_the_console() -> None:
    in_fresh_process(_quiet_joey_and_check)  # fresh: joeynmt's loggers as its job finds them


def _quiet_joey_and_check() -> dict[str, object]:
    import logging

    import joeynmt.data
    import joeynmt.prediction

    _quiet_joey()
    handlers = [
        handler
        for handler in logging.getLogger("joeynmt.data").handlers
        if type(handler) is logging.StreamHandler
    ]
    assert handlers and all(handler.level == logging.WARNING for handler in handlers)
    with joeynmt.prediction.tqdm(total=3, disable=False, desc="Predicting...") as bar:
        assert bar.disable
    return {}


def scripts_using_benchmarks() -> list[Path]:
    """The scripts that import the benchmark harness, which is not installed with the package."""
    return sorted(
        path
        for path in (ROOT / "scripts").glob("*.py")
        if "from benchmarks" in path.read_text(encoding="utf-8")
    )


@pytest.mark.parametrize(
    "script",
    [
        # The default suite starts those that broke; the slow set starts every one.
        pytest.param(path, marks=[] if path in scripts_using_benchmarks() else [pytest.mark.slow])
        for path in sorted((ROOT / "scripts").glob("*.py"))
    ],
    ids=lambda path: path.name,
)
def test_every_script_starts_from_any_directory(script: Path, tmp_path: Path) -> None:
    """python /path/to/scripts/X.py --help from elsewhere, without PYTHONPATH: every documented
    script starts (those using the harness find benchmarks/ beside themselves; two used to stop
    with ModuleNotFoundError: benchmarks)."""
    assert scripts_using_benchmarks()  # the case that broke is still among them
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    completed = subprocess.run(
        [sys.executable, str(script), "--help"], cwd=tmp_path, capture_output=True, text=True,
        timeout=120, env=environment,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.startswith("usage:")
