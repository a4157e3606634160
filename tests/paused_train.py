"""``train.py`` that stops at a fixed point and waits, for the tests that kill or signal a run.

A test that polls for a file and then sends a signal lands wherever the machine's load lets the
child get to; on a starved machine the child can finish the epoch first. This script runs
``train.py`` with one more callback: at the point ``SEQ2SEQ_TEST_PAUSE`` names it writes
``SEQ2SEQ_TEST_PAUSE_DIR/paused`` and waits until ``SEQ2SEQ_TEST_PAUSE_DIR/go`` exists (or for
ever, for a SIGKILL). The signal then lands at that point on any machine.

    SEQ2SEQ_TEST_PAUSE=checkpoint:N   after the N-th periodic last.ckpt is written
    SEQ2SEQ_TEST_PAUSE=step:N         after training step N (its callbacks have run)
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

import seq2seq.pipeline
from seq2seq.training import checkpointing

ROOT = Path(__file__).resolve().parents[1]


def pause(directory: Path) -> None:
    (directory / "paused").touch()
    while not (directory / "go").exists():
        time.sleep(0.01)


class PauseAtStep(pl.Callback):
    def __init__(self, step: int, directory: Path) -> None:
        self.step = step
        self.directory = directory

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        if trainer.global_step == self.step:
            pause(self.directory)


def install(point: str, directory: Path) -> None:
    kind, _, count = point.partition(":")
    n = int(count)
    if kind == "step":
        # Appended after the run's own callbacks: the step's signal check has run, the next
        # step's has not.
        callbacks = seq2seq.pipeline.reliability_callbacks
        seq2seq.pipeline.reliability_callbacks = lambda *args: [  # type: ignore[assignment]
            *callbacks(*args),
            PauseAtStep(n, directory),
        ]
    elif kind == "checkpoint":
        real_save_last = checkpointing.save_last
        saved = 0

        def save_last(trainer: pl.Trainer, to: Path) -> Path:
            nonlocal saved
            path = real_save_last(trainer, to)
            saved += 1
            if saved == n:
                pause(directory)
            return path

        checkpointing.save_last = save_last  # type: ignore[assignment]
    else:
        raise SystemExit(f"SEQ2SEQ_TEST_PAUSE must be step:N or checkpoint:N, got {point!r}.")


def start_paused(
    run_dir: Path, overrides: list[str], point: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a run that pauses at ``point``; return once it is paused there. Create
    ``run_dir/go`` to let it go on."""
    run_dir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [sys.executable, __file__, f"hydra.run.dir={run_dir}", *overrides],
        cwd=ROOT,
        env={
            **(env or os.environ),
            "PYTHONPATH": str(ROOT),
            "SEQ2SEQ_TEST_PAUSE": point,
            "SEQ2SEQ_TEST_PAUSE_DIR": str(run_dir),
        },
        stdout=subprocess.DEVNULL,  # Hydra's console log: a full pipe would block the child
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 600
    while not (run_dir / "paused").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            _, stderr = process.communicate()
            raise AssertionError(f"the run never paused at {point}:\n{stderr.decode()[-3000:]}")
        time.sleep(0.05)
    return process


if __name__ == "__main__":
    install(os.environ["SEQ2SEQ_TEST_PAUSE"], Path(os.environ["SEQ2SEQ_TEST_PAUSE_DIR"]))
    sys.argv[0] = str(ROOT / "train.py")
    runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
