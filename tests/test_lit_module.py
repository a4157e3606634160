"""seq2seq.training.lit_module: the CPU gradient clipping against clip_grad_norm_, and
the training loop's batch transfer and train/loss logging against what they replace."""

from __future__ import annotations

import csv
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger

from seq2seq.data.batching import Batch
from seq2seq.pipeline import build_model_config, build_module
from seq2seq.training.lit_module import THROUGHPUT_KEY, clip_grad_norm_on_cpu
from tests.configs import epoch_target_tokens
from tests.test_pipeline import compose_config


def gradients(scale: float) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shapes = [(7, 3), (5,), (2, 2, 4)]
    return [torch.randn(shape, generator=generator) * scale for shape in shapes]


@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0])  # below, around and above the limit
def test_clipping_is_torchs(scale: float) -> None:
    ours, theirs = gradients(scale), gradients(scale)
    parameters = [torch.nn.Parameter(torch.zeros_like(grad)) for grad in theirs]
    for parameter, grad in zip(parameters, theirs, strict=True):
        parameter.grad = grad
    expected_norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm=2.0)
    norm = clip_grad_norm_on_cpu(ours, 2.0)
    torch.testing.assert_close(norm, expected_norm)
    for got, parameter in zip(ours, parameters, strict=True):
        torch.testing.assert_close(got, parameter.grad)
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in ours]))
    assert total <= 2.0 + 1e-5


def test_gradients_under_the_limit_are_left_alone() -> None:
    grads = gradients(0.01)
    before = [grad.clone() for grad in grads]
    clip_grad_norm_on_cpu(grads, 5.0)
    for got, want in zip(grads, before, strict=True):
        assert torch.equal(got, want)


def test_batch_to_moves_every_tensor_and_keeps_the_texts() -> None:
    batch = Batch(
        src=torch.ones(2, 3, dtype=torch.long), src_lens=torch.tensor([3, 2]),
        tgt_in=torch.ones(2, 4, dtype=torch.long), tgt_out=torch.ones(2, 4, dtype=torch.long),
        tgt_lens=torch.tensor([4, 2]), indices=torch.tensor([1, 0]),
        src_text=["a b c", "d e"], tgt_text=["c b a", "e d"],
    )  # fmt: skip
    moved = batch.to(torch.device("meta"))
    tensors = [field.name for field in fields(Batch) if field.type == "Tensor"]
    assert len(tensors) == 6  # every tensor field, found by its annotation
    for name in tensors:
        tensor = getattr(moved, name)
        assert tensor.device.type == "meta" and tensor.shape == getattr(batch, name).shape, name
    assert moved.src_text is batch.src_text and moved.tgt_text is batch.tgt_text
    assert batch.src.device.type == "cpu"  # a new batch; the old one is unchanged


class RecordSteps(pl.Callback):
    """Each training step's summed loss and target tokens, from what training_step returned."""

    def __init__(self) -> None:
        self.steps: list[tuple[float, int]] = []

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        tokens = int(batch.tgt_lens.sum())
        self.steps.append((float(outputs["loss"]) * tokens, tokens))


def test_train_loss_is_logged_where_it_is_written_and_at_the_last_batch(tmp_path: Path) -> None:
    """Every third step is written (log_every_n_steps=3), each with that step's token-mean loss,
    as logging every step wrote; the final metrics hold the last batch's."""
    config = compose_config(
        tmp_path, ["data.train_size=300", "data.batch_size=32", "optim.scheduler=null"]
    )
    pl.seed_everything(0, verbose=False)
    datamodule = instantiate(config.data.module)
    datamodule.setup("fit")
    model_config = build_model_config(
        config, datamodule.src_tokenizer.get_vocab_size(), datamodule.tgt_tokenizer.get_vocab_size()
    )
    module = build_module(config, datamodule, model_config)
    moved: list[Batch] = []
    transfer = datamodule.transfer_batch_to_device

    def recorded_transfer(batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        moved.append(batch)
        return transfer(batch, device, dataloader_idx)

    datamodule.transfer_batch_to_device = recorded_transfer
    record = RecordSteps()
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=1, log_every_n_steps=3, limit_val_batches=0,
        logger=CSVLogger(tmp_path, name="", version=""), enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[record],
        use_distributed_sampler=False,
    )  # fmt: skip
    trainer.fit(module, datamodule=datamodule)
    steps = record.steps
    assert len(steps) == 10  # 300 sentences in batches of 32
    assert len(moved) == 10 and all(isinstance(batch, Batch) for batch in moved)  # our hook ran

    with open(tmp_path / "metrics.csv", newline="") as file:
        written = {int(row["step"]): float(row["train/loss"]) for row in csv.DictReader(file)}
    assert sorted(written) == [2, 5, 8]
    for step, value in written.items():
        assert value == pytest.approx(steps[step][0] / steps[step][1], rel=1e-6), step
    last_loss, last_tokens = steps[-1]
    assert float(trainer.callback_metrics["train/loss"]) == pytest.approx(last_loss / last_tokens)


def test_training_totals_count_every_epoch_and_survive_testing_an_older_checkpoint(
    tmp_path: Path,
) -> None:
    """No validation, so only the end of training adds up the tokens; testing the first epoch's
    checkpoint afterwards must not put back that checkpoint's (smaller) totals."""
    config = compose_config(
        tmp_path, ["data.train_size=100", "data.batch_size=32", "optim.scheduler=null"]
    )
    datamodule = instantiate(config.data.module)
    datamodule.setup("fit")
    model_config = build_model_config(
        config, datamodule.src_tokenizer.get_vocab_size(), datamodule.tgt_tokenizer.get_vocab_size()
    )
    module = build_module(config, datamodule, model_config)
    epoch = epoch_target_tokens(config)
    # default_root_dir: testing writes its records (test_hypotheses.txt, ...) there, not in the
    # working directory (the checkout, which once committed them).
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=2, limit_val_batches=0, logger=False,
        default_root_dir=tmp_path,
        callbacks=[ModelCheckpoint(dirpath=tmp_path, filename="{epoch}", save_top_k=-1)],
        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
    )  # fmt: skip
    trainer.fit(module, datamodule=datamodule)
    assert module.total_train_tokens == 2 * epoch and module.total_train_seconds > 0
    first = torch.load(tmp_path / "epoch=0.ckpt", weights_only=True)[THROUGHPUT_KEY]
    assert first["target_tokens"] == epoch

    trainer.test(module, datamodule=datamodule, ckpt_path=tmp_path / "epoch=0.ckpt")
    assert module.total_train_tokens == 2 * epoch
