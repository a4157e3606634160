"""Train an attention encoder–decoder: ``seq2seq train attention=scaled_dot`` (``train.py``).

The configs are the package's (``seq2seq/conf``); ``--config-dir DIR`` and ``hydra.searchpath``
add a user's, as with any Hydra app.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Run as a file (how Lightning starts DDP's other processes for `seq2seq train`: the command sets
# sys.argv[0] to this file), Python puts this folder first on sys.path; its modules (evaluate,
# export, ...) must not stand in for top-level packages of those names.
if __name__ == "__main__" and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from seq2seq.cli import exit_on_user_error
from seq2seq.pipeline import hydra_run_dir, train
from seq2seq.pipeline.resume import remove_refused_run
from seq2seq.training.distributed import hydra_overrides_for_rank, is_nonzero_rank_from_env

# Before Hydra creates the run directory: what a refused run wrote is newer (remove_refused_run).
STARTED = time.time()

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
    directory Hydra made for it, and so what it wrote there: a refused run leaves nothing, as
    ``train(cfg)`` called from Python does. A directory holding more (``remove_refused_run``) is
    kept."""
    try:
        yield
    except Exception:
        if not is_nonzero_rank_from_env():
            run_dir = OmegaConf.select(cfg, "run_dir", throw_on_resolution_failure=False)
            for directory in {HydraConfig.get().runtime.output_dir, run_dir} - {None}:
                remove_refused_run(Path(str(directory)), STARTED)
        raise


def main() -> None:
    # DDP processes other than rank zero share rank zero's run directory and write nothing there.
    sys.argv += hydra_overrides_for_rank(sys.argv[1:])
    train_app()


if __name__ == "__main__":
    main()
