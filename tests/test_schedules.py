"""The inverse-square-root schedule against its formula, through a real optimizer."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from seq2seq.errors import ConfigError
from seq2seq.pipeline import train
from seq2seq.training.schedules import InverseSquareRootSchedule
from tests.configs import TINY, compose_config


def learning_rates(
    warmup: int, updates: int, peak: float = 1e-3, start: float = 0.0
) -> list[float]:
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=peak)
    schedule = InverseSquareRootSchedule(optimizer, warmup_steps=warmup, warmup_init_lr=start)
    rates = []
    for _ in range(updates):
        rates.append(optimizer.param_groups[0]["lr"])  # the rate this update uses
        optimizer.step()
        schedule.step()
    return rates


def test_linear_warmup_then_inverse_square_root_decay() -> None:
    peak, warmup = 1e-3, 4
    rates = learning_rates(warmup, 16, peak)
    for update, rate in enumerate(rates, start=1):
        expected = peak * update / warmup if update <= warmup else peak * math.sqrt(warmup / update)
        assert rate == pytest.approx(expected)
    assert max(rates) == pytest.approx(peak) and rates.index(max(rates)) == warmup - 1


def test_the_warmup_starts_from_warmup_init_lr() -> None:
    rates = learning_rates(warmup=10, updates=11, peak=1e-3, start=1e-4)
    assert rates[0] == pytest.approx(1e-4 + (1e-3 - 1e-4) / 10)
    assert rates[9] == pytest.approx(1e-3)


def test_it_steps_every_update_and_refuses_bad_settings() -> None:
    assert InverseSquareRootSchedule.interval == "step"
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    with pytest.raises(ConfigError, match="warmup_steps must be a positive integer"):
        InverseSquareRootSchedule(optimizer, warmup_steps=0)
    with pytest.raises(ConfigError, match="warmup_init_lr must lie in"):
        InverseSquareRootSchedule(optimizer, warmup_steps=10, warmup_init_lr=1.0)


def test_the_plateau_schedule_steps_at_the_epochs_that_validate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With trainer.check_val_every_n_epoch=2 the plateau schedule, which watches val/bleu, steps
    after epochs 2 and 4, on their val/bleu (Lightning would stop with an error at epoch 1, which
    has no val/bleu)."""
    seen: list[float] = []
    step = torch.optim.lr_scheduler.ReduceLROnPlateau.step

    def record(self: torch.optim.lr_scheduler.ReduceLROnPlateau, metrics: Any) -> None:
        seen.append(float(metrics))
        step(self, metrics)

    monkeypatch.setattr(torch.optim.lr_scheduler.ReduceLROnPlateau, "step", record)
    overrides = [*TINY, "trainer.max_epochs=4", "+trainer.check_val_every_n_epoch=2"]
    train(compose_config([*overrides, f"run_dir={tmp_path}", "logger=csv"]))
    with open(tmp_path / "metrics.csv", newline="") as file:
        logged = [float(row["val/bleu"]) for row in csv.DictReader(file) if row.get("val/bleu")]
    assert len(logged) == 2 and seen == pytest.approx(logged)
