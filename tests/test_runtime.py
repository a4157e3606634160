"""The allocator thresholds: set through mallopt on glibc, off on request."""

from __future__ import annotations

import gc
import platform

import pytest
import torch

from seq2seq.training.runtime import freeze_startup_objects, tune_allocator


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_mallopt_takes_effect_on_glibc() -> None:
    assert tune_allocator()
    # Allocation still works, before and after freeing large blocks.
    for _ in range(3):
        assert torch.ones(1_000_000).sum().item() == 1_000_000


def test_environment_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQ2SEQ_MALLOC_TUNING", "0")
    assert not tune_allocator()


def test_freezing_leaves_the_objects_alive_now_out_of_later_collections() -> None:
    tracked = len(gc.get_objects())
    before = gc.get_freeze_count()
    try:
        freeze_startup_objects()
        assert gc.get_freeze_count() >= before + tracked - 100  # some die while counting
        assert len(gc.get_objects()) < tracked / 10  # what a collection would still scan
        garbage: list[object] = []
        garbage.append(garbage)  # a cycle made afterwards is still collected
        del garbage
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
