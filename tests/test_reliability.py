"""Clean stops, full disks, non-finite losses and determinism, on real (tiny) training runs."""

from __future__ import annotations

import csv
import errno
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from seq2seq.pipeline import load_checkpoint, train
from seq2seq.training.checkpointing import (
    AtomicCheckpointIO,
    CheckpointWriteError,
    NonFiniteLossError,
    checkpoint_step,
)
from seq2seq.training.lit_module import LitSeq2Seq
from tests.configs import TIMINGS, compose_config
from tests.configs import TINY as BASE
from tests.paused_train import start_paused

ROOT = Path(__file__).resolve().parents[1]


def subprocess_env() -> dict[str, str]:
    """This process's environment when the test runs (so the session's settings, W&B off among
    them, reach the child: a module-level copy would predate them), and the project on the path."""
    return {**os.environ, "PYTHONPATH": str(ROOT)}


TINY = [*BASE, "trainer.log_every_n_steps=1", "checkpoint.every_n_steps=4"]


def finite(checkpoint_path: Path) -> bool:
    state = torch.load(checkpoint_path, weights_only=True)["state_dict"]
    return all(bool(torch.isfinite(tensor).all()) for tensor in state.values())


# --- SIGINT / SIGTERM -------------------------------------------------------------------------


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_saves_last_ckpt_and_prints_a_resume_command_that_works(
    tmp_path: Path, signum: int, status: int
) -> None:
    run = tmp_path / "run"
    overrides = [*TINY, "checkpoint.every_n_steps=null", "trainer.max_epochs=3"]
    # Paused after step 3 (its signal check done): the signal is handled there, the run stops at
    # the end of step 4 whatever the machine's load.
    process = start_paused(run, overrides, "step:3", subprocess_env())
    process.send_signal(signum)
    logged(run, f"received {signal.Signals(signum).name}")
    (run / "go").touch()
    _, stderr = process.communicate(timeout=300)
    message = stderr.decode()
    assert process.returncode == status, message[-3000:]
    assert "Traceback" not in message
    assert f"stopped by {signal.Signals(signum).name} at step" in message
    last = run / "checkpoints" / "last.ckpt"
    step = checkpoint_step(last)
    assert step == 4  # mid-epoch: every_n_steps is off
    command = message.split("Resume with: ")[1].strip().splitlines()[0]
    assert command.endswith(f"ckpt_path={last}")
    if signum == signal.SIGINT:  # paste it: the run goes on to the end
        resumed = subprocess.run(
            shlex.split(command), cwd=ROOT, env=subprocess_env(), capture_output=True, timeout=600
        )
        assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
        assert torch.load(last, weights_only=True)["global_step"] == 3 * 19


def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    run = tmp_path / "run"
    overrides = [*TINY, "checkpoint.every_n_steps=null"]
    process = start_paused(run, overrides, "step:3", subprocess_env())
    process.send_signal(signal.SIGINT)
    logged(run, "received SIGINT")
    process.send_signal(signal.SIGINT)  # the run is still paused in step 3: it never goes on
    _, stderr = process.communicate(timeout=120)
    message = stderr.decode()
    assert process.returncode == 130, message[-3000:]
    assert "Traceback" not in message and "stopped by SIGINT" in message
    assert not (run / "checkpoints" / "last.ckpt").exists()


def logged(run: Path, text: str) -> None:
    """Wait until the run's log (Hydra's RUN/train.log, flushed at every record) holds ``text``."""
    deadline = time.monotonic() + 120
    while text not in (run / "train.log").read_text():
        assert time.monotonic() < deadline, f"the run never logged {text!r}"
        time.sleep(0.01)


# --- a full disk --------------------------------------------------------------------------------


def test_a_full_disk_keeps_the_previous_checkpoint_and_says_so(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "checkpoints" / "last.ckpt"
    target.parent.mkdir()
    shutil.copy(tiny_checkpoint, target)
    before = target.read_bytes()
    checkpoint = torch.load(target, weights_only=True)

    def disk_full(self: Path, data: bytes) -> int:
        with open(self, "wb") as file:
            file.write(bytes(data)[: len(data) // 2])  # half of it fits, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_bytes", disk_full)
    with pytest.raises(CheckpointWriteError) as caught:
        AtomicCheckpointIO().save_checkpoint(checkpoint, target)
    message = str(caught.value)
    assert "No space left on device" in message and f"previous {target.name} is intact" in message
    assert str(target) in message and "MB" in message
    assert target.read_bytes() == before
    assert [path.name for path in target.parent.iterdir()] == ["last.ckpt"]  # no temporary left


def unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not unshare_works(), reason="needs unshare -rm to mount a private tmpfs")
def test_training_on_a_disk_that_fills_up_stops_cleanly(tmp_path: Path) -> None:
    """A real 1 MiB tmpfs: room for two checkpoints, not for a third beside them."""
    run = tmp_path / "small_disk"
    run.mkdir()
    command = shlex.join(
        [sys.executable, "train.py", f"hydra.run.dir={run}", *TINY, "checkpoint.every_n_steps=3"]
    )
    completed = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {run} && {command}"],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        timeout=600,
    )
    message = completed.stderr.decode()
    assert completed.returncode == 2, message[-3000:]
    assert "Traceback" not in message
    assert "error: cannot write the checkpoint" in message and "No space left on device" in message
    # The mount is gone with the namespace; the message says what survived in it.
    assert "is intact" in message or "No earlier" in message


# --- NaN / Inf ----------------------------------------------------------------------------------


@pytest.fixture
def nan_at_step_6(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the loss of optimizer step 6 (global_step 5 before it) NaN."""
    original = LitSeq2Seq.training_step

    def training_step(self: LitSeq2Seq, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = original(self, batch, batch_idx)
        return loss * float("nan") if self.trainer.global_step == 5 else loss

    monkeypatch.setattr(LitSeq2Seq, "training_step", training_step)


@pytest.mark.usefixtures("nan_at_step_6")
def test_a_nan_loss_stops_training_naming_the_step_and_the_last_good_checkpoint(
    tmp_path: Path,
) -> None:
    with pytest.raises(NonFiniteLossError) as caught:
        train(compose_config([f"run_dir={tmp_path}", *TINY]))
    message = str(caught.value)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert "stopped at step 5 (epoch 0, batch 5): the loss is nan" in message
    assert f"The last good checkpoint is {last} (step 4)" in message
    assert "trainer.skip_nonfinite=true" in message
    assert checkpoint_step(last) == 4 and finite(last)
    assert not (tmp_path / "checkpoints" / "best.ckpt").exists()


@pytest.mark.usefixtures("nan_at_step_6")
def test_skip_nonfinite_skips_the_batch_counts_it_and_keeps_the_model_finite(
    tmp_path: Path,
) -> None:
    result = train(compose_config([f"run_dir={tmp_path}", *TINY, "trainer.skip_nonfinite=true"]))
    assert finite(Path(result["best_checkpoint"])) and finite(Path(result["last_checkpoint"]))
    with open(tmp_path / "metrics.csv", newline="") as file:
        counts = [row["train/skipped_nonfinite"] for row in csv.DictReader(file)]
    counts = [float(count) for count in counts if count]
    assert counts[:5] == [0.0] * 5 and set(counts[5:]) == {1.0}


@pytest.mark.usefixtures("nan_at_step_6")
def test_a_skipped_step_logs_its_own_attention_gradient_norm(tmp_path: Path) -> None:
    """The norm is taken before the guard drops the bad step's gradients: its row (a logging
    step) shows the NaN, not the norm of the logging step before."""
    overrides = [f"run_dir={tmp_path}", *TINY, "trainer.skip_nonfinite=true"]
    train(compose_config([*overrides, "trainer.log_every_n_steps=3"]))
    with open(tmp_path / "metrics.csv", newline="") as file:
        norms = {row["step"]: row["attn/grad_norm"] for row in csv.DictReader(file)}
    assert norms["5"] == "nan"  # step 6, counted from 0 in the step column
    assert all(0 < float(norms[step]) < float("inf") for step in ("2", "8", "11"))


class InfiniteGradient(torch.autograd.Function):
    """The identity forward; backward, every gradient through it times infinity."""

    @staticmethod
    def forward(ctx: Any, loss: torch.Tensor) -> torch.Tensor:
        return loss.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("inf")


def test_an_infinite_gradient_with_a_finite_loss_stops_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard checks the gradients' norm too: a finite loss whose backward pass overflows
    stops the run at that step, naming the gradients and the finite loss."""
    original = LitSeq2Seq.training_step

    def training_step(self: LitSeq2Seq, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = original(self, batch, batch_idx)
        return InfiniteGradient.apply(loss) if self.trainer.global_step == 5 else loss

    monkeypatch.setattr(LitSeq2Seq, "training_step", training_step)
    with pytest.raises(NonFiniteLossError) as caught:
        train(compose_config([f"run_dir={tmp_path}", *TINY]))
    message = str(caught.value)
    assert (
        "stopped at step 5 (epoch 0, batch 5): the gradients are not finite (the loss is" in message
    )
    assert checkpoint_step(tmp_path / "checkpoints" / "last.ckpt") == 4


def test_a_checkpoint_with_nan_weights_is_never_written(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    checkpoint = torch.load(tiny_checkpoint, weights_only=True)
    name = next(iter(checkpoint["state_dict"]))
    checkpoint["state_dict"][name] = checkpoint["state_dict"][name] * float("inf")
    target = tmp_path / "best.ckpt"
    shutil.copy(tiny_checkpoint, target)
    with pytest.raises(NonFiniteLossError, match=f"the weight {name} holds NaN or Inf"):
        AtomicCheckpointIO().save_checkpoint(checkpoint, target)
    assert target.read_bytes() == tiny_checkpoint.read_bytes()


# --- determinism --------------------------------------------------------------------------------


def test_same_seed_and_config_give_identical_metrics_and_weights(tmp_path: Path) -> None:
    overrides = [*TINY, "trainer.max_epochs=1", "checkpoint.every_n_steps=null"]
    first = train(compose_config([f"run_dir={tmp_path / 'a'}", *overrides]))
    second = train(compose_config([f"run_dir={tmp_path / 'b'}", *overrides]))

    def without_timings(metrics: dict[str, Any]) -> dict[str, Any]:
        return {name: value for name, value in metrics.items() if name not in TIMINGS}

    assert without_timings(first["metrics"]) == without_timings(second["metrics"])
    rows = []
    for run in (tmp_path / "a", tmp_path / "b"):
        with open(run / "metrics.csv", newline="") as file:
            rows.append([without_timings(row) for row in csv.DictReader(file)])
    assert rows[0] == rows[1]
    weights_a = load_checkpoint(first["last_checkpoint"]).state_dict()
    weights_b = load_checkpoint(second["last_checkpoint"]).state_dict()
    assert all(torch.equal(weights_a[name], weights_b[name]) for name in weights_a)
