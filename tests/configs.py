"""The real Hydra config composed for tests, and the tiny training run many tests share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]

# 600 toy pairs in batches of 32 (19 steps an epoch), a model small enough to train in seconds.
TINY = [
    "data.train_size=600",
    "data.val_size=50",
    "data.test_size=50",
    "data.batch_size=32",
    "model.hidden_size=32",
    "model.embedding_size=16",
    "trainer.max_epochs=2",
    "trainer.enable_progress_bar=false",
]


# The smallest Transformer: one layer each side, two heads of 8.
TINY_TRANSFORMER = [
    "model=transformer",
    "model.d_model=16",
    "model.num_heads=2",
    "model.d_ff=32",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
]


# Wall-clock measurements: they differ between any two runs, however deterministic.
TIMINGS = frozenset({"train/tokens_per_s"})


def compose_config(overrides: list[str]) -> DictConfig:
    """``conf/config.yaml`` with ``overrides``, as ``python train.py OVERRIDES`` would see it."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=overrides)


def epoch_target_tokens(config: DictConfig) -> int:
    """The target tokens of one epoch of ``config``'s training data (each sentence's, and its
    EOS): what training counts in ``summary.json``'s ``train_tokens``."""
    datamodule = instantiate(config.data.module)
    datamodule.setup("fit")
    return sum(len(example.tgt_ids) + 1 for example in datamodule.datasets["train"].examples)


def write_toy_files(directory: Path, train: int, val: int, test: int, task: str = "toy") -> Path:
    """The toy task's splits as files ({split}.src, .tgt, .align), as a user writes them with
    scripts/make_toy_data.py; returns ``directory``."""
    subprocess.run(
        [sys.executable, "scripts/make_toy_data.py", "--out", str(directory), "--task", task,
         "--train-size", str(train), "--val-size", str(val), "--test-size", str(test)],
        cwd=ROOT, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return directory


def evaluate_script(model: Path, data: Path, split: str, hypotheses: Path, *extra: str) -> float:
    """BLEU of ``scripts/evaluate.py --model MODEL`` on ``data/{split}.src|tgt``, its translations
    written to ``hypotheses``. One thread, batches of 16, greedy: what the training runs of the
    tests that compare with it use, so that a near-tie argmax of a barely trained model cannot
    flip between two summation orders."""
    completed = subprocess.run(
        [sys.executable, "scripts/evaluate.py", "--model", str(model),
         "--src", str(data / f"{split}.src"), "--ref", str(data / f"{split}.tgt"),
         "--beam-size", "1", "--batch-size", "16", "--hyp-out", str(hypotheses), "--json", *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    score: float = json.loads(completed.stdout)["score"]
    return score


def script_output(*arguments: str) -> str:
    """stdout of ``python ARGUMENTS`` run from the checkout, which must succeed."""
    completed = subprocess.run(
        [sys.executable, *arguments], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout


def installed_command() -> str:
    """The ``seq2seq`` console command of this Python's installation of the package (pip
    install puts it beside the interpreter)."""
    found = Path(sys.executable).parent / "seq2seq"
    if not found.is_file():
        pytest.skip(f"no seq2seq command beside {sys.executable}: pip install -e . installs it")
    return str(found)
