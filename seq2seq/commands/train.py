"""Train an attention encoder–decoder: ``seq2seq train attention=scaled_dot`` (``train.py``).

The configs are the package's (``seq2seq/conf``); ``--config-dir DIR`` and ``hydra.searchpath``
add a user's, as with any Hydra app.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a file (how Lightning starts DDP's other processes for `seq2seq train`: the command sets
# sys.argv[0] to this file), Python puts this folder first on sys.path; its modules (evaluate,
# export, ...) must not stand in for top-level packages of those names.
if __name__ == "__main__" and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

import hydra
from omegaconf import DictConfig, OmegaConf

from seq2seq.cli import exit_on_user_error
from seq2seq.pipeline import hydra_run_dir, train
from seq2seq.training.distributed import hydra_overrides_for_rank

# hydra.run.dir uses it: a resumed run (ckpt_path=RUN/checkpoints/last.ckpt) goes on in RUN.
OmegaConf.register_new_resolver("seq2seq_run_dir", hydra_run_dir, replace=True)


# An absolute path: Hydra reads it as a directory (a relative one would be a module to import).
CONFIGS = str(Path(__file__).resolve().parents[1] / "conf")


@hydra.main(version_base="1.3", config_path=CONFIGS, config_name="config")
def train_app(cfg: DictConfig) -> float | None:
    with exit_on_user_error():
        # The return value is what Hydra's sweepers optimise.
        return train(cfg)["best_val_bleu"]


def main() -> None:
    # DDP processes other than rank zero share rank zero's run directory and write nothing there.
    sys.argv += hydra_overrides_for_rank(sys.argv[1:])
    train_app()


if __name__ == "__main__":
    main()
