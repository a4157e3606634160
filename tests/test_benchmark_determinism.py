"""benchmarks/determinism.py's comparison of two runs' files: what it counts as the same."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks.determinism import against, fingerprint, other_machine


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


def test_another_machines_report_is_compared_by_fingerprint(tmp_path: Path) -> None:
    """A fingerprint holds what --against needs: the same run matches value for value and
    weight for weight, a changed weight or value is counted, an old report gives its BLEU only."""
    first = fingerprint(fake_run(tmp_path / "a", "50.0", 2.0, "1000"))
    other = fingerprint(fake_run(tmp_path / "c", "52.5", 2.25, "1000"))
    report = tmp_path / "other.json"
    report.write_text(json.dumps({"machine": "M", "fingerprints": {"reference": first}}))
    rows = other_machine(report, {"reference": first, "changed": other})
    assert rows[0] == {"variant": "the reference run on M", "test BLEU": 90.0}
    assert rows[1]["logged values differing"] == "0 of 5"
    assert rows[1]["weights identical"] == "1 of 1 tensors"
    assert rows[2]["logged values differing"] == "1 of 5"
    assert rows[2]["val BLEU, largest difference"] == 2.5
    assert rows[2]["weights identical"] == "0 of 1 tensors"
    old = tmp_path / "old.json"
    old.write_text(json.dumps({
        "machine": "M", "rows": [{"variant": "the same command again", "test BLEU": 95.7}],
    }))  # fmt: skip
    assert other_machine(old, {"reference": first})[0]["test BLEU"] == 95.7
