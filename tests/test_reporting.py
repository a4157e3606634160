"""summary.json and the logged metrics against the scripts a user checks them with.

A run reports test BLEU and AER "of the best checkpoint" in summary.json and logs val/aer at every
validation; here each is recomputed by a separate program on the checkpoint it is about
(scripts/evaluate.py for BLEU, scripts/alignment.py for AER) from the task's files, as a user
would. The model is trained well enough (the copy task, tests/test_learning.py's Luong model)
that no translation hangs on a near-tie, and both sides run on one thread in batches of 16.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from seq2seq.pipeline import train
from tests.configs import ROOT, compose_config, evaluate_script, write_toy_files
from tests.test_learning import COPY, MODELS

SIZES = {"train": 1000, "val": 100, "test": 100}


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A Luong model trained on the copy task, with its test split scored; its run directory and
    the task's files."""
    run_dir = tmp_path_factory.mktemp("run")
    overrides = [
        *COPY, *MODELS["luong"], "test_after_training=true", "threads=1",
        *(f"data.{split}_size={n}" for split, n in SIZES.items()), "data.eval_batch_size=16",
        f"run_dir={run_dir}",
    ]  # fmt: skip
    train(compose_config(overrides))
    data = write_toy_files(tmp_path_factory.mktemp("copy"), **SIZES, task="copy")
    return run_dir, data


def alignment_script(model: Path, data: Path, split: str) -> float:
    """AER of ``scripts/alignment.py --model MODEL`` on ``data/{split}.src|tgt|align``."""
    completed = subprocess.run(
        [sys.executable, "scripts/alignment.py", "--model", str(model),
         "--src", str(data / f"{split}.src"), "--tgt", str(data / f"{split}.tgt"),
         "--align", str(data / f"{split}.align"), "--batch-size", "16", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    aer: float = json.loads(completed.stdout)["aer"]
    return aer


def summary(run_dir: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return loaded


def test_summary_test_bleu_is_what_evaluate_py_gives_the_best_checkpoint(
    copy_run: tuple[Path, Path], tmp_path: Path
) -> None:
    run_dir, data = copy_run
    best = run_dir / "checkpoints" / "best.ckpt"
    bleu = evaluate_script(best, data, "test", tmp_path / "hypotheses.txt")
    reported = summary(run_dir)["test_bleu"]
    assert reported > 50  # a model that translates: a near-tie cannot decide the comparison
    assert reported == pytest.approx(bleu, abs=1e-3)


def test_summary_test_aer_is_what_alignment_py_gives_the_best_checkpoint(
    copy_run: tuple[Path, Path],
) -> None:
    run_dir, data = copy_run
    aer = alignment_script(run_dir / "checkpoints" / "best.ckpt", data, "test")
    assert summary(run_dir)["test_aer"] == pytest.approx(aer, abs=1e-6)


def test_logged_val_aer_is_what_alignment_py_gives_the_checkpoint_validated(
    copy_run: tuple[Path, Path],
) -> None:
    """last.ckpt holds the weights of the last validation (it is written after it)."""
    run_dir, data = copy_run
    with open(run_dir / "metrics.csv", newline="") as file:
        logged = [float(row["val/aer"]) for row in csv.DictReader(file) if row.get("val/aer")]
    aer = alignment_script(run_dir / "checkpoints" / "last.ckpt", data, "val")
    assert logged[-1] == pytest.approx(aer, abs=1e-6)


def test_the_test_pass_is_reported_in_one_rounded_line() -> None:
    """Lightning's test table printed every figure to 16 digits; train prints one line."""
    from seq2seq.pipeline.reporting import format_bleu, test_report

    line = test_report({"test/bleu": 97.70449829, "test/chrf": 6.15864, "test/loss": 3.93718,
                        "test/aer": 0.93900167})  # fmt: skip
    assert line == "Test (best checkpoint): BLEU 97.70, chrF 6.16, loss 3.937, AER 0.939"
    assert format_bleu(0.12442516535520554) == "0.12"
    assert "no validation" in format_bleu(None)
    # A validation ran but no checkpoint kept a best (fast_dev_run): its score, and why.
    assert format_bleu(None, 12.345) == (
        "– (no checkpoint was kept; the last validation scored 12.35)"
    )
