"""Experiment loggers: metrics.csv always, plus the tracker ``logger=`` picks (W&B by default).

``conf/logger/*.yaml`` each name a factory below as a ``_partial_``; the pipeline calls it with the
run directory and a ``RunInfo``. Lightning's loggers write on rank zero only.

W&B's mode is chosen so that a run never fails, hangs or prompts for lack of a network: online when
credentials are present (``WANDB_API_KEY`` or a ``~/.netrc`` entry for the W&B host), offline
otherwise, and offline as well when the online start fails. ``WANDB_MODE`` in the environment
wins over all of this. The run files go to ``RUN/wandb/``; an offline run is uploaded later with
``wandb sync RUN/wandb/offline-run-*``. The W&B run id is kept in ``RUN/wandb_run_id``, so that a
training resumed in the same run directory continues the same W&B run.
"""

from __future__ import annotations

import logging
import netrc
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pytorch_lightning.loggers import Logger, TensorBoardLogger, WandbLogger

from seq2seq.errors import ConfigError
from seq2seq.training.csv_logger import CSVLogger
from seq2seq.training.distributed import is_nonzero_rank_from_env

log = logging.getLogger(__name__)

WANDB_ID_FILE = "wandb_run_id"
WANDB_MODES = ("auto", "online", "offline", "disabled")


@dataclass(frozen=True)
class RunInfo:
    """How a run is named in trackers: ``name`` (attention-model-data), ``group`` (the multirun
    sweep, or None), ``tags`` and the fully resolved config."""

    name: str
    group: str | None = None
    tags: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)


def csv_logger(save_dir: str | Path) -> CSVLogger:
    """``metrics.csv`` (one row per logging step, with a ``step`` column) in the run directory,
    written as rows are logged and continued by a resumed run."""
    return CSVLogger(save_dir=str(save_dir), name="", version="")


def no_tracker(save_dir: str | Path, run: RunInfo) -> None:
    """``logger=csv`` and ``logger=none``: no tracker beyond metrics.csv."""
    return None


def tensorboard_logger(save_dir: str | Path, run: RunInfo) -> TensorBoardLogger:
    """TensorBoard event files in ``RUN/tensorboard`` (``tensorboard --logdir RUN``)."""
    return TensorBoardLogger(save_dir=str(save_dir), name="", version="tensorboard")


def wandb_logger(
    save_dir: str | Path,
    run: RunInfo,
    project: str = "seq2seq",
    entity: str | None = None,
    mode: str = "auto",
    group: str | None = None,
    tags: list[str] | None = None,
    init_timeout: float = 60.0,
) -> WandbLogger:
    """A W&B run named after ``run``; see the module docstring for how its mode is chosen."""
    if mode not in WANDB_MODES:
        raise ConfigError(
            f"logger.mode must be one of {', '.join(WANDB_MODES)}, got {mode!r}: auto (online "
            "when W&B credentials are present, offline otherwise), online, offline or disabled."
        )
    run_dir = Path(save_dir)
    resolved_mode = wandb_mode(mode)
    common: dict[str, Any] = {
        "save_dir": str(run_dir),
        "project": project,
        "entity": entity,
        "name": run.name,
        "group": group or run.group,
        "tags": [*run.tags, *(tags or [])],
        "id": wandb_run_id(run_dir),
        "resume": "allow",  # the same id again: continue that run
        "config": run.config,
    }
    logger = _wandb(common, resolved_mode, init_timeout)
    if resolved_mode == "online" and not is_nonzero_rank_from_env():
        try:
            logger.experiment  # noqa: B018 (start the run now, to fall back while we still can)
        except Exception as error:  # wandb raises many types for "cannot reach the server"
            log.warning(
                "W&B could not start an online run (%s); logging offline to %s/wandb instead. "
                "Upload it later with: wandb sync %s/wandb/offline-run-*",
                str(error).splitlines()[0] if str(error) else type(error).__name__,
                run_dir,
                run_dir,
            )
            _finish_wandb()
            logger = _wandb(common, "offline", init_timeout)
    return logger


def log_summary_tables(
    directory: Path,
    tables: dict[str, tuple[list[str], list[list[Any]]]],
    name: str,
    group: str,
    project: str = "seq2seq",
    entity: str | None = None,
    mode: str = "auto",
    init_timeout: float = 60.0,
) -> Path | None:
    """One more W&B run, ``job_type="summary"``, in a multirun's ``group``, that logs ``tables``
    (name -> header and rows) as W&B tables; offline where a training run would be (its files in
    ``directory/wandb``). Returns the run's directory, or None with ``mode=disabled``."""
    import wandb

    resolved = wandb_mode(mode)
    if resolved == "disabled":
        return None
    arguments: dict[str, Any] = {
        "project": project, "entity": entity, "group": group, "name": name,
        "job_type": "summary", "dir": str(directory),
        "settings": wandb.Settings(init_timeout=init_timeout, silent=True),
    }  # fmt: skip
    try:
        run = wandb.init(mode=resolved, **arguments)  # type: ignore[arg-type]  # a checked mode
    except Exception as error:  # wandb raises many types for "cannot reach the server"
        if resolved != "online":
            raise
        log.warning("W&B could not start an online run (%s); logging the summary offline", error)
        _finish_wandb()
        run = wandb.init(mode="offline", **arguments)
    try:
        run.log(
            {
                key: wandb.Table(columns=list[str | int](header), data=rows)
                for key, (header, rows) in tables.items()
            }
        )
        return Path(run.dir).parent
    finally:
        run.finish()


def finish(loggers: list[Logger]) -> None:
    """End the W&B run of this training, so that the next job of a multirun starts its own."""
    for logger in loggers:
        if isinstance(logger, WandbLogger) and logger._experiment is not None:
            logger.experiment.finish()


def _wandb(arguments: dict[str, Any], mode: str, init_timeout: float) -> WandbLogger:
    try:
        import wandb
    except ImportError as error:
        raise ConfigError(
            "logger=wandb (the default) needs the wandb package, which cannot be imported here "
            f"({error}). Install it with `pip install wandb` (seq2seq depends on it, so "
            "`pip install -e .` also brings it), or log to local files only with logger=csv."
        ) from None

    settings = wandb.Settings(init_timeout=init_timeout, silent=True)
    logger = WandbLogger(**arguments, mode=mode, settings=settings)
    # Lightning 2.6 passes anonymous=None to wandb.init whatever it is given, and W&B then warns
    # that the (deprecated) setting has no effect; left out, W&B's own default applies.
    logger._wandb_init.pop("anonymous", None)
    return logger


def _finish_wandb() -> None:
    """Forget a run that failed to start: its id stays taken until W&B's service is shut down."""
    import wandb

    if wandb.run is not None:
        wandb.finish()
    wandb.teardown()


def wandb_mode(requested: str) -> str:
    """The W&B mode to use for ``logger.mode`` (``auto`` resolved)."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if has_wandb_credentials() else "offline"


def has_wandb_credentials() -> bool:
    """An API key in the environment, or a netrc entry for the W&B host."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or ""
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_run_id(run_dir: Path) -> str:
    """The W&B id of this run directory: read back when resuming, created (rank zero) otherwise."""
    path = run_dir / WANDB_ID_FILE
    if path.is_file():
        saved = path.read_text(encoding="utf-8").strip()
        if saved:
            return saved
    run_id = secrets.token_hex(4)
    if not is_nonzero_rank_from_env():
        path.write_text(run_id + "\n", encoding="utf-8")
    return run_id
