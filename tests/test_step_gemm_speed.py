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
    assert row["speedup"] == pytest.approx(row["torch_us"] / row["panels_us"], abs=0.02)
    assert row["max_difference"] < 1e-4
