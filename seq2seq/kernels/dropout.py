"""Dropout whose CPU mask is a counter-based hash instead of ``nn.Dropout``'s serial draws.

On the CPU, ``nn.Dropout`` draws one Bernoulli sample per element from torch's (serial) Mersenne
Twister generator, a serial loop over every element (its share of a step: docs/performance.md).
Here each call draws one 64-bit seed from torch's default generator (so ``seed_everything`` makes
the masks reproducible, like ``nn.Dropout``'s), and element i is dropped when the top 16 bits of
output i of SplitMix64 seeded with it (``seq2seq.kernels.splitmix``) are below ``round(p *
65536)``. Output i is a pure function of (seed, i), so the C pass (``csrc/gru.c``'s
``seq2seq_dropout_mask``, float32 inputs) computes every element at once, vectorised and split over
the threads, an order of magnitude faster than a Mersenne Twister draw per element
(docs/performance.md). Where the library is not built, under ``torch.compile`` or for other dtypes,
torch's int64 ops compute the same bits (``splitmix64``), so the mask never depends on which path
ran.

The drop probability is therefore ``round(p * 65536) / 65536`` (0.1 becomes 0.100006), and kept
elements are scaled by the inverse of that exact keep probability, so the expected output still
equals the input. Off the CPU (CUDA draws Philox numbers in parallel) and in evaluation mode, it
is ``nn.Dropout``.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.kernels import library
from seq2seq.kernels.splitmix import shift_right, splitmix64

LEVELS = 1 << 16  # a decision reads 16 bits
LEVEL_SHIFT = 48  # the top 16 of SplitMix64's 64


class Dropout(nn.Dropout):
    """``nn.Dropout`` (the same attributes, no state of its own) with a cheaper mask on the CPU;
    ``seq2seq.kernels.accelerate`` swaps a model's ``nn.Dropout`` modules to it."""

    computes_its_parents_function = True  # seq2seq.attention.SAME_FUNCTION: own_formula reads it

    def forward(self, inputs: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return inputs
        dropped = round(self.p * LEVELS)  # how many of the 65536 levels mean "drop"
        if inputs.device.type != "cpu" or dropped == LEVELS or inputs.numel() == 0:
            return F.dropout(inputs, self.p, training=True, inplace=self.inplace)
        return inputs * keep_mask(inputs, dropped)


def keep_mask(inputs: Tensor, dropped: int) -> Tensor:
    """Scaled keep mask of ``inputs``'s shape and dtype: 0 where element i's level (the top 16
    bits of SplitMix64's output i) is below ``dropped``, else ``LEVELS / (LEVELS - dropped)``."""
    # One full-range 64-bit draw from the default generator seeds the whole mask.
    seed = int(torch.empty((), dtype=torch.int64).random_(-(2**63), None))
    scale = LEVELS / (LEVELS - dropped)
    kernels = None if inputs.dtype != torch.float32 else mask_kernels()
    if kernels is not None:
        mask = torch.empty(inputs.shape)  # float32, contiguous
        unsigned_seed = seed % (1 << 64)  # the C side takes the bits as uint64
        kernels.seq2seq_dropout_mask(mask.numel(), unsigned_seed, dropped, scale, mask.data_ptr())
        return mask
    levels = shift_right(splitmix64(seed, inputs.numel()), LEVEL_SHIFT).view(inputs.shape)
    return (levels >= dropped).to(inputs.dtype).mul_(scale)


def mask_kernels() -> ctypes.CDLL | None:
    """The compiled library for the mask, where it is built and a ctypes call is allowed (not
    inside a trace or ``torch.compile``, which cannot see into one); None otherwise. Quiet where
    it is missing: the torch path computes the same mask."""
    if torch.jit.is_tracing() or torch.compiler.is_compiling():  # type: ignore[attr-defined]
        return None
    return library.library()
