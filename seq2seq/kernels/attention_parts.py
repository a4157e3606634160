"""One attention step as ``csrc/attention.c`` composes it from the parts' C twins.

The reference computes ``weights = normalize(window(score(q, k) / T + coverage + b))`` and
``context = weights @ v`` (``seq2seq.attention.Attention.forward``). ``StepAttention`` names which
twin computes each part, by the Python name it mirrors: the score (``additive_score`` for
``AdditiveAttention.score``, ``product_score`` for ``DotProductAttention.score`` and
``GeneralAttention.score``), coverage (``additive_coverage``, ``coverage``), the key bias
(``key_bias`` for ``KeyBias.forward``), the window (``global_window``, ``local_window``), the
normalizer (``softmax``, ``sparsemax``, ``entmax15``, ``entmax_bisect``; ``entmax_backward`` for
the backward pass of each, ``entmax_alpha_backward`` for a learned α) and the context.
``forward`` and ``backward`` run one decoder step's rows through them; ``step_attention`` reads
a built attention module and says whether the parts cover it. ``attend`` is one call of the
attention for any rows (a decoding step's, or all the target steps of a Luong decoder at once),
with its gradient (``PartsAttention``).

Shape legend: R rows (queries) of the step, B sentences, S source length, A additive attention
size, D query size of product scoring, V value size (the memory's M).
"""

from __future__ import annotations

import ctypes
import functools
import logging
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from seq2seq.attention import (
    AdditiveAttention,
    Attention,
    DotProductAttention,
    GeneralAttention,
    MultiHeadAttention,
    Normalization,
    own_formula,
)
from seq2seq.kernels.library import library
from seq2seq.normalizers import BISECTION_ITERATIONS, Entmax, Entmax15, Softmax, Sparsemax

# The kernels' one logger (``seq2seq.kernels``), whichever of its modules speaks.
log = logging.getLogger("seq2seq.kernels")

# The normalizer modules with a C twin -> the twin's name (``seq2seq_NAME``) and α, which picks
# the Jacobian of the one backward pass (``entmax_backward``).
NORMALIZER_TWINS: dict[type, tuple[str, float]] = {
    Softmax: ("softmax", 1.0),
    Entmax15: ("entmax15", 1.5),
    Sparsemax: ("sparsemax", 2.0),
}


@dataclass
class AttentionSource:
    """What a step's attention reads besides its queries, contiguous: keys (B, S, A or D) (the
    projected keys), memory (B, S, V), src_lens (B,) int64, and the parts' parameters: w_v (A,)
    (additive scoring), the key bias b (P,), a learned α (0-d), the coverage weight (w_c (A,)
    inside an additive score, γ (0-d) on the logits of any other) and a learned temperature T
    (0-d), or None."""

    keys: Tensor
    memory: Tensor
    src_lens: Tensor
    score_weight: Tensor | None = None
    key_bias: Tensor | None = None
    alpha: Tensor | None = None
    coverage_weight: Tensor | None = None
    temperature: Tensor | None = None

    @staticmethod
    def of(
        keys: Tensor,
        memory: Tensor,
        src_lens: Tensor,
        score_weight: Tensor | None,
        key_bias: Tensor | None,
        alpha: Tensor | None = None,
        coverage_weight: Tensor | None = None,
        temperature: Tensor | None = None,
    ) -> AttentionSource:
        """The tensors, made contiguous (and the lengths int64) once per batch."""
        return AttentionSource(
            keys.contiguous(),
            memory.contiguous(),
            src_lens.to(torch.int64).contiguous(),
            None if score_weight is None else score_weight.contiguous(),
            None if key_bias is None else key_bias.contiguous(),
            alpha,
            None if coverage_weight is None else coverage_weight.detach().contiguous(),
            temperature,
        )


@dataclass
class AttentionGrads:
    """Where the backward passes add their gradients, zeros to start: keys and memory as the
    source's, w_v's per row (R, A), a learned α's per row (R,), the coverage weight's per
    row (R, A) or (R,) and a learned temperature's per row (R,), as
    ``seq2seq_temperature_backward`` leaves it (summed by the caller after all steps), the key
    bias's (P,)."""

    d_keys: Tensor
    d_memory: Tensor
    d_score_weight: Tensor | None
    d_key_bias: Tensor | None
    d_alpha: Tensor | None = None
    d_coverage_weight: Tensor | None = None
    d_temperature: Tensor | None = None

    @staticmethod
    def zeros(source: AttentionSource, rows: int) -> AttentionGrads:
        score_weight, key_bias = source.score_weight, source.key_bias
        return AttentionGrads(
            torch.zeros_like(source.keys),
            torch.zeros_like(source.memory),
            None if score_weight is None else score_weight.new_zeros(rows, score_weight.numel()),
            None if key_bias is None else torch.zeros_like(key_bias),
            None if source.alpha is None else source.keys.new_zeros(rows),
            None if (w := source.coverage_weight) is None else w.new_zeros(rows, *w.shape),
            None if source.temperature is None else source.keys.new_zeros(rows),
        )


@dataclass(frozen=True)
class StepAttention:
    """Which C twins compute an attention: ``score`` is ``"additive"`` (q = W_q s + b, keys
    W_k h, w_v) or ``"product"`` (q = s, keys the projected keys), each times ``scale`` (1 / T;
    a product's 1 / √D too when scaled); ``key_bias`` whether b_s is added (``KeyBias``);
    ``layer_norm_eps`` the eps of an additive score's layer norm (its source's ``score_weight`` is
    then [w_v; γ; β], (3, A)), or None; ``normalizer`` a key of ``NORMALIZER_TWINS``' names with
    its ``alpha``; ``scale`` read from a
    learned temperature at this call where ``learned_temperature``; ``coverage``
    ``"additive"`` (w_c c_s inside the tanh), ``"logits"`` (γ c_s added) or ``""``; ``heads``
    the heads of a ``MultiHeadAttention`` (1: a scoring function alone), each of which the
    twins score as a sentence of its own (row r's head i reads sentence r·h + i of keys and
    values split into heads)."""

    score: str
    scale: float
    normalizer: str = "softmax"
    alpha: float = 1.0
    key_bias: bool = False
    window: str = "global"
    window_size: int = 0
    learned_alpha: bool = False
    coverage: str = ""
    learned_temperature: bool = False
    layer_norm_eps: float | None = None
    heads: int = 1

    @property
    def projects_queries(self) -> bool:
        """Whether the query is W_q s + b (additive), not the state itself."""
        return self.score == "additive"

    @property
    def saves_scores(self) -> bool:
        """Whether the additive score's forward pass keeps tanh(x) of every (row, key) pair
        (and a layer norm's features) for its backward pass: with coverage inside the tanh,
        whose keys are per row. Otherwise the backward pass recomputes them from the queries
        and keys: a tanh per element instead of writing and reading rows·S·A floats
        (docs/performance.md)."""
        return self.projects_queries and self.coverage == "additive"

    def layer_norm_buffers(
        self, rows: int, keys: int, size: int, like: Tensor
    ) -> tuple[Tensor, Tensor] | None:
        """Where an additive score's layer norm keeps, for ``rows`` rows, what its backward
        reads: the normalized features (rows, S, A) and 1 / σ (rows, S); None without one, or
        where the backward pass recomputes them (``saves_scores``)."""
        if self.layer_norm_eps is None or not self.saves_scores:
            return None
        return like.new_empty(rows, keys, size), like.new_empty(rows, keys)

    @property
    def needs_centres(self) -> bool:
        """Whether each row's predicted centre p_t is needed (local-p, ``LocalWindow.centres``)."""
        return self.window == "local_p"

    @property
    def needs_positions(self) -> bool:
        """Whether each row's target step t is needed (local-m's centre p_t = t)."""
        return self.window == "local_m"

    def spans(
        self,
        kernels: ctypes.CDLL,
        rows: int,
        group: int,
        source: AttentionSource,
        positions: Tensor | None = None,
        centres: Tensor | None = None,
    ) -> Tensor:
        """The keys each row may read, [first, end) (rows, 2) int64: its sentence's real keys
        (``seq2seq_global_window``), or those in a local window (``seq2seq_local_window``)
        around local-m's p_t = min(t, S_b - 1), t the row's ``positions`` (rows,), or around
        local-p's predicted ``centres`` (rows,) (``LocalWindow.centres``)."""
        spans = source.src_lens.new_empty(rows, 2)
        length = source.keys.shape[1]
        lengths = source.src_lens.data_ptr()
        if self.window == "global":
            kernels.seq2seq_global_window(rows, group, length, lengths, spans.data_ptr())
            return spans
        if centres is None:  # local-m
            assert positions is not None  # needs_positions
            last = (source.src_lens - 1).clamp(min=0)  # (B,): S_b - 1
            if group > 1:
                last = last.repeat_interleave(group)  # (R,): row r's sentence r / group
            centres = torch.minimum(positions, last[:rows]).to(torch.float32)  # (R,)
        centres = centres.detach().contiguous()
        kernels.seq2seq_local_window(
            rows, group, length, self.window_size, lengths, centres.data_ptr(), spans.data_ptr()
        )  # fmt: skip
        return spans

    def forward(
        self,
        kernels: ctypes.CDLL,
        rows: int,
        group: int,
        queries: int,
        source: AttentionSource,
        spans: int,
        saved_scores: int | None,
        logits: Tensor,
        weights: int,
        weights_stride: int,
        context: int,
        context_stride: int,
        coverage: Tensor | None = None,
        saved_logits: Tensor | None = None,
        centres: Tensor | None = None,
        normalized: Tensor | None = None,
        saved_norm: tuple[Tensor, Tensor] | None = None,
    ) -> None:
        """Step rows: ``queries`` (R, A or D) -> logits (R, S) -> weights (R, S) -> context
        (R, V), the arrays given by address where they are rows of a larger tensor; ``group``
        rows per sentence, row r reading the keys of ``spans`` (R, 2) (``spans()``).
        ``saved_scores`` (R, S, A) receives what the additive score's backward reads, or is
        None; ``coverage`` (R, S) is what each row attended so far (a model with coverage);
        ``saved_logits`` (R, S) receives the score's logits, what a learned temperature's
        gradient reads, or is None; ``centres`` (R,) are local-p's p_t, and ``normalized``
        (R, S) receives the normalizer's weights before its Gaussian, or is None;
        ``saved_norm`` the rows of ``layer_norm_buffers`` (with ``saved_scores``), or None."""
        _, length, size = source.keys.shape
        if self.score == "additive":
            assert source.score_weight is not None  # an additive StepAttention has w_v
            keys, key_group = source.keys, group
            if self.coverage == "additive":  # the keys k_s + c_s w_c, per row
                assert coverage is not None and source.coverage_weight is not None
                keys, key_group = keys.new_empty(rows, length, size), 1
                kernels.seq2seq_additive_coverage(
                    rows, group, length, size, spans, source.keys.data_ptr(),
                    coverage.data_ptr(), source.coverage_weight.data_ptr(), keys.data_ptr(),
                )  # fmt: skip
            if self.layer_norm_eps is None:
                kernels.seq2seq_additive_score(
                    rows, key_group, length, size, self.scale, queries, keys.data_ptr(),
                    source.score_weight.data_ptr(), spans, saved_scores, logits.data_ptr(),
                )  # fmt: skip
            else:
                normed, rstd = (None, None) if saved_norm is None else saved_norm
                kernels.seq2seq_additive_layer_norm_score(
                    rows, key_group, length, size, self.scale, self.layer_norm_eps, queries,
                    keys.data_ptr(), source.score_weight.data_ptr(), spans, saved_scores,
                    None if normed is None else normed.data_ptr(),
                    None if rstd is None else rstd.data_ptr(), logits.data_ptr(),
                )  # fmt: skip
        else:
            kernels.seq2seq_product_score(
                rows, group, length, size, self.scale, queries, source.keys.data_ptr(), spans,
                logits.data_ptr(),
            )  # fmt: skip
        if saved_logits is not None:
            saved_logits.copy_(logits[:rows])
        if self.coverage == "logits":
            assert coverage is not None and source.coverage_weight is not None
            kernels.seq2seq_coverage(
                rows, length, spans, float(source.coverage_weight), coverage.data_ptr(),
                logits.data_ptr(),
            )  # fmt: skip
        if source.key_bias is not None:
            kernels.seq2seq_key_bias(
                rows, length, source.key_bias.numel(), source.key_bias.data_ptr(), spans,
                logits.data_ptr(),
            )  # fmt: skip
        if self.normalizer == "entmax_bisect":
            kernels.seq2seq_entmax_bisect(
                rows, length, spans, self.alpha, BISECTION_ITERATIONS, logits.data_ptr(),
                weights, weights_stride,
            )  # fmt: skip
        else:
            normalize = getattr(kernels, f"seq2seq_{self.normalizer}")
            normalize(rows, length, spans, logits.data_ptr(), weights, weights_stride)
        if self.needs_centres:
            assert centres is not None
            kernels.seq2seq_local_p_gaussian(
                rows, length, self.window_size, spans, centres.data_ptr(), weights,
                weights_stride, None if normalized is None else normalized.data_ptr(),
            )  # fmt: skip
        kernels.seq2seq_attention_context(
            rows, group, length, source.memory.shape[2], weights, weights_stride, spans,
            source.memory.data_ptr(), context, context_stride,
        )  # fmt: skip

    def backward(
        self,
        kernels: ctypes.CDLL,
        rows: int,
        queries: int,
        source: AttentionSource,
        spans: int,
        saved_scores: int | None,
        weights: int,
        weights_stride: int,
        d_context: int,
        d_context_stride: int,
        d_weights_out: tuple[int, int] | None,
        scratch: tuple[Tensor, Tensor],
        d_queries: int,
        grads: AttentionGrads,
        coverage: Tensor | None = None,
        d_coverage: Tensor | None = None,
        group: int = 1,
        saved_logits: Tensor | None = None,
        local_p: tuple[Tensor, Tensor, Tensor] | None = None,
        saved_norm: tuple[Tensor, Tensor] | None = None,
    ) -> None:
        """The parts' backward passes in reverse, for the rows of ``forward``, ``group`` of them
        per sentence: from d_context (R, V), and the weights' own gradient where a loss reads
        them (``d_weights_out``: its address and row stride, or None), write d_queries (R, A or
        D) and add into ``grads``. ``scratch`` is two (R', S) buffers, R' >= R, for the weights'
        and the logits' gradients; ``spans`` and ``coverage`` the forward pass's, whose gradient
        is written to ``d_coverage`` (R, S), and ``saved_logits`` what it saved for a learned
        temperature. ``local_p`` is local-p's centres (R,), the weights before the Gaussian
        (R, S) that forward saved, and where the centres' gradient is added (R,);
        ``saved_norm`` what forward saved of a layer norm."""
        _, length, size = source.keys.shape
        d_weights, d_logits = scratch
        kernels.seq2seq_attention_context_backward(
            rows, group, length, source.memory.shape[2], weights, weights_stride, spans,
            source.memory.data_ptr(), d_context, d_context_stride,
            *(d_weights_out or (None, 0)), d_weights.data_ptr(), grads.d_memory.data_ptr(),
        )  # fmt: skip
        if local_p is not None:  # d_weights becomes the normalizer's weights' gradient
            centres, normalized, d_centres = local_p
            kernels.seq2seq_local_p_gaussian_backward(
                rows, length, self.window_size, spans, centres.data_ptr(), normalized.data_ptr(),
                d_weights.data_ptr(), d_centres.data_ptr(),
            )  # fmt: skip
            weights, weights_stride = normalized.data_ptr(), length  # what the normalizer wrote
        kernels.seq2seq_entmax_backward(
            rows, length, self.alpha, spans, weights, weights_stride, d_weights.data_ptr(),
            d_logits.data_ptr(),
        )  # fmt: skip
        if grads.d_alpha is not None:
            kernels.seq2seq_entmax_alpha_backward(
                rows, length, self.alpha, spans, weights, weights_stride, d_weights.data_ptr(),
                grads.d_alpha.data_ptr(),
            )  # fmt: skip
        if grads.d_temperature is not None:
            assert saved_logits is not None  # forward saved them
            kernels.seq2seq_temperature_backward(
                rows, length, spans, saved_logits.data_ptr(), d_logits.data_ptr(),
                grads.d_temperature.data_ptr(),
            )  # fmt: skip
        if source.key_bias is not None:
            assert grads.d_key_bias is not None
            kernels.seq2seq_key_bias_backward(
                rows, length, source.key_bias.numel(), spans, d_logits.data_ptr(),
                grads.d_key_bias.data_ptr(),
            )  # fmt: skip
        covering: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
        if self.coverage:
            w, d_w = source.coverage_weight, grads.d_coverage_weight
            assert coverage is not None and d_coverage is not None
            assert w is not None and d_w is not None
            covering = (coverage, d_coverage, w, d_w)
        if self.coverage == "logits" and covering is not None:
            coverage, d_coverage, w, d_w = covering
            kernels.seq2seq_coverage_backward(
                rows, length, spans, float(w), coverage.data_ptr(), d_logits.data_ptr(),
                d_coverage.data_ptr(), d_w.data_ptr(),
            )  # fmt: skip
        if self.score == "additive":
            assert source.score_weight is not None and grads.d_score_weight is not None
            # With coverage the score read per-row keys k_s + c_s w_c (group 1): their gradient
            # goes through the coverage term into the keys'.
            additive_covering = covering if self.coverage == "additive" else None
            d_keys, key_group = grads.d_keys, group
            if additive_covering is not None:
                d_keys, key_group = torch.zeros(rows, length, size), 1
            if self.layer_norm_eps is None:
                kernels.seq2seq_additive_score_backward(
                    rows, key_group, length, size, self.scale, saved_scores, queries,
                    source.keys.data_ptr(), source.score_weight.data_ptr(), spans,
                    d_logits.data_ptr(), d_queries, d_keys.data_ptr(),
                    grads.d_score_weight.data_ptr(),
                )  # fmt: skip
            else:
                normed, rstd = (None, None) if saved_norm is None else saved_norm
                kernels.seq2seq_additive_layer_norm_score_backward(
                    rows, key_group, length, size, self.scale, self.layer_norm_eps,
                    saved_scores, None if normed is None else normed.data_ptr(),
                    None if rstd is None else rstd.data_ptr(), queries, source.keys.data_ptr(),
                    source.score_weight.data_ptr(), spans, d_logits.data_ptr(), d_queries,
                    d_keys.data_ptr(), grads.d_score_weight.data_ptr(),
                )  # fmt: skip
            if additive_covering is not None:
                coverage, d_coverage, w, d_w = additive_covering
                kernels.seq2seq_additive_coverage_backward(
                    rows, group, length, size, spans, coverage.data_ptr(), w.data_ptr(),
                    d_keys.data_ptr(), grads.d_keys.data_ptr(), d_coverage.data_ptr(),
                    d_w.data_ptr(),
                )  # fmt: skip
        else:
            kernels.seq2seq_product_score_backward(
                rows, group, length, size, self.scale, queries, source.keys.data_ptr(), spans,
                d_logits.data_ptr(), d_queries, grads.d_keys.data_ptr(),
            )  # fmt: skip


def step_attention(
    attention: Attention | MultiHeadAttention, query_size: int
) -> StepAttention | None:
    """The C parts that compute ``attention`` for queries of ``query_size``, or None where one
    of its parts has no twin yet (it then runs on the reference path): a built-in score at a
    fixed or learned temperature (additive with or without its bias and layer norm), with or
    without coverage, a normalizer of ``NORMALIZER_TWINS`` or α-entmax (fixed or learned α),
    with or without the key bias, and a global, local-m or local-p window; with several heads
    (``MultiHeadAttention``), its scoring function's parts with ``heads`` set, each head scored
    as a sentence of its own (``heads_attention``)."""
    reason = own_formula(attention)  # a module of the user's own anywhere in it, or a hook
    if reason is not None:
        say_own_formula(reason)  # it may have come after the model was built and accelerated
        return None
    if isinstance(attention, MultiHeadAttention):
        return heads_attention(attention)
    return builtin_parts(attention, query_size)


def builtin_parts(attention: Attention, query_size: int) -> StepAttention | None:
    """``step_attention`` of an attention that ``own_formula`` found built of this package's
    modules alone (a multi-head block's scoring function: the block's check covered it, and a
    decoding step asks at every step)."""
    chosen = part_choices(attention.normalization)
    if chosen is None:
        return None
    coverage_weight = attention.coverage_weight
    if coverage_weight is not None:  # w_c (A,) inside an additive score, else γ on the logits
        chosen["coverage"] = "additive" if coverage_weight.dim() == 1 else "logits"
    temperature = attention.temperature  # T, read now where it is learned
    scale = 1.0 / float(temperature.detach() if isinstance(temperature, Tensor) else temperature)
    if attention.log_temperature is not None:
        chosen["learned_temperature"] = True
    if isinstance(attention, AdditiveAttention):
        if attention.layer_norm is not None:
            chosen["layer_norm_eps"] = attention.layer_norm.eps
        return StepAttention("additive", scale, **chosen)
    if isinstance(attention, DotProductAttention):
        if attention.scaled:
            scale /= query_size**0.5
        return StepAttention("product", scale, **chosen)
    if isinstance(attention, GeneralAttention):
        return StepAttention("product", scale, **chosen)
    return None


def say_own_formula(reason: str) -> None:
    """Say once why an attention (``own_formula``'s ``reason``) runs on the reference path."""
    say_once(
        f"model.kernels=auto: {reason}, so the C kernels and PyTorch's fused attention stand "
        "aside for it: it runs on the reference path, the modules' own calls, in training, "
        "validation and decoding."
    )


@functools.cache
def say_once(message: str) -> None:
    """Log ``message`` the first time it comes in this process (a model is built many times)."""
    log.info(message)


def part_choices(parts: Normalization | None) -> dict[str, Any] | None:
    """``StepAttention``'s fields for an attention's normalizer, window and key bias (none
    chosen: the defaults), or None where the normalizer has no C twin."""
    if parts is None:
        return {}
    normalizer, window = parts.normalizer, parts.window
    twin = NORMALIZER_TWINS.get(type(normalizer))
    if isinstance(normalizer, Entmax):  # α-entmax: α read now (a learned one changes)
        alpha = normalizer.alpha
        twin = ("entmax_bisect", float(alpha.detach() if isinstance(alpha, Tensor) else alpha))
    if twin is None:
        return None
    chosen = {"normalizer": twin[0], "alpha": twin[1], "key_bias": parts.key_bias is not None}
    if isinstance(normalizer, Entmax) and normalizer.raw_alpha is not None:
        chosen["learned_alpha"] = True
    if window is not None:
        chosen.update(window=window.kind, window_size=window.size)
    return chosen


def heads_attention(attention: MultiHeadAttention) -> StepAttention | None:
    """``MultiHeadAttention``'s parts: its scoring function's score at the head's size d (which
    only scores: its own parts do not apply), the block's normalizer, window and key bias
    shared by the heads, and its coverage γ_i c added to head i's logits (``"logits"``:
    whatever the scoring, as the block adds it)."""
    scoring = attention.scoring
    size = attention.W_q.out_features // attention.num_heads  # d, what a head's query has
    single = builtin_parts(scoring, size)  # step_attention checked the whole block
    chosen = part_choices(attention.normalization)
    if single is None or chosen is None:
        return None
    coverage = "logits" if attention.coverage_weight is not None else ""
    return replace(single, heads=attention.num_heads, coverage=coverage, **chosen)


class PartsAttention(torch.autograd.Function):
    """queries (R, A or D) (additive scoring's already projected), projected keys (B, S, K),
    memory (B, S, M), src_lens (B,), w_v (1, A) or None, the key bias (P,) or None, a learned
    α (0-d) or None, a learned temperature T (0-d) or None, the coverage weight (w_c (A,) or γ
    (0-d)) or None, the coverage (R, S) or None, local-p's centres p_t (R,) or None, spans
    (R, 2) (``StepAttention.spans``), ``parts`` and ``group``, the rows per sentence (row r
    reads sentence r / group) -> contexts (R, M), weights (R, S), each with its gradient.
    ``library.usable`` must hold for the tensors."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        queries: Tensor,
        projected_keys: Tensor,
        memory: Tensor,
        src_lens: Tensor,
        score_weight: Tensor | None,
        key_bias: Tensor | None,
        alpha: Tensor | None,
        temperature: Tensor | None,
        coverage_weight: Tensor | None,
        coverage: Tensor | None,
        centres: Tensor | None,
        spans: Tensor,
        parts: StepAttention,
        group: int,
    ) -> tuple[Tensor, Tensor]:
        kernels = library()
        assert kernels is not None  # usable() checked it
        rows, (_, keys, key_size) = queries.shape[0], projected_keys.shape
        memory_size = memory.shape[2]
        queries = queries.contiguous()
        coverage = None if coverage is None else coverage.contiguous()
        source = AttentionSource.of(
            projected_keys, memory, src_lens, score_weight, key_bias, alpha, coverage_weight,
            temperature,
        )  # fmt: skip
        needs_grad = any(ctx.needs_input_grad)  # type: ignore[attr-defined]
        # What the additive score's backward reads where it keeps it (``saves_scores``): tanh(x)
        # of every (row, key) pair; and a learned temperature's: the score's logits.
        saved_scores = saved_logits = None
        if needs_grad and parts.saves_scores:
            saved_scores = queries.new_empty(rows, keys, key_size)
        if needs_grad and parts.learned_temperature:
            saved_logits = queries.new_empty(rows, keys)
        saved_norm = parts.layer_norm_buffers(rows, keys, key_size, queries) if needs_grad else None
        # Local-p: the weights before the Gaussian, which the normalizer's backward reads.
        normalized = None
        if centres is not None:
            centres = centres.detach().contiguous()
            normalized = queries.new_empty(rows, keys) if needs_grad else None
        weights = queries.new_empty(rows, keys)
        contexts = queries.new_empty(rows, memory_size)
        parts.forward(
            kernels, rows, group, queries.data_ptr(), source, spans.data_ptr(),
            None if saved_scores is None else saved_scores.data_ptr(),
            queries.new_empty(rows, keys), weights.data_ptr(), keys, contexts.data_ptr(),
            memory_size, coverage, saved_logits, centres, normalized, saved_norm,
        )  # fmt: skip
        if needs_grad:
            saved = [
                queries, source.keys, source.memory, source.src_lens, source.score_weight,
                source.key_bias, alpha, temperature, coverage_weight, coverage, centres, spans,
                saved_scores, saved_logits, normalized, weights,
                *(saved_norm or (None, None)),
            ]  # fmt: skip
            ctx.save_for_backward(*saved)  # None: not these parts'
        ctx.parts, ctx.group = parts, group  # type: ignore[attr-defined]
        return contexts, weights

    @staticmethod
    @once_differentiable
    def backward(
        ctx: FunctionCtx, d_contexts: Tensor | None, d_weights: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        kernels = library()
        assert kernels is not None
        (
            queries, keys, memory, src_lens, score_weight, key_bias, alpha, temperature,
            coverage_weight, coverage, centres, spans, saved_scores, saved_logits, normalized,
            weights, normed, rstd,
        ) = ctx.saved_tensors  # type: ignore[attr-defined]  # fmt: skip
        parts: StepAttention = ctx.parts  # type: ignore[attr-defined]
        source = AttentionSource.of(
            keys, memory, src_lens, score_weight, key_bias, alpha, coverage_weight, temperature
        )
        rows, length = weights.shape
        memory_size = memory.shape[2]
        d_contexts = (
            memory.new_zeros(rows, memory_size) if d_contexts is None else d_contexts.contiguous()
        )
        d_weights_out = None
        if d_weights is not None:  # a loss read the weights: (R, S)
            d_weights = d_weights.contiguous()
            d_weights_out = (d_weights.data_ptr(), length)
        grads = AttentionGrads.zeros(source, rows)  # w_v's per row, summed below
        d_queries = torch.empty_like(queries)
        d_coverage = None if coverage is None else torch.empty_like(coverage)
        local_p = d_centres = None
        if centres is not None:
            d_centres = torch.zeros_like(centres)
            local_p = (centres, normalized, d_centres)
        parts.backward(
            kernels, rows, queries.data_ptr(), source, spans.data_ptr(),
            None if saved_scores is None else saved_scores.data_ptr(), weights.data_ptr(),
            length, d_contexts.data_ptr(), memory_size, d_weights_out,
            (memory.new_empty(rows, length), memory.new_empty(rows, length)),
            d_queries.data_ptr(), grads, coverage, d_coverage,
            ctx.group, saved_logits, local_p,  # type: ignore[attr-defined]
            None if normed is None else (normed, rstd),
        )  # fmt: skip
        d_score_weight, d_alpha, d_weight = (
            grads.d_score_weight,
            grads.d_alpha,
            grads.d_coverage_weight,
        )
        return (
            d_queries,
            grads.d_keys,
            grads.d_memory,
            None,
            None if d_score_weight is None else d_score_weight.sum(0).view_as(score_weight),
            grads.d_key_bias,
            None if d_alpha is None else d_alpha.sum().view_as(alpha),
            temperature_gradient(grads.d_temperature, temperature),
            None if d_weight is None else d_weight.sum(0).view_as(coverage_weight),
            d_coverage,
            d_centres,
            None,
            None,
            None,
        )


def temperature_gradient(per_row: Tensor | None, temperature: Tensor | None) -> Tensor | None:
    """dL/dT from ``seq2seq_temperature_backward``'s rows (R,), each Σ_s de_s e_s: the logits
    e = score / T give dL/dT = -Σ de e / T."""
    if per_row is None or temperature is None:
        return None
    return (-per_row.sum() / temperature.detach()).view_as(temperature)


def attend(
    parts: StepAttention,
    queries: Tensor,
    projected_keys: Tensor,
    memory: Tensor,
    src_lens: Tensor,
    query_weight: Tensor | None,
    query_bias: Tensor | None,
    score_weight: Tensor | None,
    key_bias: Tensor | None = None,
    alpha: Tensor | None = None,
    temperature: Tensor | None = None,
    coverage_weight: Tensor | None = None,
    positions: Tensor | None = None,
    coverage: Tensor | None = None,
    centres: Tensor | None = None,
    live: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The attention of R queries through the C parts, differentiable: queries (R, H),
    projected keys (B, S, K), memory (B, S, M), src_lens (B,) -> contexts (R, M), weights
    (R, S). R is B·G, G consecutive rows per sentence (row r reads sentence r / G): one query
    each (a training or greedy step), K hypotheses each (beam search), or T target steps each
    (a Luong decoder's teacher forcing). W_q and b_q project additive queries (else None: a
    product's query is the state); positions (R,): each row's target step, for a window
    centred on it; coverage (R, S): what each row attended so far, for a model with coverage;
    centres (R,): local-p's predicted p_t (``LocalWindow.centres``), with their gradient.
    ``parts`` holds α's and T's values (a learned one's tensor, ``alpha`` or ``temperature``,
    takes the gradient). live (N,): where the rows are not all real, the indices of those that
    are (a Luong decoder's teacher forcing on the padded (B, T) grid: ``PackedTokens.positions``);
    the others are padding, neither projected nor attended (an empty span: zero weights and
    context, no gradient).
    ``library.usable`` must hold."""
    kernels = library()
    assert kernels is not None  # usable() checked it
    rows, batch = queries.shape[0], projected_keys.shape[0]
    group = rows // batch
    if query_weight is not None:  # (R, H) -> (R, A)
        queries = live_linear(queries, query_weight, query_bias, live)
    source = AttentionSource.of(projected_keys, memory, src_lens, None, None)
    spans = parts.spans(kernels, rows, group, source, positions, centres)
    if live is not None:  # the padding's rows read no key
        kept = spans.index_select(0, live)  # (N, 2)
        spans = spans.zero_().index_copy_(0, live, kept)
    result: tuple[Tensor, Tensor] = PartsAttention.apply(
        queries, source.keys, source.memory, source.src_lens, score_weight, key_bias, alpha,
        temperature, coverage_weight, coverage, centres, spans, parts, group,
    )  # fmt: skip
    return result


def live_linear(rows: Tensor, weight: Tensor, bias: Tensor | None, live: Tensor | None) -> Tensor:
    """``F.linear`` of rows (R, H) -> (R, A), of only the rows ``live`` (N,) names where it is
    given, zeros at the others (the padding ``attend`` skips): a GEMM and its gradient of N
    rows rather than R."""
    if live is None:
        return F.linear(rows, weight, bias)
    projected = F.linear(rows.index_select(0, live), weight, bias)  # (N, A)
    return projected.new_zeros(rows.shape[0], projected.shape[1]).index_copy(0, live, projected)
