"""Train an attention encoder–decoder: ``seq2seq train attention=scaled_dot`` (``train.py``).

The configs are the package's (``seq2seq/conf``); ``--config-dir DIR`` and ``hydra.searchpath``
add a user's, as with any Hydra app.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

# Run as a file (how Lightning starts DDP's other processes for `seq2seq train`: the command sets
# sys.argv[0] to this file), Python puts this folder first on sys.path; its modules (evaluate,
# export, ...) must not stand in for top-level packages of those names.
if __name__ == "__main__" and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from seq2seq.cli import exit_on_user_error
from seq2seq.pipeline import hydra_run_dir, train
from seq2seq.pipeline.resume import check_new_run, claim_run_dir, holds_a_run, remove_refused_run
from seq2seq.training.distributed import hydra_overrides_for_rank, is_nonzero_rank_from_env

# hydra.run.dir uses it: a resumed run (ckpt_path=RUN/checkpoints/last.ckpt) goes on in RUN.
OmegaConf.register_new_resolver("seq2seq_run_dir", hydra_run_dir, replace=True)


# An absolute path: Hydra reads it as a directory (a relative one would be a module to import).
CONFIGS = str(Path(__file__).resolve().parents[1] / "conf")


@hydra.main(version_base="1.3", config_path=CONFIGS, config_name="config")
def train_app(cfg: DictConfig) -> float | None:
    with exit_on_user_error(), refused_run_removed(cfg):
        # The return value is what Hydra's sweepers optimise.
        return train(cfg)["best_val_bleu"]


@contextmanager
def refused_run_removed(cfg: DictConfig) -> Iterator[None]:
    """Where the run fails before it trains (a bad value refused by its checks), delete the run
    directory Hydra made for it, and what it wrote there: a refused run leaves nothing, as
    ``seq2seq.train`` does. Only a folder this command made goes (``RunDirectory``)."""
    try:
        yield
    except Exception:
        hydra = HydraConfig.get()
        if not is_nonzero_rank_from_env():
            overrides = list(hydra.overrides.task)
            remove_refused_run(Path(hydra.runtime.output_dir), RunDirectory.created, overrides)
        raise


class RunDirectory(Callback):
    """A Hydra callback (``hydra.callbacks`` in ``conf/config.yaml``) that runs before Hydra
    makes the run's directory and writes its record (.hydra/) there:

    - it makes the directory itself (``claim_run_dir``) and keeps the outermost folder it made
      (``created``), so that a refused run deletes what this command made and nothing else;
    - it refuses a new run into a directory that holds a run before Hydra writes over that run's
      record, and gives a resumed run's record a folder of its own (``.hydra/resume``), so that
      the run's ``.hydra/overrides.yaml`` stays the one it was started with.

    Hydra gives the task function no handle on its callbacks, hence the class attribute: one
    command, one value."""

    created: ClassVar[Path | None] = None

    # Hydra calls its callbacks with keyword arguments that differ by event and version.
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        run_dir = Path(str(config.hydra.run.dir))
        if holds_a_run(run_dir):
            if not config.get("ckpt_path"):
                with exit_on_user_error():
                    check_new_run(run_dir)
            if config.hydra.output_subdir is not None:
                with read_write(config.hydra), open_dict(config.hydra):
                    config.hydra.output_subdir = str(Path(config.hydra.output_subdir) / "resume")
        # Ours unless the command line or a config file chose another (conf/config.yaml's).
        raw = OmegaConf.to_container(config.hydra.run, resolve=False)
        ours = isinstance(raw, dict) and str(raw.get("dir")).startswith("${seq2seq_run_dir:")
        if not ours or config.get("ckpt_path"):
            RunDirectory.created = claim_run_dir(run_dir)
            return
        # outputs/DATE/TIME, made here: a command started in the same second gets TIME-2, as
        # seq2seq.train names it, instead of sharing (and a refusal deleting) this one's folder.
        for number in itertools.count(1):
            candidate = run_dir if number == 1 else run_dir.with_name(f"{run_dir.name}-{number}")
            RunDirectory.created = claim_run_dir(candidate)
            if RunDirectory.created is not None or not candidate.exists():
                break
        with read_write(config.hydra), open_dict(config.hydra):
            config.hydra.run.dir = str(candidate)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A sweep's jobs (SWEEP/N, run one after another by this command) are this command's
        where it made the sweep's folder."""
        RunDirectory.created = claim_run_dir(Path(str(config.hydra.sweep.dir)))


def main() -> None:
    # DDP processes other than rank zero share rank zero's run directory and write nothing there.
    sys.argv += hydra_overrides_for_rank(sys.argv[1:])
    train_app()


if __name__ == "__main__":
    main()
