"""Train an attention encoder–decoder: ``python train.py attention=scaled_dot``."""

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from seq2seq.cli import exit_on_user_error
from seq2seq.pipeline import hydra_run_dir, train
from seq2seq.training.distributed import hydra_overrides_for_rank

# hydra.run.dir uses it: a resumed run (ckpt_path=RUN/checkpoints/last.ckpt) goes on in RUN.
OmegaConf.register_new_resolver("seq2seq_run_dir", hydra_run_dir, replace=True)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    with exit_on_user_error():
        # The return value is what Hydra's sweepers optimise.
        return train(cfg)["best_val_bleu"]


if __name__ == "__main__":
    # DDP processes other than rank zero share rank zero's run directory and write nothing there.
    sys.argv += hydra_overrides_for_rank(sys.argv[1:])
    main()
