"""The Lightning callbacks the config asks for: kept checkpoints, early stopping, and the
reliability set (periodic checkpoints, clean stops, the time limit, the non-finite guard, resume
state)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import pytorch_lightning as pl
from omegaconf import DictConfig
from pytorch_lightning.callbacks import (
    EarlyStopping,
    ModelCheckpoint,
    ModelSummary,
    Timer,
    TQDMProgressBar,
)
from pytorch_lightning.callbacks.progress.tqdm_progress import Tqdm
from pytorch_lightning.utilities.model_summary.model_summary import (
    get_formatted_model_size,
    get_human_readable_count,
)

from seq2seq.errors import ConfigError
from seq2seq.pipeline.checks import check_max_time
from seq2seq.pipeline.resume import resume_command
from seq2seq.training.checkpointing import (
    NonFiniteGuard,
    PeriodicCheckpoint,
    ResumeState,
    SignalFlag,
    StopOnSignal,
    ValidateAtMaxSteps,
)

# Lightning's own summary logs here; ours too, so that it shows wherever Lightning's did (Lightning
# gives its loggers a handler of their own: a notebook shows them without any logging set up).
SUMMARY_LOG = logging.getLogger("pytorch_lightning.callbacks.model_summary")


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (training from a notebook cell)."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and hasattr(shell, "kernel")


class NotebookProgressBar(TQDMProgressBar):
    """tqdm's bars, one line an epoch: the sanity check's and validation's own bars are off
    (their results show on the epoch's line), since a cell's output cannot move the cursor up
    to redraw a bar below another and would keep every one of them."""

    def init_sanity_tqdm(self) -> Tqdm:
        return Tqdm(disable=True)  # off from the start: tqdm draws a bar once it is made

    def init_validation_tqdm(self) -> Tqdm:
        return Tqdm(disable=True)


def progress_bar(cfg: DictConfig) -> list[pl.Callback]:
    """In a notebook, tqdm's progress bar in place of Lightning's default, Rich's: Rich draws in
    Jupyter only with ipywidgets, and without them prints a warning for every bar; tqdm's text
    bar redraws its one line in a cell's output either way. Elsewhere, Lightning's choice."""
    if in_notebook() and cfg.trainer.get("enable_progress_bar", True):
        return [NotebookProgressBar()]
    return []


class ParameterSummary(ModelSummary):
    """Lightning's table of the model's modules and their parameters, without its FLOPs and
    Mode columns: Lightning counts FLOPs by running a module's ``example_input_array``, which a
    seq2seq model does not define (its decoder's inputs come from a batch), so every count and
    the total read 0. Used in place of Lightning's own summary unless ``quiet``."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: object,  # Lightning's signature; this callback is given none
    ) -> None:
        # Mode (train or eval) is always train when training starts: no information either.
        columns = [(name, values) for name, values in summary_data if name not in ("FLOPs", "Mode")]
        widths = [max(len(name), *(len(value) for value in values)) for name, values in columns]

        def line(cells: Sequence[str]) -> str:
            return " | ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))

        header = line([name for name, _ in columns])
        rows = [line(row) for row in zip(*(values for _, values in columns), strict=True)]
        trainable, total = (
            get_human_readable_count(count).strip()  # Lightning pads it for its columns
            for count in (trainable_parameters, total_parameters)
        )
        size = get_formatted_model_size(model_size)
        totals = f"{trainable} trainable parameters of {total}, {size} MB"
        SUMMARY_LOG.info("\n".join(["", header, "-" * len(header), *rows, totals]))


class KeptCheckpoints(ModelCheckpoint):
    """A ``ModelCheckpoint`` told apart from the best-checkpoint one by its file names too:
    Lightning keys a checkpoint callback's saved state by its monitor and cadence alone, which
    ``keep_best`` shares with ``best.ckpt``'s."""

    @property
    def state_key(self) -> str:
        # The format of Lightning's own keys (its private _generate_state_key), so that runs
        # written before keep their callbacks' state when they resume.
        keys = {"monitor": self.monitor, "filename": self.filename}
        return f"{type(self).__qualname__}{keys!r}"


def kept_checkpoints(cfg: DictConfig, directory: Path) -> list[pl.Callback]:
    """``checkpoint.keep_last`` / ``keep_best``: the checkpoints of the last N validations and of
    the N best by val/bleu, which ``scripts/average_checkpoints.py`` averages."""
    callbacks: list[pl.Callback] = []
    for key, prefix, monitor in (("keep_last", "val", "step"), ("keep_best", "top", "val/bleu")):
        count = cfg.checkpoint.get(key, 0) or 0
        if type(count) is not int or count < 0:
            raise ConfigError(
                f"checkpoint.{key} must be a whole number of checkpoints (0: none), got {count!r}."
            )
        if count:
            callbacks.append(
                KeptCheckpoints(
                    dirpath=directory,
                    filename=prefix + "-step={step}",
                    monitor=monitor,  # "step": the latest N (Lightning logs the global step)
                    mode="max",
                    save_top_k=count,
                    auto_insert_metric_name=False,
                    enable_version_counter=False,
                )
            )
    return callbacks


def early_stopping(cfg: DictConfig) -> list[pl.Callback]:
    """``early_stopping.patience``: stop when val/bleu has not improved for that many
    validations."""
    settings = cfg.get("early_stopping") or {}
    patience = settings.get("patience")
    if patience is None:
        return []
    if type(patience) is not int or patience < 1:
        raise ConfigError(
            f"early_stopping.patience must be a positive number of validations (or null: never "
            f"stop early), got {patience!r}."
        )
    return [
        EarlyStopping(
            monitor="val/bleu", mode="max", patience=patience,
            min_delta=float(settings.get("min_delta", 0.0)), check_finite=True,
        )
    ]  # fmt: skip


def reliability_callbacks(
    cfg: DictConfig, run_dir: Path, stop_flag: SignalFlag
) -> list[pl.Callback]:
    """Periodic last.ckpt, clean stop on SIGINT/SIGTERM, validation at max_steps, the
    ``trainer.max_time`` limit, the non-finite guard, resume state."""
    directory = run_dir / "checkpoints"
    command = resume_command()
    return [
        PeriodicCheckpoint(directory, cfg.checkpoint.every_n_steps),
        StopOnSignal(stop_flag, directory, command),
        ValidateAtMaxSteps(),
        *time_limit(cfg),
        NonFiniteGuard(bool(cfg.trainer.get("skip_nonfinite", False)), directory, command),
        ResumeState(),
    ]


def time_limit(cfg: DictConfig) -> list[pl.Callback]:
    """``trainer.max_time``'s Timer, which stops the run after that much training time.

    Built here, not by Lightning (the pipeline gives the trainer max_time=None): Lightning appends
    its Timer after every callback it is given, where the attention diagnostics, which come after
    the reliability set, could not see that the run stops at this step."""
    limit = check_max_time(cfg)
    return [] if limit is None else [Timer(duration=limit, interval="step")]
