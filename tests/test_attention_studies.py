"""benchmarks/attention_parts.py and attention_memory.py: the speed tables say what was timed,
each setting against its own baseline, and ``--speed-only`` renders from a study's results
without training, or says in one paragraph what is missing."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.attention_memory import COMPARED_WITH
from benchmarks.attention_memory import VARIANTS as MEMORY_VARIANTS
from benchmarks.attention_parts import VARIANTS, render_speed, study_results
from seq2seq.cli import UsageError


def timed(variants: list[str], tokens_per_s: dict[str, float]) -> dict[str, object]:
    """A speed report as ``measure_speed`` writes it, every scoring timed alike."""
    median = {
        f"{scoring}/{variant}": tokens_per_s[variant]
        for scoring in ("additive", "scaled_dot")
        for variant in variants
    }
    return {"repeats": 1, "steps": 10, "median": median}


def test_the_parts_speed_table_divides_by_the_baseline_and_the_kernels_off_run() -> None:
    speeds = dict.fromkeys(VARIANTS, 4000.0) | {"baseline": 8000.0, "baseline, kernels off": 2000.0}
    table = render_speed(timed(list(VARIANTS), speeds))
    assert "| sparsemax | 4,000 | 0.50 | 2.00 | 4,000 | 0.50 | 2.00 |" in table
    assert table.splitlines()[0].count("÷ kernels off") == 2


def test_input_feeding_is_timed_against_the_luong_decoder_without_it() -> None:
    speeds = {"baseline": 8000.0, "coverage": 6000.0, "coverage, λ=1": 6000.0}
    speeds |= {"luong": 10000.0, "luong, input feeding": 7500.0}
    table = render_speed(timed(list(MEMORY_VARIANTS), speeds), list(MEMORY_VARIANTS), COMPARED_WITH)
    assert "| luong, input feeding | 7,500 | 0.75 | 7,500 | 0.75 |" in table
    assert "| coverage | 6,000 | 0.75 |" in table
    assert "kernels off" not in table  # not among the memory study's settings


def test_speed_only_reads_the_results_and_says_what_is_missing(tmp_path: Path) -> None:
    args = argparse.Namespace(out=tmp_path, speed_only=True, runs=None)
    with pytest.raises(UsageError, match=r"results\.json, which does not exist"):
        study_results(args, lambda: pytest.fail("--speed-only trains nothing"))
    (tmp_path / "results.json").write_text('{"runs": []}')
    assert study_results(args, lambda: pytest.fail("--speed-only trains nothing")) == {"runs": []}
    args.speed_only = False
    with pytest.raises(UsageError, match="--runs DIR is needed"):
        study_results(args, lambda: pytest.fail("nothing to train into"))
