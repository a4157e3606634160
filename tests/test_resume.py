"""Resuming: a run killed with SIGKILL and resumed ends exactly where an unbroken run ends."""

from __future__ import annotations

import csv
import json
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning_fabric.utilities.data import _set_sampler_epoch

from seq2seq.data.batching import (
    BucketBatchSampler,
    EncodedDataset,
    EncodedExample,
    ResumableDataLoader,
)
from seq2seq.errors import ConfigError
from seq2seq.pipeline import resolve_run_dir, train
from seq2seq.pipeline.resume import claim_run_dir, remove_refused_run
from seq2seq.training import checkpointing
from seq2seq.training.checkpointing import checkpoint_step
from seq2seq.training.csv_logger import ResumingWriter, read_complete_rows
from tests.configs import TIMINGS, compose_config, epoch_target_tokens
from tests.configs import TINY as BASE
from tests.paused_train import start_paused

ROOT = Path(__file__).resolve().parents[1]
# 600 pairs in batches of 32: 19 steps an epoch, last.ckpt every 5 steps, a train row every 2.
# threads=1 pins the thread count of every run: the in-process runs would otherwise inherit
# whatever an earlier test set (the benchmark tests set 1) while the killed train.py starts with
# one per core, and GEMMs split over other thread counts sum in another order.
TINY = [
    *BASE,
    "trainer.log_every_n_steps=2",
    "checkpoint.every_n_steps=5",
    "threads=1",
]


def metric_rows(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "metrics.csv", newline="") as file:
        return list(csv.DictReader(file))


def run_summary(run_dir: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return summary


def dataset(n: int) -> EncodedDataset:
    return EncodedDataset([EncodedExample([1] * (1 + i % 7), [1], "", "") for i in range(n)])


def test_loader_resumes_at_the_next_batch_of_the_same_epoch_order() -> None:
    data = dataset(200)
    loader = ResumableDataLoader(data, BucketBatchSampler(data.lengths(), 8, seed=3))
    loader.bucket_sampler.set_epoch(2)
    epoch_two = [batch.indices.tolist() for batch in loader]
    iterator = iter(loader)
    for _ in range(7):
        next(iterator)
    state = loader.state_dict()
    assert state == {"epoch": 2, "batches_done": 7, "batches_per_epoch": len(epoch_two)}

    resumed = ResumableDataLoader(data, BucketBatchSampler(data.lengths(), 8, seed=3))
    resumed.load_state_dict(state)
    lazy = iter(resumed)  # Lightning calls iter() before it sets the epoch of a resumed run
    resumed.bucket_sampler.set_epoch(2)
    assert [batch.indices.tolist() for batch in lazy] == epoch_two[7:]
    assert resumed.state_dict()["batches_done"] == len(epoch_two)
    resumed.bucket_sampler.set_epoch(3)  # later epochs are whole again
    assert len(list(resumed)) == len(epoch_two)


def test_lightning_sets_the_epoch_of_the_training_batches() -> None:
    data = dataset(200)
    loader = ResumableDataLoader(data, BucketBatchSampler(data.lengths(), 8, seed=3))
    first = [batch.indices.tolist() for batch in loader]
    _set_sampler_epoch(loader, 1)  # what Lightning does before each epoch
    assert loader.bucket_sampler.epoch == 1
    assert [batch.indices.tolist() for batch in loader] != first


def test_loader_refuses_a_mid_epoch_state_from_other_batches() -> None:
    data = dataset(200)
    loader = ResumableDataLoader(data, BucketBatchSampler(data.lengths(), 8, seed=3))
    with pytest.raises(ConfigError, match="5 batches into an epoch of 99 batches"):
        loader.load_state_dict({"epoch": 0, "batches_done": 5, "batches_per_epoch": 99})


def test_metrics_rows_after_the_checkpoint_are_replaced_and_a_torn_row_dropped(
    tmp_path: Path,
) -> None:
    (tmp_path / "metrics.csv").write_text(
        "epoch,step,train/loss\n0,1,4.5\n0,3,4.4\n0,5,4.3\n0,7,4.2\n0,9,4."
    )
    assert [row["step"] for row in read_complete_rows(tmp_path / "metrics.csv")] == [
        "1",
        "3",
        "5",
        "7",
    ]
    writer = ResumingWriter(str(tmp_path))  # a resumed run whose first row is at step 5
    writer.log_metrics({"train/loss": 4.25}, step=5)
    writer.log_metrics({"val/bleu": 10.0}, step=6)
    writer.save()
    writer.log_metrics({"train/loss": 4.0}, step=7)
    writer.save()
    rows = metric_rows(tmp_path)
    assert [row["step"] for row in rows] == ["1", "3", "5", "6", "7"]
    assert rows[2]["train/loss"] == "4.25" and rows[3]["val/bleu"] == "10.0"
    assert list(rows[0]) == ["epoch", "step", "train/loss", "val/bleu"]


def test_resume_writes_into_the_checkpoints_run_directory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    config = compose_config([f"ckpt_path={run}/checkpoints/last.ckpt"])
    assert resolve_run_dir(config) == run
    explicit = compose_config([f"ckpt_path={run}/checkpoints/last.ckpt", f"run_dir={tmp_path}"])
    assert resolve_run_dir(explicit) == tmp_path


def start_and_kill(run_dir: Path, overrides: list[str]) -> int:
    """Run train.py until its first mid-epoch last.ckpt is written, SIGKILL it there; the
    checkpoint's step."""
    process = start_paused(run_dir, overrides, "checkpoint:1")
    process.send_signal(signal.SIGKILL)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL, stderr.decode()[-3000:]
    step = checkpoint_step(run_dir / "checkpoints" / "last.ckpt")
    assert step is not None, "last.ckpt must always be readable"
    return step


@pytest.mark.parametrize(
    "batching",
    [[], ["data.max_tokens=250"]],  # token budgets: Lightning builds a new loader every epoch
    ids=["sentences", "tokens"],
)
def test_a_periodic_checkpoint_is_written_after_its_steps_metrics_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batching: list[str]
) -> None:
    """A SIGKILL right after last.ckpt is written must not lose a row: the resumed run starts
    after the checkpoint's step and never logs the rows up to it again."""
    written: list[tuple[int, list[int]]] = []
    real_save_last = checkpointing.save_last

    def save_last(trainer: Any, directory: Path) -> Path:
        path = real_save_last(trainer, directory)
        steps = [int(row["step"]) for row in metric_rows(tmp_path) if row.get("train/loss")]
        written.append((checkpoint_step(path) or 0, steps))
        return path

    monkeypatch.setattr(checkpointing, "save_last", save_last)
    train(
        compose_config(
            [*TINY, *batching, f"run_dir={tmp_path}", "trainer.log_every_n_steps=1",
             "checkpoint.every_n_steps=4", "trainer.max_epochs=4"]
        )
    )  # fmt: skip
    # The row of the step that brings global_step to s is logged as step s - 1.
    rows = [row for row in metric_rows(tmp_path) if row.get("train/loss")]
    last_of_epoch = {int(row["epoch"]): int(row["step"]) + 1 for row in rows}
    # Every 4th step, except where an epoch ends: the epoch's own last.ckpt is written there.
    due = [s for s in range(4, last_of_epoch[3] + 1, 4) if s not in last_of_epoch.values()]
    assert len(due) >= 4 * 3 and [step for step, _ in written] == due
    for step, steps in written:
        assert steps == list(range(step)), f"last.ckpt of step {step} came before its rows"


@pytest.mark.parametrize(
    "switches",
    [
        [],
        # Attention with memory: an input-fed Luong decoder with coverage and its loss.
        [
            "model.decoder=luong", "model.input_feeding=true", "attention.coverage=true",
            "optim.coverage_loss_weight=1",
        ],
        # The Bahdanau decoder's C loop composing other parts: scaled dot product, entmax15 and
        # the key bias.
        ["attention=scaled_dot", "attention.normalizer=entmax15", "attention.key_bias=true"],
    ],
    ids=["default", "input-feeding-coverage", "fused-parts"],
)  # fmt: skip
def test_killed_and_resumed_run_logs_what_an_unbroken_run_logs(
    tmp_path: Path, switches: list[str]
) -> None:
    overrides = [*TINY, *switches]
    unbroken = train(compose_config([f"run_dir={tmp_path / 'unbroken'}", *overrides]))

    killed = tmp_path / "killed"
    step = start_and_kill(killed, overrides)
    assert step == 5, "the kill lands right after the first periodic checkpoint"
    last = killed / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)["seq2seq_throughput"]
    resumed = train(compose_config([*overrides, f"ckpt_path={last}"]))  # run_dir from ckpt_path

    assert resumed["run_dir"] == str(killed)
    expected, got = metric_rows(tmp_path / "unbroken"), metric_rows(killed)
    assert [row["step"] for row in got] == [row["step"] for row in expected]
    # Same batches, same dropout draws, same optimizer state, same thread count: the same
    # numbers. 1e-5 relative leaves room for MKL code paths that depend on buffer alignment; a
    # wrong batch or dropout draw moves them by far more.
    for row, reference in zip(got, expected, strict=True):
        assert row.keys() == reference.keys()
        for key, value in reference.items():
            if key in TIMINGS:
                assert bool(row[key]) == bool(value), (key, row)  # logged at the same steps
            elif value:
                assert float(row[key]) == pytest.approx(float(value), rel=1e-5), (key, row)
    assert resumed["best_val_bleu"] == pytest.approx(unbroken["best_val_bleu"], abs=1e-6)
    # The summary counts the training before the kill too: every target token of every epoch
    # once (the steps between the checkpoint and the kill are trained, and counted, again).
    summary, reference_summary = run_summary(killed), run_summary(tmp_path / "unbroken")
    epochs_tokens = 2 * epoch_target_tokens(compose_config(overrides))
    assert summary["train_tokens"] == reference_summary["train_tokens"] == epochs_tokens
    assert 0 < saved["target_tokens"] < summary["train_tokens"]
    assert 0 < saved["seconds"] < summary["train_seconds"]
    final = torch.load(last, weights_only=True)
    reference = torch.load(unbroken["last_checkpoint"], weights_only=True)
    assert final["global_step"] == reference["global_step"] > 19
    for name, tensor in reference["state_dict"].items():
        assert torch.allclose(final["state_dict"][name], tensor, atol=1e-6), name


@pytest.mark.slow
def test_resume_from_an_end_of_epoch_checkpoint_keeps_the_plateau_schedule(
    tmp_path: Path,
) -> None:
    """patience=0: the LR halves whenever val BLEU does not improve, so a schedule step skipped
    on resume would change every later loss."""
    overrides = [
        *TINY,
        "trainer.max_epochs=4",
        "optim.scheduler.patience=0",
        "optim.optimizer.lr=0.02",
        "checkpoint.every_n_steps=null",
    ]
    train(compose_config([f"run_dir={tmp_path / 'unbroken'}", *overrides]))
    # The first half must not score the test split: the unbroken run does that only at its end.
    first = train(
        compose_config(
            [
                f"run_dir={tmp_path / 'split'}",
                *overrides,
                "trainer.max_epochs=2",
                "test_after_training=false",
            ]
        )
    )
    train(compose_config([*overrides, f"ckpt_path={first['last_checkpoint']}"]))
    unbroken = torch.load(tmp_path / "unbroken" / "checkpoints" / "last.ckpt", weights_only=True)
    split = torch.load(tmp_path / "split" / "checkpoints" / "last.ckpt", weights_only=True)
    assert split["lr_schedulers"] == unbroken["lr_schedulers"]

    def without_timings(rows: list[dict[str, str]]) -> list[dict[str, str]]:
        return [{key: value for key, value in row.items() if key not in TIMINGS} for row in rows]

    assert without_timings(metric_rows(tmp_path / "split")) == without_timings(
        metric_rows(tmp_path / "unbroken")
    )


def starting_files(run: Path) -> None:
    """What a run writes before it trains: Hydra's files, then the pipeline's."""
    (run / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (run / ".hydra" / name).write_text("{}\n")
    for name in ("train.log", "config.yaml", "src_tokenizer.json", "tgt_tokenizer.json"):
        (run / name).write_text("{}\n")


@pytest.mark.parametrize(
    ("extra", "removed"),
    [
        (None, True),
        ("checkpoints/last.ckpt", False),  # a run that trained
        ("metrics.csv", False),
    ],
)
def test_remove_refused_run_takes_what_a_refused_run_made(
    tmp_path: Path, extra: str | None, removed: bool
) -> None:
    run = tmp_path / "outputs" / "day" / "time"
    created = claim_run_dir(run)
    assert created == tmp_path / "outputs" and run.is_dir()
    starting_files(run)
    if extra is not None:
        (run / extra).parent.mkdir(parents=True, exist_ok=True)
        (run / extra).write_text("kept\n")
    (run / ".hydra" / "overrides.yaml").write_text("- seed=1\n")  # this command's record
    assert remove_refused_run(run, created, ["seed=1"]) is removed
    assert (tmp_path / "outputs").exists() is not removed
    assert tmp_path.exists()


def test_remove_refused_run_keeps_what_another_command_made_or_shares(tmp_path: Path) -> None:
    """A folder that existed is not this command's (None); nor one another command made first
    (two runs started in the same second), nor one whose Hydra record is another command's."""
    (tmp_path / "day").mkdir()
    assert claim_run_dir(tmp_path / "day") is None
    assert claim_run_dir(tmp_path / "day" / "time") == tmp_path / "day" / "time"
    assert claim_run_dir(tmp_path / "day" / "time") is None  # the second command of the second
    run = tmp_path / "day" / "time"
    starting_files(run)
    (run / ".hydra" / "overrides.yaml").write_text("- seed=2\n")
    assert not remove_refused_run(run, run, ["seed=1"])  # it holds the other command's record
    assert not remove_refused_run(run, None, ["seed=2"])
    assert (run / ".hydra" / "overrides.yaml").exists()
    assert remove_refused_run(run, run, ["seed=2"])
    assert (tmp_path / "day").is_dir()
