"""seq2seq.kernels.splitmix: torch's int64 ops compute SplitMix64's outputs, bit for bit.

References: the sequential generator written from its definition with Python's unbounded
integers, and the first outputs Vigna's splitmix64.c gives for seed 1234567.
"""

from __future__ import annotations

import pytest
import torch

from seq2seq.kernels.splitmix import GAMMA, as_int64, shift_right, splitmix64

MASK = (1 << 64) - 1


def sequential(seed: int, count: int) -> list[int]:
    """SplitMix64 as its authors wrote it: the state advances by GAMMA, then it is mixed."""
    state, outputs = seed & MASK, []
    for _ in range(count):
        state = (state + GAMMA) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        outputs.append(z ^ (z >> 31))
    return outputs


def unsigned(values: torch.Tensor) -> list[int]:
    return [value & MASK for value in values.tolist()]


def test_the_published_outputs_for_seed_1234567() -> None:
    expected = [6457827717110365317, 3203168211198807973, 9817491932198370423]
    assert sequential(1234567, 3) == expected
    assert unsigned(splitmix64(1234567, 3)) == expected


@pytest.mark.parametrize("seed", [0, 1, 2**63, MASK, -1, 0xD1B54A32D192ED03, -(2**63)])
def test_every_output_is_the_sequential_generators(seed: int) -> None:
    """Seeds with the top bit set and negative ones (taken modulo 2^64) exercise the wrapping
    products and the logical shifts of negative int64s."""
    assert unsigned(splitmix64(seed, 1000)) == sequential(seed, 1000)


def test_shift_right_is_unsigned_and_as_int64_wraps() -> None:
    values = torch.tensor([-1, -(2**63), 2**62 + 5], dtype=torch.int64)
    assert unsigned(shift_right(values, 48)) == [0xFFFF, 0x8000, (2**62 + 5) >> 48]
    assert as_int64(2**63) == -(2**63)
    assert as_int64(MASK) == -1
    assert as_int64(-1) == -1
    assert as_int64(5) == 5
