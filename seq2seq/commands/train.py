"""Train an attention encoder–decoder: ``seq2seq train attention=scaled_dot`` (``train.py``).

The configs are the package's (``seq2seq/conf``); ``--config-dir DIR`` and ``hydra.searchpath``
add a user's, as with any Hydra app.
"""

from __future__ import annotations

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
from seq2seq.pipeline.resume import (
    RunDirectoryBefore,
    check_new_run,
    holds_a_run,
    remove_refused_run,
)
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
    """Where the run fails before it trains (a bad value refused by its checks), delete what
    Hydra and the run made in the run's directory, and the directory if the command made it: a
    refused run leaves nothing, as ``seq2seq.train`` does. What existed before the command
    (``RunDirectory.before``) stays."""
    try:
        yield
    except Exception:
        before = RunDirectory.before
        output_dir = Path(HydraConfig.get().runtime.output_dir).absolute()
        if not is_nonzero_rank_from_env() and before is not None and before.path == output_dir:
            remove_refused_run(before)
        raise


class RunDirectory(Callback):
    """A Hydra callback (``hydra.callbacks`` in ``conf/config.yaml``) that runs before Hydra
    makes the run's directory and writes its record (.hydra/) there:

    - it notes what the directory held (``before``), so that a refused run deletes what it
      made and nothing that existed before;
    - it refuses a new run into a directory that holds a run before Hydra writes over that run's
      record, and gives a resumed run's record a folder of its own (``.hydra/resume``), so that
      the run's ``.hydra/overrides.yaml`` stays the one it was started with.

    Hydra gives the task function no handle on its callbacks, hence the class attribute: one
    command, one value."""

    before: ClassVar[RunDirectoryBefore | None] = None
    sweep: RunDirectoryBefore | None = None  # a multirun's folder, as it was before the sweep

    # Hydra calls its callbacks with keyword arguments that differ by event and version.
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        run_dir = Path(str(config.hydra.run.dir))
        RunDirectory.before = RunDirectoryBefore.of(run_dir)
        if not holds_a_run(run_dir):
            return
        if not config.get("ckpt_path"):
            with exit_on_user_error():
                check_new_run(run_dir)
        if config.hydra.output_subdir is not None:
            with read_write(config.hydra), open_dict(config.hydra):
                config.hydra.output_subdir = str(Path(config.hydra.output_subdir) / "resume")

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A multirun's job, whose directory (SWEEP/N) Hydra has made by now: what the sweep's
        folder held before the sweep (``on_multirun_start``) says what is new."""
        sweep = self.sweep
        if sweep is not None:  # a job of a sweep into a folder that existed is left as it is
            job = Path(str(config.hydra.runtime.output_dir)).absolute()
            new = sweep.created is not None
            RunDirectory.before = (
                RunDirectoryBefore(job, sweep.created, frozenset()) if new else None
            )

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.sweep = RunDirectoryBefore.of(Path(str(config.hydra.sweep.dir)))


def main() -> None:
    # DDP processes other than rank zero share rank zero's run directory and write nothing there.
    sys.argv += hydra_overrides_for_rank(sys.argv[1:])
    train_app()


if __name__ == "__main__":
    main()
