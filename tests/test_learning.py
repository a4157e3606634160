"""Training learns to translate: each decoder and the Transformer learn the copy task in seconds.

The other pipeline tests check that a run works (finite losses, files, metrics in range); these
check that it learns. Copying needs attention (each target word is the source word at the same
position, 5 to 25 words from a vocabulary of 50), so a model whose attention or training is
broken stays near the unigram loss, ln 50 ≈ 3.9, and near 0 BLEU. The floors are far below what
the runs reach and far above what a broken one does (docs/testing.md has both).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from seq2seq.attention import DotProductAttention
from seq2seq.pipeline import train
from tests.configs import compose_config

COPY = [
    "data=copy",
    "data.train_size=1000",
    "data.val_size=100",
    "data.test_size=10",
    "data.batch_size=32",
    "logger=csv",
    "test_after_training=false",
    "examples.num_maps=0",
    "checkpoint.every_n_steps=null",
    "trainer.enable_progress_bar=false",
    "threads=2",
]
RNN = ["model.hidden_size=64", "model.embedding_size=32", "optim.optimizer.lr=0.01"]
RNN_EPOCHS = ["trainer.max_epochs=8", "+trainer.check_val_every_n_epoch=2"]
MODELS = {
    # 32 updates an epoch: 256 in all, 4 validations.
    "bahdanau": [*RNN, *RNN_EPOCHS, "model.decoder=bahdanau", "attention=additive"],
    "luong": [*RNN, *RNN_EPOCHS, "model.decoder=luong", "attention=dot"],
    # 640 updates, 4 validations. Pre-norm at a constant rate: the paper's warm-up schedule and
    # post-norm need several times as many updates to leave the unigram plateau.
    "transformer": [
        "model=transformer", "model.d_model=64", "model.num_heads=4", "model.d_ff=128",
        "model.encoder_layers=1", "model.decoder_layers=1", "model.norm_first=true",
        "model.dropout=0.0", "optim.label_smoothing=0.0", "optim.scheduler=null",
        "optim.optimizer.lr=0.002", "trainer.max_epochs=20", "+trainer.check_val_every_n_epoch=5",
    ],
}  # fmt: skip
BLEU_FLOOR = 50.0


def validations(run_dir: Path) -> list[tuple[float, float]]:
    """(val/loss, val/bleu) at every validation of the run."""
    with open(run_dir / "metrics.csv", newline="") as file:
        rows = [row for row in csv.DictReader(file) if row.get("val/bleu")]
    return [(float(row["val/loss"]), float(row["val/bleu"])) for row in rows]


@pytest.mark.parametrize("model", MODELS)
def test_the_model_learns_to_copy(tmp_path: Path, model: str) -> None:
    train(compose_config([*COPY, *MODELS[model], f"run_dir={tmp_path}"]))
    curve = validations(tmp_path)
    (first_loss, _), (last_loss, last_bleu) = curve[0], curve[-1]
    assert last_loss < first_loss / 2, curve
    assert last_bleu >= BLEU_FLOOR, curve


class Indifferent(DotProductAttention):
    """Dot-product attention with every score zero: uniform weights, and a context that is the
    mean of the source, the same at every step."""

    def score(self, queries: torch.Tensor, projected_keys: torch.Tensor) -> torch.Tensor:
        # (B, Tq, D), (B, Tk, D) -> (B, Tq, Tk), all zero.
        return queries.new_zeros(*queries.shape[:-1], projected_keys.shape[-2])


def test_a_decoder_that_cannot_attend_fails_the_floor(tmp_path: Path) -> None:
    """The floor tells a model that attends from one that does not."""
    indifferent = f"attention._target_={Indifferent.__module__}.Indifferent"
    train(compose_config([*COPY, *MODELS["luong"], indifferent, f"run_dir={tmp_path}"]))
    curve = validations(tmp_path)
    assert curve[-1][1] < BLEU_FLOOR / 2, curve


def train_losses(run_dir: Path) -> list[float]:
    with open(run_dir / "metrics.csv", newline="") as file:
        return [float(row["train/loss"]) for row in csv.DictReader(file) if row.get("train/loss")]


@pytest.mark.parametrize("model", MODELS)
def test_bf16_training_follows_float32(tmp_path: Path, model: str) -> None:
    """CPU bf16 autocast against float32 from the same start, one epoch (32 updates) logged step
    by step: every training loss within 5 %, the validation loss within 2 %. bf16 keeps 8 bits
    of mantissa, and two runs drift apart once the loss falls fast (so not more updates); a step
    in the wrong precision or a cast that drops a gradient moves them further (docs/testing.md
    has the measured gaps)."""
    runs = {}
    for precision in ["32-true", "bf16-mixed"]:
        run_dir = tmp_path / precision
        overrides = [*COPY, *MODELS[model], "trainer.max_epochs=1", "trainer.log_every_n_steps=1"]
        overrides += ["~trainer.check_val_every_n_epoch", f"trainer.precision={precision}"]
        train(compose_config([*overrides, f"run_dir={run_dir}"]))
        runs[precision] = (train_losses(run_dir), validations(run_dir)[-1][0])
    (fp32_losses, fp32_val), (bf16_losses, bf16_val) = runs["32-true"], runs["bf16-mixed"]
    assert len(fp32_losses) == len(bf16_losses) == 32
    assert bf16_losses == pytest.approx(fp32_losses, rel=0.05)
    assert bf16_val == pytest.approx(fp32_val, rel=0.02)
