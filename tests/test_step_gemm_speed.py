"""benchmarks/step_gemm_speed.py: both products are timed on the same inputs and agree."""

from __future__ import annotations

import pytest

from benchmarks import step_gemm_speed
from seq2seq.kernels.library import library, unavailable_reason

pytestmark = pytest.mark.skipif(library() is None, reason=f"no C kernels: {unavailable_reason()}")


def test_a_shape_is_timed_both_ways_and_the_products_agree() -> None:
    row = step_gemm_speed.measure(5, 24, 40)
    assert (row["rows"], row["inner"], row["columns"]) == (5, 24, 40)
    assert row["torch_us"] > 0 and row["panels_us"] > 0
    # The times are rounded to 0.1 µs and the ratio of the unrounded ones to 0.01: at this small
    # shape the rounded times bound it only within their half-steps.
    torch_us, panels_us = row["torch_us"], row["panels_us"]
    lowest = (torch_us - 0.05) / (panels_us + 0.05) - 0.005
    highest = (torch_us + 0.05) / max(panels_us - 0.05, 1e-9) + 0.005
    assert lowest <= row["speedup"] <= highest
    assert row["max_difference"] < 1e-4
