"""``python train.py`` as a user runs it, end to end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from seq2seq.attention import AdditiveAttention
from seq2seq.pipeline import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]


# Third-party lines a default run printed, each of which says nothing to the user (issue 29).
NOISE = [
    "tokenized period",  # sacreBLEU guessing that the pre-tokenized toy task was a mistake
    "forgot to detokenize",
    "LeafSpec",  # Lightning's use of a deprecated torch API
    "litlogger",  # Lightning's advertising tip
    "anonymous setting",  # W&B's warning about an argument Lightning passes
    "Tight layout not applied",  # matplotlib, on attention maps of long tokens
    "multiple `ModelCheckpoint` callbacks",  # Lightning, on trainer.test(ckpt_path="best")
]


def run_train(
    run_dir: Path, *overrides: str, timeout: int, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(
        [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed


def best_of(stdout: str) -> tuple[float, Path]:
    bleu = re.search(r"Best val BLEU: ([0-9.]+)", stdout)
    path = re.search(r"Best checkpoint: (\S+)", stdout)
    assert bleu and path, stdout[-2000:]
    return float(bleu.group(1)), Path(path.group(1))


@pytest.mark.slow  # train.py end to end; the pipeline tests cover the same in process
def test_small_configuration_trains_and_reports_its_best_checkpoint(tmp_path: Path) -> None:
    """The small configuration other checks use: 4,000 pairs, 2 epochs, logged to W&B offline
    (the default logger, as a user without credentials gets it). The console shows progress, our
    log lines and the summary, without the third-party noise in ``NOISE``."""
    completed = run_train(
        tmp_path,
        "data.train_size=4000",
        "trainer.max_epochs=2",
        "model.hidden_size=64",
        timeout=600,
        env={"WANDB_MODE": "offline"},
    )
    console = completed.stdout + completed.stderr
    assert [line for line in NOISE if line in console] == [], console[-4000:]
    assert (tmp_path / "wandb").is_dir()  # the W&B run was made, so its warning had its chance
    bleu, best = best_of(completed.stdout)
    assert 0 <= bleu <= 100
    assert best == tmp_path / "checkpoints" / "best.ckpt" and best.is_file()
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    assert isinstance(load_checkpoint(best).model.decoder.attention, AdditiveAttention)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["additive", "scaled_dot"])
def test_default_model_learns_the_toy_task(tmp_path: Path, attention: str) -> None:
    """The acceptance bar, on two epochs instead of the default five: val BLEU >= 90."""
    completed = run_train(tmp_path, f"attention={attention}", "trainer.max_epochs=2", timeout=1200)
    bleu, _ = best_of(completed.stdout)
    assert bleu >= 90


def hydra_config(run_dir: Path, chosen: bool = False) -> DictConfig:
    """What Hydra hands its callbacks' on_run_start: the run's config with its hydra node."""
    import seq2seq.commands.train  # noqa: F401  (registers seq2seq_run_dir)

    OmegaConf.register_new_resolver("test_dir", lambda: str(run_dir), replace=True)
    # conf/config.yaml's default goes through the seq2seq_run_dir resolver; a chosen one not.
    default = "${seq2seq_run_dir:${ckpt_path},${test_dir:}}"
    return OmegaConf.create(
        {
            "ckpt_path": None,
            "hydra": {"run": {"dir": str(run_dir) if chosen else default},
                      "output_subdir": ".hydra"},
        }
    )  # fmt: skip


def test_a_default_run_directory_taken_in_the_same_second_gets_a_number(tmp_path: Path) -> None:
    """Two commands started in the same second would share outputs/DATE/TIME (and one's refusal
    would delete the other's folder): the second gets TIME-2, made by it."""
    from seq2seq.commands.train import RunDirectory

    first, second = hydra_config(tmp_path / "time"), hydra_config(tmp_path / "time")
    RunDirectory().on_run_start(first)
    assert first.hydra.run.dir == str(tmp_path / "time")
    assert RunDirectory.created == tmp_path / "time"
    RunDirectory().on_run_start(second)
    assert second.hydra.run.dir == str(tmp_path / "time-2")
    assert RunDirectory.created == tmp_path / "time-2" and (tmp_path / "time-2").is_dir()
    chosen = hydra_config(tmp_path / "time", chosen=True)  # the user's own: kept, not this one's
    RunDirectory().on_run_start(chosen)
    assert chosen.hydra.run.dir == str(tmp_path / "time") and RunDirectory.created is None
