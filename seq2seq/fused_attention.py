"""A decoding step's dot-product or bilinear attention on the CPU in one C pass, without autograd.

The Luong decoder's decoding step attends with one query per row: the scores (a bmm), the
padding mask (built from the lengths at every step), the softmax and the weighted average (a
second bmm) are half a dozen small ATen kernels, each a few microseconds of fixed cost at B = 64.
Here they are one pass of ``csrc/gru.c`` over the rows (``seq2seq_product_forward``), split over
torch's threads like the GRU's. Dot, scaled dot and general ("bilinear") scoring all score
``scale · q · k'`` with k' the projected keys (W k for general, the keys themselves otherwise),
which is what ``Attention.product_scale`` reports.

Shape legend: R query rows, B sentences, S source length, D query size, V value size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seq2seq.fused_rnn import library


def product_attend(
    queries: Tensor, projected_keys: Tensor, values: Tensor, src_lens: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    """queries (R, D), projected keys (B, S, D), values (B, S, V), src_lens (B,) -> contexts
    (R, V), weights (R, S): softmax over the valid keys of ``scale · q · k'``. R is B, or B·K when
    K hypotheses of each sentence share its source (beam search: row b·K + k is hypothesis k of
    sentence b). ``fused_rnn.usable`` must hold for the tensors; nothing is differentiable."""
    kernels = library()
    assert kernels is not None  # usable() checked it
    rows, (batch, keys, size), value_size = queries.shape[0], projected_keys.shape, values.shape[2]
    queries = queries.contiguous()
    projected_keys, values = projected_keys.contiguous(), values.contiguous()
    src_lens = src_lens.to(torch.int64).contiguous()
    weights = queries.new_empty(rows, keys)
    contexts = queries.new_empty(rows, value_size)
    kernels.seq2seq_product_forward(
        rows, rows // batch, keys, size, value_size, scale, queries.data_ptr(),
        projected_keys.data_ptr(), src_lens.data_ptr(), values.data_ptr(), weights.data_ptr(),
        keys, contexts.data_ptr(), value_size,
    )  # fmt: skip
    return contexts, weights
