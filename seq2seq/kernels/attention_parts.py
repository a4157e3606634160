"""One attention step as ``csrc/attention.c`` composes it from the parts' C twins.

The reference computes ``weights = normalize(score(q, k) / T)`` and ``context = weights @ v``
(``seq2seq.attention.Attention.forward``). ``StepAttention`` names which twin computes each
part, by the Python name it mirrors: the score (``additive_score`` for
``AdditiveAttention.score``, ``product_score`` for ``DotProductAttention.score`` and
``GeneralAttention.score``), the normalizer (``softmax``, ``sparsemax``, ``entmax15``, and
``entmax_backward`` for the backward pass of each) and the context. ``forward`` and ``backward``
run one decoder step's rows through them; ``step_attention`` reads a built attention module and
says whether the parts cover it.

Shape legend: R rows (queries) of the step, B sentences, S source length, A additive attention
size, D query size of product scoring, V value size (the memory's M).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from torch import Tensor

from seq2seq.attention import (
    AdditiveAttention,
    Attention,
    DotProductAttention,
    GeneralAttention,
    MultiHeadAttention,
    has_formula_of,
)
from seq2seq.normalizers import Entmax15, Softmax, Sparsemax

# The normalizer modules with a C twin -> the twin's name (``seq2seq_NAME``) and α, which picks
# the Jacobian of the one backward pass (``entmax_backward``).
NORMALIZER_TWINS: dict[type, tuple[str, float]] = {
    Softmax: ("softmax", 1.0),
    Entmax15: ("entmax15", 1.5),
    Sparsemax: ("sparsemax", 2.0),
}


@dataclass(frozen=True)
class StepAttention:
    """Which C twins compute an attention: ``score`` is ``"additive"`` (q = W_q s + b, keys
    W_k h, ``score_weight`` w_v) or ``"product"`` (q = s, keys the projected keys), each times
    ``scale`` (1 / T; a product's 1 / √D too when scaled); ``normalizer`` a key of
    ``NORMALIZER_TWINS``' names with its ``alpha``."""

    score: str
    scale: float
    normalizer: str = "softmax"
    alpha: float = 1.0

    @property
    def projects_queries(self) -> bool:
        """Whether the query is W_q s + b (additive), not the state itself."""
        return self.score == "additive"

    def forward(
        self,
        kernels: ctypes.CDLL,
        rows: int,
        group: int,
        queries: int,
        keys: Tensor,
        score_weight: Tensor | None,
        src_lens: Tensor,
        memory: Tensor,
        saved_scores: int | None,
        logits: Tensor,
        weights: int,
        weights_stride: int,
        context: int,
        context_stride: int,
    ) -> None:
        """Step rows: ``queries`` (R, A or D) -> logits (R, S) -> weights (R, S) -> context
        (R, V), the arrays given by address where they are rows of a larger tensor. keys
        (B, S, A or D), memory (B, S, V) and src_lens (B,) are contiguous; ``group`` rows per
        sentence. ``saved_scores`` (R, S, A) receives what the additive score's backward reads,
        or is None."""
        _, length, size = keys.shape
        if self.score == "additive":
            assert score_weight is not None  # an additive StepAttention has w_v
            kernels.seq2seq_additive_score(
                rows, group, length, size, self.scale, queries, keys.data_ptr(),
                score_weight.data_ptr(), src_lens.data_ptr(), saved_scores, logits.data_ptr(),
            )  # fmt: skip
        else:
            kernels.seq2seq_product_score(
                rows, group, length, size, self.scale, queries, keys.data_ptr(),
                src_lens.data_ptr(), logits.data_ptr(),
            )  # fmt: skip
        normalize = getattr(kernels, f"seq2seq_{self.normalizer}")
        normalize(rows, group, length, src_lens.data_ptr(), logits.data_ptr(), weights,
                  weights_stride)  # fmt: skip
        kernels.seq2seq_attention_context(
            rows, group, length, memory.shape[2], weights, weights_stride, src_lens.data_ptr(),
            memory.data_ptr(), context, context_stride,
        )  # fmt: skip

    def backward(
        self,
        kernels: ctypes.CDLL,
        rows: int,
        queries: int,
        keys: Tensor,
        score_weight: Tensor | None,
        src_lens: Tensor,
        memory: Tensor,
        saved_scores: int | None,
        weights: int,
        weights_stride: int,
        d_context: int,
        d_context_stride: int,
        scratch: tuple[Tensor, Tensor],
        d_queries: int,
        d_keys: Tensor,
        d_memory: Tensor,
        d_score_weight: Tensor | None,
    ) -> None:
        """The parts' backward passes in reverse, for training's rows (row r is sentence r):
        from d_context (R, V) write d_queries (R, A or D) and add into d_keys (B, S, ·),
        d_memory (B, S, V) and d_score_weight (R, A), each row's part of w_v's gradient.
        ``scratch`` is two (R', S) buffers, R' >= R, for the weights' and the logits'
        gradients."""
        _, length, size = keys.shape
        d_weights, d_logits = scratch
        kernels.seq2seq_attention_context_backward(
            rows, length, memory.shape[2], weights, weights_stride, src_lens.data_ptr(),
            memory.data_ptr(), d_context, d_context_stride, d_weights.data_ptr(),
            d_memory.data_ptr(),
        )  # fmt: skip
        kernels.seq2seq_entmax_backward(
            rows, length, self.alpha, src_lens.data_ptr(), weights, weights_stride,
            d_weights.data_ptr(), d_logits.data_ptr(),
        )  # fmt: skip
        if self.score == "additive":
            assert score_weight is not None and d_score_weight is not None
            kernels.seq2seq_additive_score_backward(
                rows, length, size, self.scale, saved_scores, score_weight.data_ptr(),
                src_lens.data_ptr(), d_logits.data_ptr(), d_queries, d_keys.data_ptr(),
                d_score_weight.data_ptr(),
            )  # fmt: skip
        else:
            kernels.seq2seq_product_score_backward(
                rows, length, size, self.scale, queries, keys.data_ptr(), src_lens.data_ptr(),
                d_logits.data_ptr(), d_queries, d_keys.data_ptr(),
            )  # fmt: skip


def step_attention(
    attention: Attention | MultiHeadAttention, query_size: int
) -> StepAttention | None:
    """The C parts that compute ``attention`` for queries of ``query_size``, or None where one
    of its parts has no twin yet (it then runs on the reference path): one head, a built-in
    score at a fixed temperature (additive without layer norm), no coverage, and a normalizer
    of ``NORMALIZER_TWINS`` alone (no window or key bias)."""
    if not isinstance(attention, Attention) or attention.log_temperature is not None:
        return None
    if attention.coverage_weight is not None:
        return None
    normalizer, alpha = "softmax", 1.0
    parts = attention.normalization
    if parts is not None:
        if parts.window is not None or parts.key_bias is not None:
            return None
        twin = NORMALIZER_TWINS.get(type(parts.normalizer))
        if twin is None:
            return None
        normalizer, alpha = twin
    scale = 1.0 / attention.fixed_temperature
    if has_formula_of(attention, AdditiveAttention):
        assert isinstance(attention, AdditiveAttention)
        if attention.layer_norm is not None:
            return None
        return StepAttention("additive", scale, normalizer, alpha)
    if has_formula_of(attention, DotProductAttention):
        assert isinstance(attention, DotProductAttention)
        if attention.scaled:
            scale /= query_size**0.5
        return StepAttention("product", scale, normalizer, alpha)
    if has_formula_of(attention, GeneralAttention):
        return StepAttention("product", scale, normalizer, alpha)
    return None
