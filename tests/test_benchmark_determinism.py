"""benchmarks/determinism.py's comparison of two runs' files: what it counts as the same."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks.determinism import against


def fake_run(directory: Path, bleu: str, weight: float, tokens_per_s: str) -> Path:
    (directory / "checkpoints").mkdir(parents=True)
    (directory / "metrics.csv").write_text(
        "step,val/bleu,train/loss,train/tokens_per_s\n"
        f"10,,2.5,{tokens_per_s}\n20,{bleu},2.1,{tokens_per_s}\n"
    )
    torch.save(
        {"state_dict": {"w": torch.tensor([1.0, weight])}}, directory / "checkpoints" / "last.ckpt"
    )
    (directory / "summary.json").write_text(json.dumps({"test_bleu": 90.0}))
    return directory


def test_timing_columns_differ_without_counting_and_a_changed_value_counts(tmp_path: Path) -> None:
    first = fake_run(tmp_path / "a", "50.0", 2.0, "1000")
    same = fake_run(tmp_path / "b", "50.0", 2.0, "1234")  # only the speed differs
    other = fake_run(tmp_path / "c", "52.5", 2.25, "1000")
    assert against(first, same) == {
        "logged values differing": "0 of 5",
        "val BLEU, largest difference": 0.0,
        "weights, largest difference": 0.0,
        "test BLEU": 90.0,
    }
    changed = against(first, other)
    assert changed["logged values differing"] == "1 of 5"
    assert changed["val BLEU, largest difference"] == 2.5
    assert changed["weights, largest difference"] == 0.25
