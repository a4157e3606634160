"""Crash-safe training: atomic checkpoints, ``last.ckpt`` every N steps, clean stops on SIGINT and
SIGTERM, a guard against non-finite losses, and the state a resumed run needs to continue exactly
where the checkpoint left off (RNG streams, the plateau schedule).

Every checkpoint is written between two training steps, at a point Lightning knows how to resume
from mid-epoch; the data loader's position in the epoch travels with it
(``seq2seq.data.batching.ResumableDataLoader``).
"""

from __future__ import annotations

import io
import logging
import math
import random
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from lightning_fabric.plugins import TorchCheckpointIO
from pytorch_lightning.callbacks import ModelCheckpoint
from torch import Tensor

from seq2seq.atomic import write_atomic
from seq2seq.data.batching import ResumableDataLoader
from seq2seq.errors import ConfigError, Seq2SeqError

log = logging.getLogger(__name__)

LAST = "last.ckpt"


class CheckpointWriteError(Seq2SeqError):
    """A checkpoint could not be written (full disk, no permission); the previous one is intact."""


class NonFiniteLossError(Seq2SeqError):
    """The loss or the gradients became NaN or infinite; training stopped before the update."""


class TrainingInterruptedError(Seq2SeqError):
    """SIGINT or SIGTERM stopped training; ``exit_status`` is the shell's 128 + signal number."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_status = 128 + signum


def run_dir_of_checkpoint(ckpt_path: str | Path) -> Path | None:
    """``RUN/checkpoints/last.ckpt`` -> ``RUN``; None for a file outside a ``checkpoints/`` dir."""
    path = Path(ckpt_path)
    return path.parent.parent if path.parent.name == "checkpoints" else None


def checkpoint_step(path: Path) -> int | None:
    """The global step a checkpoint was written at, or None if it cannot be read."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return int(checkpoint["global_step"])
    except Exception:  # any unreadable file: the caller only wants it for a message
        return None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes every checkpoint atomically and never writes a model holding NaN or Inf.

    The checkpoint is serialized in memory, then written to a temporary file beside the target,
    fsynced and renamed over it (``seq2seq.atomic.write_atomic``): a SIGKILL or a full disk at any
    moment leaves the previous file whole. Serializing first also makes a full disk an ``OSError``
    with its errno, rather than torch's opaque zip-writer error.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options.")
        path = Path(path)
        check_finite(checkpoint.get("state_dict", {}), path)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        data = buffer.getbuffer()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, lambda temporary: temporary.write_bytes(data))
        except OSError as error:
            previous = (
                f"The previous {path.name} is intact."
                if path.exists()
                else f"No earlier {path.name} was lost."
            )
            raise CheckpointWriteError(
                f"cannot write the checkpoint {path} ({error.strerror or error}); training stopped "
                f"at step {checkpoint.get('global_step', '?')}. {previous} The checkpoint needs "
                f"{len(data) / 1e6:.1f} MB, and as much again while it replaces the old one: free "
                f"space in {path.parent} (or make it writable), then resume from "
                f"{path.parent / LAST}."
            ) from None


def check_finite(state_dict: dict[str, Tensor], path: Path) -> None:
    """Refuse to save weights with NaN or Inf: such a file must never replace a good one."""
    for name, tensor in state_dict.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise NonFiniteLossError(
                f"refusing to write {path}: the weight {name} holds NaN or Inf values. The file "
                "on disk keeps the last finite model; resume from it with a lower "
                "optim.optimizer.lr, or set trainer.skip_nonfinite=true."
            )


def save_last(trainer: pl.Trainer, directory: Path) -> Path:
    """Flush the loggers, then write ``directory/last.ckpt``.

    Loggers first: a crash between the two then leaves rows the resumed run replaces, never a gap.
    """
    for logger in trainer.loggers:
        logger.save()
    path = directory / LAST
    trainer.save_checkpoint(path, weights_only=False)
    return path


def last_checkpoint_every_epoch(directory: Path) -> ModelCheckpoint:
    """Writes ``last.ckpt`` at the end of every epoch (after validation, so it holds the updated
    best-score state when it comes after the best-checkpoint callback).

    ``ModelCheckpoint(save_last=True)`` is not enough: as of Lightning 2.6 it rewrites
    ``last.ckpt`` only in epochs where it also saved a top-k checkpoint, i.e. where val/bleu
    improved. With no monitor and top-1, this one's "best" is simply the latest.
    """
    return ModelCheckpoint(
        dirpath=directory,
        filename=LAST.removesuffix(".ckpt"),
        monitor=None,
        save_top_k=1,
        every_n_epochs=1,
        auto_insert_metric_name=False,
        enable_version_counter=False,
    )


class PeriodicCheckpoint(pl.Callback):
    """Writes ``last.ckpt`` every ``every_n_steps`` optimizer steps (None: never mid-epoch).

    The write waits until the training loader is asked for the next batch. Lightning logs a step's
    metrics row after the callbacks' ``on_train_batch_end``: a checkpoint written there (where
    Lightning's own go) precedes the row, and a SIGKILL between the two loses that row for good,
    since the resumed run starts after the step. When the next batch is asked for, the row is
    logged and flushed, and the loop's and the loader's state is that of a finished step, which
    Lightning resumes from as from an end-of-epoch checkpoint. A step due at the end of an epoch
    is left to that epoch's own ``last.ckpt``.
    """

    def __init__(self, directory: Path, every_n_steps: int | None) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ConfigError(
                f"checkpoint.every_n_steps must be a positive integer or null, got {every_n_steps}."
            )
        self.directory = directory
        self.every_n_steps = every_n_steps
        self._due = False

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._due = False
        if self.every_n_steps is None:
            return
        loader = trainer.train_dataloader
        if not isinstance(loader, ResumableDataLoader):
            raise TypeError(f"{type(self).__name__} needs a ResumableDataLoader, got {loader!r}.")
        # Every epoch: data.max_tokens makes Lightning build a new loader for each epoch.
        loader.before_each_batch = partial(self._save_if_due, trainer)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        if self.every_n_steps and trainer.global_step % self.every_n_steps == 0:
            self._due = True

    def _save_if_due(self, trainer: pl.Trainer) -> None:
        if self._due:
            self._due = False
            save_last(trainer, self.directory)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._due = False

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if isinstance(loader := trainer.train_dataloader, ResumableDataLoader):
            loader.before_each_batch = None  # the loader outlives this fit


class SignalFlag:
    """SIGINT/SIGTERM handlers that only record the signal, so training can stop at a step boundary.

    Before training starts (``armed`` false) there is nothing to save, and a signal stops at once.
    A second signal also stops at once: whoever sends it does not want to wait.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.armed = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.armed and self.signum is None:
            self.signum = signum
            log.warning(
                "received %s: stopping after this training step and saving last.ckpt "
                "(send it again to stop at once)",
                signal.Signals(signum).name,
            )
            return
        raise TrainingInterruptedError(
            f"stopped by {signal.Signals(signum).name} outside the training steps (nothing to save "
            "at that point; any checkpoint written before is intact).",
            signum,
        )

    @contextmanager
    def installed(self) -> Iterator[SignalFlag]:
        """Handle SIGINT and SIGTERM inside the block; the previous handlers come back after it."""
        previous = {number: signal.signal(number, self.handle) for number in STOP_SIGNALS}
        try:
            yield self
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopOnSignal(pl.Callback):
    """After SIGINT/SIGTERM: finish the step, save ``last.ckpt``, stop with how to resume.

    The stop is decided on every rank together, so DDP ranks stop at the same step.
    """

    def __init__(self, flag: SignalFlag, directory: Path, resume_command: str) -> None:
        self.flag = flag
        self.directory = directory
        self.resume_command = resume_command

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.flag.armed = True
        # Lightning's own SIGTERM handler (installed when fit starts, after ours) makes the loop
        # raise SystemExit(0) at the next step boundary: the run would end "successfully" without
        # saving. Only ours may handle it; Lightning puts its predecessor back at teardown.
        signal.signal(signal.SIGTERM, self.flag.handle)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        received = self.flag.signum is not None
        if not trainer.strategy.reduce_boolean_decision(received, all=False):
            return
        path = save_last(trainer, self.directory)
        signum = self.flag.signum or signal.SIGTERM  # another rank got it
        raise TrainingInterruptedError(
            f"stopped by {signal.Signals(signum).name} at step {trainer.global_step} (epoch "
            f"{trainer.current_epoch}); saved {path}. Resume with: "
            f"{self.resume_command.replace('{ckpt_path}', str(path))}",
            signum,
        )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.flag.armed = False


class ValidateAtMaxSteps(pl.Callback):
    """Validates, and so checkpoints, a run that ``trainer.max_steps`` ends in mid-epoch.

    Lightning validates at an epoch's end, or when something asks the run to stop (the Timer of
    ``trainer.max_time``, early stopping); at ``max_steps`` it just stops, so the updates since
    the last epoch's end would never be scored and ``best.ckpt`` could never hold them. Asking to
    stop at that step makes Lightning validate there, as it does when ``max_time`` runs out.
    """

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        # max_steps is -1 when unset; every DDP rank is at the same step, so all stop together.
        if 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True


class NonFiniteGuard(pl.Callback):
    """Stops training (or skips the batch, with ``skip``) when the loss or a gradient is NaN/Inf.

    The check runs after the backward pass and before the optimizer step, so a bad batch never
    reaches the weights: every checkpoint, ``best.ckpt`` included, holds a finite model. A skipped
    batch still counts as a step (the step numbering stays that of a clean run); its gradients are
    dropped, so Adam leaves every weight and moment untouched. ``train/skipped_nonfinite`` counts
    the skipped batches of the run.
    """

    def __init__(self, skip: bool, directory: Path, resume_command: str) -> None:
        self.skip = skip
        self.directory = directory
        self.resume_command = resume_command
        self.skipped = 0
        self._loss: Tensor | None = None
        self._batch_idx = 0

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch_idx = batch_idx

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor
    ) -> None:
        self._loss = loss.detach()

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        finite = torch.tensor(True)
        if grads:
            finite = torch.isfinite(torch.nn.utils.get_total_norm(grads))
        loss = self._loss
        if loss is not None:
            finite = finite & torch.isfinite(loss).to(finite.device)
        bad = trainer.strategy.reduce_boolean_decision(not bool(finite), all=False)
        if not bad:
            return
        loss_value = float(loss) if loss is not None else math.nan
        if math.isfinite(loss_value):
            what = f"the gradients are not finite (the loss is {loss_value:g})"
        else:
            what = f"the loss is {loss_value:g}"
        if self.skip:
            optimizer.zero_grad(set_to_none=True)  # no gradient: the optimizer skips every weight
            self.skipped += 1
            log.warning(
                "step %d (epoch %d, batch %d): %s; batch skipped (%d so far)",
                trainer.global_step,
                trainer.current_epoch,
                self._batch_idx,
                what,
                self.skipped,
            )
            return
        last = self.directory / LAST
        step = checkpoint_step(last) if last.is_file() else None
        if step is None:
            where = "No checkpoint was written before it; start again"
        else:
            where = (
                f"The last good checkpoint is {last} (step {step}); resume with "
                f"{self.resume_command.replace('{ckpt_path}', str(last))}"
            )
        raise NonFiniteLossError(
            f"training stopped at step {trainer.global_step} (epoch {trainer.current_epoch}, "
            f"batch {self._batch_idx}): {what}, and the update was not applied. {where} with a "
            "lower optim.optimizer.lr (or optim.grad_clip set), or add trainer.skip_nonfinite=true "
            "to skip such batches and count them."
        )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        if self.skip:
            pl_module.log("train/skipped_nonfinite", float(self.skipped), on_step=True)

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = int(state_dict.get("skipped", 0))


class ResumeState(pl.Callback):
    """What Lightning's checkpoints leave out, so a resumed run continues like an unbroken one.

    - The RNG streams (torch CPU and CUDA, Python, NumPy; dropout draws from torch's), captured
      with every checkpoint and put back just before the first resumed training step.
    - The step of ``ReduceLROnPlateau`` that closes the epoch a run resumes in: Lightning skips it
      (it keeps no metrics in checkpoints); here it is taken with the epoch's validation metric,
      or, if the checkpoint was written after that validation, with the value saved in it.
    """

    def __init__(self) -> None:
        self._pending_rng: dict[str, Any] | None = None
        self._saved_metrics: dict[str, float] = {}

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint["seq2seq_resume"] = {
            "rng": rng_state(),
            "metrics": {
                name: float(value)
                for name, value in trainer.callback_metrics.items()
                if value.numel() == 1
            },
        }

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        state = checkpoint.get("seq2seq_resume")
        if state is not None:
            self._pending_rng = state["rng"]
            self._saved_metrics = dict(state["metrics"])

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._pending_rng is not None:
            set_rng_state(self._pending_rng)
            self._pending_rng = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Resumed from a checkpoint written after an epoch's validation: that epoch's step is
        # still missing when the next epoch starts.
        self._catch_up_plateau_schedulers(trainer, epochs_done=trainer.current_epoch)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        fit_loop = trainer.fit_loop
        batches_done = fit_loop.epoch_loop.batch_progress.current.ready
        if fit_loop.restarting and batches_done >= trainer.num_training_batches:
            # Lightning skips the plateau step at the end of the epoch a run resumed in.
            self._catch_up_plateau_schedulers(trainer, epochs_done=trainer.current_epoch + 1)

    def _catch_up_plateau_schedulers(self, trainer: pl.Trainer, epochs_done: int) -> None:
        """Step each epoch-interval ``ReduceLROnPlateau`` that has taken fewer steps than an
        unbroken run would have after ``epochs_done`` epochs: one at the end of every epoch that
        validates (every ``frequency``-th)."""
        for config in trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            if not (config.reduce_on_plateau and config.interval == "epoch"):
                continue
            monitor = config.monitor or ""
            value = trainer.callback_metrics.get(monitor)
            current = float(value) if value is not None else self._saved_metrics.get(monitor)
            while current is not None and scheduler.last_epoch < epochs_done // config.frequency:
                scheduler.step(current)  # type: ignore[arg-type]  # ReduceLROnPlateau: the metric


def rng_state() -> dict[str, Any]:
    """Every RNG a training step may draw from, as tensors, numbers and lists (no pickle needed)."""
    version, mt_state, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": [version, list(mt_state), gauss],
        "numpy": [
            str(kind),
            torch.from_numpy(np.asarray(keys).astype(np.int64)),
            int(position),
            int(has_gauss),
            float(cached),
        ],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
