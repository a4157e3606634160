"""scripts/benchmark.py: the quick mode runs every code path and writes the promised report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from seq2seq.benchmark import (
    Spread,
    attention_costs,
    compose_config,
    opennmt_available,
    opennmt_config,
    opennmt_python,
    parse_opennmt_log,
)

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
    onmt = opennmt_config(config, tmp_path / "work", report_every=20)
    assert onmt["global_attention"] == expected
    assert (onmt["encoder_type"], onmt["rnn_type"], onmt["input_feed"]) == ("brnn", "GRU", 0)
    assert onmt["enc_hid_size"] == 256  # 2 directions x our encoder_hidden_size 128
    assert (onmt["dec_hid_size"], onmt["word_vec_size"], onmt["dropout"]) == (256, 128, [0.1])
    assert (onmt["learning_rate"], onmt["max_grad_norm"], onmt["optim"]) == (0.002, 3.0, "adam")
    assert (onmt["batch_size"], onmt["batch_type"], onmt["normalization"]) == (64, "sents", "sents")
    assert onmt["train_steps"] == 3 * 3  # 3 epochs of ceil(130 / 64) batches
    assert onmt["save_checkpoint_steps"] == onmt["train_steps"] < onmt["valid_steps"]
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
    assert "| OpenNMT-py (dot) |" in completed.stdout
