"""Dot-product or general attention on the CPU in C: a decoding step's, without autograd, and
teacher forcing's over packed query rows, with its backward pass.

The Luong decoder's decoding step attends with one query per row: the scores (a bmm), the
padding mask (built from the lengths at every step), the softmax and the weighted average (a
second bmm) are half a dozen small ATen kernels, each a few microseconds of fixed cost at B = 64.
Here they are one pass of ``csrc/gru.c`` over the rows (``seq2seq_product_forward``), split over
torch's threads like the GRU's. Dot, scaled dot and general (qᵀWk) scoring all score
``scale · q · k'`` with k' the projected keys (W k for general, the keys themselves otherwise),
which is what ``seq2seq.kernels.modules.product_scale`` reports.

Teacher forcing (``PackedProductAttention``, the Luong decoder's training on the CPU) attends
with the N real target positions of a packed batch (``seq2seq.kernels.packing``): each row scores
its own sentence's keys, so no (B, T, S) grid of padded queries is built, multiplied and
scattered back, and the backward pass is two C passes, over the rows and then over the sentences.

Shape legend: R query rows, N packed rows, B sentences, S source length, D query size, V value
size.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from seq2seq.kernels.library import library


def product_attend(
    queries: Tensor,
    projected_keys: Tensor,
    values: Tensor,
    src_lens: Tensor,
    scale: float,
    sentence_of: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """queries (R, D), projected keys (B, S, D), values (B, S, V), src_lens (B,) -> contexts
    (R, V), weights (R, S): softmax over the valid keys of ``scale · q · k'``. Row r's sentence is
    ``sentence_of[r]`` (R,) where given (packed rows), else R is B, or B·K when K hypotheses of
    each sentence share its source (beam search: row b·K + k is hypothesis k of sentence b).
    ``library.usable`` must hold for the tensors; nothing is differentiable here
    (``PackedProductAttention`` is)."""
    kernels = library()
    assert kernels is not None  # usable() checked it
    rows, (batch, keys, size), value_size = queries.shape[0], projected_keys.shape, values.shape[2]
    queries = queries.contiguous()
    projected_keys, values = projected_keys.contiguous(), values.contiguous()
    src_lens = src_lens.to(torch.int64).contiguous()
    if sentence_of is not None:
        sentence_of = sentence_of.to(torch.int64).contiguous()
    weights = queries.new_empty(rows, keys)
    contexts = queries.new_empty(rows, value_size)
    kernels.seq2seq_product_forward(
        rows, rows // batch, None if sentence_of is None else sentence_of.data_ptr(), keys, size,
        value_size, scale, queries.data_ptr(), projected_keys.data_ptr(), src_lens.data_ptr(),
        values.data_ptr(), weights.data_ptr(), keys, contexts.data_ptr(), value_size,
    )  # fmt: skip
    return contexts, weights


class PackedProductAttention(torch.autograd.Function):
    """queries (N, D) of packed rows, row r of sentence ``sentence_of[r]``, projected keys
    (B, S, D), values (B, S, V), src_lens (B,) -> contexts (N, V): ``product_attend`` of the rows,
    differentiable in the queries, the keys and the values (the same tensor may be both: its two
    gradients add). ``library.usable`` must hold for the tensors."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        queries: Tensor,
        projected_keys: Tensor,
        values: Tensor,
        src_lens: Tensor,
        sentence_of: Tensor,
        scale: float,
    ) -> Tensor:
        # Contiguous here, so that product_attend takes these very tensors and the backward
        # pass reads what the forward pass did.
        queries = queries.contiguous()
        projected_keys, values = projected_keys.contiguous(), values.contiguous()
        src_lens = src_lens.to(torch.int64).contiguous()
        sentence_of = sentence_of.to(torch.int64).contiguous()
        contexts, weights = product_attend(
            queries, projected_keys, values, src_lens, scale, sentence_of
        )  # (N, V), (N, S): the weights kept for the backward pass
        ctx.save_for_backward(queries, projected_keys, values, src_lens, sentence_of, weights)
        ctx.scale = scale  # type: ignore[attr-defined]
        return contexts

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, d_contexts: Tensor) -> tuple[Tensor | None, ...]:
        kernels = library()
        assert kernels is not None
        saved = ctx.saved_tensors  # type: ignore[attr-defined]
        queries, projected_keys, values, src_lens, sentence_of, weights = saved
        rows, (batch, keys, size) = queries.shape[0], projected_keys.shape
        value_size = values.shape[2]
        d_contexts = d_contexts.contiguous()
        # The rows grouped by sentence (stable), and where each sentence's group starts (B + 1,).
        order = torch.argsort(sentence_of, stable=True)
        starts = torch.zeros(batch + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(sentence_of, minlength=batch), 0, out=starts[1:])
        d_scores = queries.new_empty(rows, keys)  # scratch
        d_queries = torch.empty_like(queries)
        d_keys, d_values = torch.empty_like(projected_keys), torch.empty_like(values)
        kernels.seq2seq_product_rows_backward(
            rows, batch, keys, size, value_size, ctx.scale,  # type: ignore[attr-defined]
            queries.data_ptr(), sentence_of.data_ptr(), order.data_ptr(), starts.data_ptr(),
            projected_keys.data_ptr(), src_lens.data_ptr(), values.data_ptr(), weights.data_ptr(),
            d_contexts.data_ptr(), d_scores.data_ptr(), d_queries.data_ptr(), d_keys.data_ptr(),
            d_values.data_ptr(),
        )  # fmt: skip
        return d_queries, d_keys, d_values, None, None, None
