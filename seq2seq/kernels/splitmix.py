"""SplitMix64 as a counter-based generator: any of its outputs, computed on its own.

SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", OOPSLA
2014; Vigna's public-domain ``splitmix64.c``) adds ``GAMMA`` to a 64-bit state at every call and
returns a mix of the new state, so output k (from 0) of the generator seeded with ``seed`` is
``mix(seed + (k + 1) * GAMMA)``: a pure function of (seed, k). Every output can then be computed
at once, in any order, on any number of threads, with the same bits as the sequential generator.
It passes BigCrush, and it is what the xoshiro generators' authors use to seed them.

``seq2seq.kernels.dropout`` keeps element i of a tensor when the top 16 bits of output i are at
least its threshold. ``splitmix64`` computes the outputs with torch's int64 ops (whose products
wrap modulo 2^64, as the unsigned arithmetic of the definition does); ``csrc/gru.c``'s
``seq2seq_dropout_mask`` computes the same bits vectorised, and ``seq2seq.kernels.library``
checks the two agree when it loads the library.
"""

from __future__ import annotations

import torch
from torch import Tensor

GAMMA = 0x9E3779B97F4A7C15  # the state's increment: 2^64 / the golden ratio, made odd
MIXERS = ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB))  # z = (z ^ z >> s) * m, twice
FINAL_SHIFT = 31  # then z ^ z >> 31
BITS = 64


def splitmix64(seed: int, count: int) -> Tensor:
    """Outputs 0 to ``count - 1`` of SplitMix64 seeded with ``seed`` (any int, taken modulo
    2^64), as int64 tensors holding the 64-bit patterns, (count,)."""
    state = torch.arange(1, count + 1, dtype=torch.int64)  # k + 1
    state.mul_(as_int64(GAMMA)).add_(as_int64(seed))  # seed + (k + 1) * GAMMA, modulo 2^64
    for shift, multiplier in MIXERS:
        state = (state ^ shift_right(state, shift)).mul_(as_int64(multiplier))
    return state ^ shift_right(state, FINAL_SHIFT)


def shift_right(values: Tensor, shift: int) -> Tensor:
    """The logical (unsigned) right shift of int64 bit patterns: torch's ``>>`` is arithmetic,
    so the copies of the sign bit it shifts in are cleared."""
    return (values >> shift) & ((1 << (BITS - shift)) - 1)


def as_int64(value: int) -> int:
    """The int64 whose bit pattern is ``value`` modulo 2^64 (what torch's int64 ops take)."""
    value %= 1 << BITS
    return value - (1 << BITS) if value >= 1 << (BITS - 1) else value
