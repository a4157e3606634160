"""Attention scoring functions behind one interface, sharing one masked softmax.

Shape legend: B batch, Tq queries, Tk keys, Dq/Dk/Dv query/key/value sizes, A attention hidden size.

Every scoring function is an ``nn.Module`` with

    forward(queries (B,Tq,Dq), keys (B,Tk,Dk), values (B,Tk,Dv), valid_lens=None, *,
            projected_keys=None) -> (context (B,Tq,Dv), weights (B,Tq,Tk))

and differs from the others only in ``score``. ``valid_lens`` follows the convention of the
scoring-function chapter this project grew from: ``None`` (no padding), ``(B,)`` (one length per
sequence) or ``(B, Tq)`` (one length per query); key positions ``>= valid_len`` are padding.

The part of a score that does not depend on the query (``W_k k`` for additive attention) is
worth computing once per source batch rather than at every decoder step. ``project_keys(keys)``
returns it; the caller passes it back through ``projected_keys`` (and ``project_values``, the
identity for a scoring function, through ``projected_values``). Modules keep no state between
calls.

``MultiHeadAttention`` wraps any scoring function into multi-head attention (Vaswani et al., 2017)
with the same interface, its weights (B, h, Tq, Tk) one map per head.

Every scoring function divides its scores by a softmax temperature T before the softmax
(``temperature``: a positive number, 1.0 by default, or ``"learnable"``, starting at
``initial_temperature``), so ``weights = softmax(score(q, k) / T)``.

The other parts of an attention are switches too (``AttentionParts``, ``Normalization``):

    weights = normalize(window(score(q, k) / T + b))

the normalizer (``attention.normalizer``: softmax, sparsemax, entmax15, α-entmax or a user's;
``seq2seq.normalizers``), the window (``attention.window``: global, or Luong's local_m / local_p;
``seq2seq.positions``) and a learned bias b per source position (``attention.key_bias``). A model
builds them around its scoring function (``Attention.use_parts``); by default there are none and
the weights are ``masked_softmax``'s, as before they existed.

Coverage (``attention.coverage``; Tu et al., 2016; See et al., 2017) gives the score what the
decoder has attended so far, c_i = Σ_{t'<t} a_{t'i}, passed to ``forward`` as ``coverage``
(B, Tq, Tk): inside the tanh for additive attention, ``w_vᵀ tanh(W_q q + W_k k + w_c c_i)`` (See
et al. eq. 11), and for every other scoring function (a user's included) as a learned scale
added to the logits, ``score(q, k) / T + γ c_i`` (one γ per head in multi-head attention). w_c
and γ start at 0, so a model starts as its coverage-free self and learns how much to use it.

``score`` is the contract: a faster path that computes the same weights another way
(``F.scaled_dot_product_attention`` here, the C kernels in ``seq2seq.kernels``) applies only to a
module built of this package's modules as they are (``own_formula``: no method of them
redefined, ``score``'s helpers and the parts' included), so a subclass that overrides ``score``
trains, validates and decodes on its own formula.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.errors import ConfigError
from seq2seq.normalizers import (
    Entmax,
    Entmax15,
    NormalizerFunction,
    Softmax,
    Sparsemax,
    UserNormalizer,
    build_normalizer,
    softmax,
)
from seq2seq.positions import WINDOWS, KeyBias, LocalWindow, window_module

LEARNABLE = "learnable"


def valid_key_mask(valid_lens: Tensor, num_queries: int, num_keys: int) -> Tensor:
    """Boolean mask (B, Tq, Tk), True where a key is a real token, from (B,) or (B, Tq) lengths."""
    if valid_lens.dim() == 1:
        valid_lens = valid_lens[:, None].expand(-1, num_queries)  # (B,) -> (B, Tq)
    elif valid_lens.dim() != 2:
        raise ValueError(
            f"valid_lens must have shape (B,) or (B, Tq), got {tuple(valid_lens.shape)}; pass one "
            "length per sequence or one per query."
        )
    positions = torch.arange(num_keys, device=valid_lens.device)  # (Tk,)
    return positions[None, None, :] < valid_lens[:, :, None]  # (B, Tq, Tk)


def masked_softmax(scores: Tensor, valid_lens: Tensor | None) -> Tensor:
    """Softmax over the last axis of ``scores`` (B, Tq, Tk) that ignores padded keys.

    Padded keys get weight exactly 0.0, rows with at least one valid key sum to 1, and rows with
    ``valid_len == 0`` are all zeros (never NaN, never uniform). The softmax runs in float32 and
    is cast back, so float16 and bfloat16 inputs behave like float32 ones.
    """
    if valid_lens is None:
        return softmax(scores, None)
    return softmax(scores, valid_key_mask(valid_lens, scores.shape[1], scores.shape[2]))


@dataclass(frozen=True)
class AttentionParts:
    """The parts of an attention besides its scoring function: the ``attention.*`` keys
    ``normalizer``, ``alpha``, ``initial_alpha`` (``seq2seq.normalizers``), ``window``,
    ``window_size`` (``seq2seq.positions``), ``key_bias`` and ``key_bias_positions``. The
    defaults are global softmax attention without a key bias: no parameters, no change."""

    normalizer: str | NormalizerFunction | nn.Module = "softmax"
    alpha: float | str | None = None
    initial_alpha: float | None = None
    window: str = "global"
    window_size: int | None = None
    key_bias: bool = False
    key_bias_positions: int | None = None
    coverage: bool = False

    def __post_init__(self) -> None:
        if self.window not in WINDOWS:
            window_module(self.window, self.window_size, 1)  # its message names the choices
        if not isinstance(self.key_bias, bool):
            raise ConfigError(
                f"attention.key_bias must be true or false, got {self.key_bias!r}: true adds a "
                "learned bias per source position to the logits."
            )
        if not self.key_bias and self.key_bias_positions is not None:
            raise ConfigError(
                f"attention.key_bias_positions={self.key_bias_positions} sizes the key bias, but "
                "attention.key_bias=false has none. Use attention.key_bias=true with it, or leave "
                "attention.key_bias_positions=null."
            )
        if not isinstance(self.coverage, bool):
            raise ConfigError(
                f"attention.coverage must be true or false, got {self.coverage!r}: true gives "
                "the score the attention summed over the steps so far (Tu et al., 2016)."
            )

    def is_default(self) -> bool:
        """Global softmax attention without a key bias: what the attention computed before the
        parts were switches (``Attention.use_parts`` then adds nothing)."""
        return self == AttentionParts()


class Normalization(nn.Module):
    """``normalize(window(logits + b))``: logits (R, Tq, Tk) -> weights (R, Tq, Tk), for
    ``AttentionParts`` other than the default, with the masking contract of ``masked_softmax``.
    R is B, or B · h for multi-head attention (rows b · h + i), whose heads share the window
    (it is computed once per query, from the queries before they are split into heads), the key
    bias and the normalizer."""

    def __init__(self, parts: AttentionParts, query_size: int) -> None:
        super().__init__()
        self.normalizer = build_normalizer(parts.normalizer, parts.alpha, parts.initial_alpha)
        self.window: LocalWindow | None = window_module(parts.window, parts.window_size, query_size)
        self.key_bias: KeyBias | None = None
        if parts.key_bias:
            if parts.key_bias_positions is None:
                raise ConfigError(
                    "attention.key_bias=true needs attention.key_bias_positions, the number of "
                    "source positions that get a bias (the pipeline sets it from "
                    "data.max_src_len); e.g. attention.key_bias_positions=100."
                )
            self.key_bias = KeyBias(parts.key_bias_positions)
        self.description = describe_parts(parts)

    def forward(
        self,
        logits: Tensor,
        queries: Tensor,
        valid_lens: Tensor | None,
        positions: Tensor | None = None,
        heads: int = 1,
    ) -> Tensor:
        """logits (B·h, Tq, Tk), queries (B, Tq, Dq), valid_lens None, (B,) or (B, Tq),
        positions (B, Tq): each query's target step (local-m), -> weights (B·h, Tq, Tk)."""
        weights, factor = self.parts(logits, queries, valid_lens, positions, heads)
        return weights if factor is None else weights * factor.to(weights.dtype)

    def parts(
        self,
        logits: Tensor,
        queries: Tensor,
        valid_lens: Tensor | None,
        positions: Tensor | None = None,
        heads: int = 1,
    ) -> tuple[Tensor, Tensor | None]:
        """``forward`` in its two factors: the normalizer's weights (B·h, Tq, Tk), each row
        summing to 1 over the keys in its window, and local-p's Gaussian (B·h, Tq, Tk) or None."""
        num_queries, num_keys = logits.shape[1:]
        if self.key_bias is not None:
            logits = self.key_bias(logits)  # + b_i
        is_valid = None
        if valid_lens is not None:
            is_valid = valid_key_mask(valid_lens, num_queries, num_keys)  # (B, Tq, Tk)
        factor = None
        if self.window is not None:
            if valid_lens is None or valid_lens.dim() != 1:
                raise ValueError(
                    "a local window is centred within each source sentence: pass valid_lens "
                    "(B,), the source lengths."
                )
            in_window, factor = self.window(queries, valid_lens, positions, num_keys)
            is_valid = in_window if is_valid is None else is_valid & in_window  # (B, Tq, Tk)
        if heads > 1:  # the same mask for every head: row b·h + i is head i of sentence b
            is_valid = None if is_valid is None else is_valid.repeat_interleave(heads, 0)
            factor = None if factor is None else factor.repeat_interleave(heads, 0)
        return self.normalizer(logits, is_valid), factor  # (B·h, Tq, Tk)

    @property
    def alpha(self) -> float | None:
        """The normalizer's α (1 softmax, 2 sparsemax, ...), None for a user's normalizer."""
        alpha = getattr(self.normalizer, "alpha", None)
        if isinstance(alpha, Tensor):
            return float(alpha.detach())
        return None if alpha is None else float(alpha)

    def extra_repr(self) -> str:
        return self.description


def describe_parts(parts: AttentionParts) -> str:
    """The parts that differ from the default, as the config keys that set them."""
    shown = []
    if parts.normalizer != "softmax":
        name = parts.normalizer if isinstance(parts.normalizer, str) else "your own"
        shown.append(f"attention.normalizer={name}")
    if parts.window != "global":
        shown.append(f"attention.window={parts.window}")
    if parts.key_bias:
        shown.append("attention.key_bias=true")
    if parts.coverage:
        shown.append("attention.coverage=true")
    return ", ".join(shown)


class Attention(nn.Module):
    """Base class: subclasses define ``score`` and, if useful, ``project_keys``.

    ``needs_equal_sizes`` tells the model that keys must have the query size (dot products), so it
    projects encoder outputs to the decoder size once per batch when they differ.

    ``temperature`` divides the scores before the softmax: a fixed positive number, or
    ``"learnable"`` (a parameter that starts at ``initial_temperature``, stored as its logarithm
    so that it stays positive; e.g. 0.1 for scores bounded in [-1, 1], which T = 1 would leave
    nearly uniform). Only the ratio of the score's scale to T is identifiable: multiplying both
    by the same factor gives the same weights.
    """

    needs_equal_sizes: ClassVar[bool] = False

    def __init__(
        self,
        dropout: float = 0.0,
        temperature: float | str = 1.0,
        initial_temperature: float = 1.0,
    ) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        # The parts besides the score (``use_parts``); None: masked softmax over every key.
        self.normalization: Normalization | None = None
        # w_c (A,) of additive attention, or γ (): how coverage enters the score (``use_parts``).
        self.coverage_weight: nn.Parameter | None = None
        self.log_temperature: nn.Parameter | None = None
        self.fixed_temperature = 1.0
        start = _check_temperature(initial_temperature, "initial_temperature")
        if temperature == LEARNABLE:
            self.log_temperature = nn.Parameter(torch.tensor(math.log(start)))
        else:
            self.fixed_temperature = _check_temperature(temperature, "temperature")
            if start != 1.0:
                raise ConfigError(
                    f"attention.initial_temperature={initial_temperature!r} is where a learned "
                    f"temperature starts, but attention.temperature={temperature!r} is fixed. "
                    f"Use attention.temperature={LEARNABLE} attention.initial_temperature="
                    f"{initial_temperature!r}, or set the fixed value with "
                    f"attention.temperature={initial_temperature!r}."
                )

    @property
    def temperature(self) -> Tensor | float:
        """T: a 0-d tensor when learnable (gradients flow into it), else a float."""
        if self.log_temperature is not None:
            return self.log_temperature.exp()
        return self.fixed_temperature

    def extra_repr(self) -> str:
        if self.log_temperature is not None:
            return "temperature=learnable"
        return f"temperature={self.fixed_temperature}"

    def project_keys(self, keys: Tensor) -> Tensor:
        """The query-independent part of the score, computed once per source batch."""
        return keys

    def project_values(self, values: Tensor) -> Tensor:
        """What the weights average, from the values: the values themselves (multi-head
        attention projects them)."""
        return values

    def score(self, queries: Tensor, projected_keys: Tensor) -> Tensor:
        """Raw scores (B, Tq, Tk) from queries (B, Tq, Dq) and ``project_keys(keys)``."""
        raise NotImplementedError

    def logits(self, queries: Tensor, projected_keys: Tensor) -> Tensor:
        """What the softmax sees, (B, Tq, Tk): ``score(q, k) / T``, before masking."""
        return self.score(queries, projected_keys) / self.temperature

    def use_parts(self, parts: AttentionParts, query_size: int) -> Attention:
        """Give this attention the ``parts`` besides its score (``AttentionParts``), built for
        queries of ``query_size``; the default parts add nothing. Returns the attention."""
        self.normalization = None if parts.is_default() else Normalization(parts, query_size)
        if parts.coverage:
            self.coverage_weight = nn.Parameter(torch.zeros(self.coverage_size()))
        return self

    def coverage_size(self) -> tuple[int, ...]:
        """The shape of ``coverage_weight``: () for γ, added to the logits (``covered_logits``)."""
        return ()

    def covered_logits(self, queries: Tensor, projected_keys: Tensor, coverage: Tensor) -> Tensor:
        """The logits (B, Tq, Tk) with the coverage so far, coverage (B, Tq, Tk):
        ``score(q, k) / T + γ c_i``."""
        if self.coverage_weight is None:
            raise ValueError(
                "coverage was passed to an attention built without it: build the model with "
                "attention.coverage=true (AttentionParts(coverage=True))."
            )
        return self.logits(queries, projected_keys) + self.coverage_weight * coverage

    def normalize(
        self,
        logits: Tensor,
        queries: Tensor,
        valid_lens: Tensor | None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """The weights (B, Tq, Tk) from the logits: ``masked_softmax``, or the parts'
        ``Normalization``. queries (B, Tq, Dq) and positions (B, Tq) are what a window reads."""
        if self.normalization is None:
            return masked_softmax(logits, valid_lens)
        return self.normalization(logits, queries, valid_lens, positions)

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Tensor | None = None,
        *,
        projected_keys: Tensor | None = None,
        projected_values: Tensor | None = None,
        positions: Tensor | None = None,
        coverage: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Returns ``context`` (B, Tq, Dv) and the attention ``weights`` (B, Tq, Tk).
        ``positions`` (B, Tq): each query's target step, for a local-m window; ``coverage``
        (B, Tq, Tk): each query's attention so far, for a model with coverage."""
        if projected_keys is None:
            projected_keys = self.project_keys(keys)
        if projected_values is not None:
            values = projected_values
        if coverage is None:
            logits = self.logits(queries, projected_keys)  # (B, Tq, Tk)
        else:
            logits = self.covered_logits(queries, projected_keys, coverage)  # (B, Tq, Tk)
        weights = self.normalize(logits, queries, valid_lens, positions)  # (B, Tq, Tk)
        # Dropout regularises which keys are read; the weights returned are the undropped ones.
        context = torch.bmm(self.dropout(weights), values)  # (B,Tq,Tk) @ (B,Tk,Dv) -> (B,Tq,Dv)
        return context, weights

    def context(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Tensor | None = None,
        *,
        projected_keys: Tensor | None = None,
        projected_values: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """Only the context (B, Tq, Dv), for callers that do not need the weights (training's
        loss): ``forward``'s context. Scoring functions may compute it another way."""
        context, _ = self(
            queries, keys, values, valid_lens, projected_keys=projected_keys,
            projected_values=projected_values, positions=positions,
        )  # fmt: skip
        return context


class AdditiveAttention(Attention):
    """Bahdanau et al. (2015), eq. (6): ``score(q, k) = w_vᵀ tanh(W_q q + W_k k)``.

    Every score lies in ``(-‖w_v‖₁, ‖w_v‖₁)`` because tanh does. Two optional remedies act on the
    pre-activations ``W_q q + W_k k`` (B, Tq, Tk, A): ``bias`` adds a learned bias b inside the
    tanh, ``w_vᵀ tanh(W_q q + W_k k + b)`` (it changes the weights, unlike a bias added to the
    score); ``layer_norm`` normalises them (Ba et al., 2016) so that large inputs do not push tanh
    into saturation, where its gradient vanishes.
    """

    def __init__(
        self,
        query_size: int,
        key_size: int,
        num_hiddens: int,
        dropout: float = 0.0,
        temperature: float | str = 1.0,
        bias: bool = False,
        layer_norm: bool = False,
        initial_temperature: float = 1.0,
    ) -> None:
        super().__init__(dropout, temperature, initial_temperature)
        # The bias lives in W_q: W_q q + b is added to every key's W_k k, i.e. inside the tanh.
        self.W_q = nn.Linear(query_size, num_hiddens, bias=bias)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)
        # LayerNorm acts on each (query, key) pair's sum, so it cannot be folded into
        # project_keys; None keeps the parameters (and checkpoints) of the default unchanged.
        self.layer_norm = nn.LayerNorm(num_hiddens) if layer_norm else None

    def project_keys(self, keys: Tensor) -> Tensor:
        return self.W_k(keys)  # (B, Tk, Dk) -> (B, Tk, A)

    def preactivations(
        self, queries: Tensor, projected_keys: Tensor, coverage: Tensor | None = None
    ) -> Tensor:
        """What enters the tanh, (B, Tq, Tk, A): ``W_q q + W_k k (+ b) (+ w_c c)``, layer-normed
        if asked; coverage (B, Tq, Tk) where the model has it."""
        # Broadcast every query against every key: (B,Tq,1,A) + (B,1,Tk,A) -> (B,Tq,Tk,A).
        summed = self.W_q(queries)[:, :, None, :] + projected_keys[:, None, :, :]
        if coverage is not None:
            assert self.coverage_weight is not None  # covered_logits checked
            summed = summed + coverage[..., None] * self.coverage_weight  # (B,Tq,Tk,1) · (A,)
        return summed if self.layer_norm is None else self.layer_norm(summed)

    def score(self, queries: Tensor, projected_keys: Tensor) -> Tensor:
        features = torch.tanh(self.preactivations(queries, projected_keys))  # (B, Tq, Tk, A)
        return self.w_v(features).squeeze(-1)  # (B, Tq, Tk, 1) -> (B, Tq, Tk)

    def coverage_size(self) -> tuple[int, ...]:
        """w_c (A,) inside the tanh, or, for a subclass with a score of its own, γ ()."""
        return (self.W_q.out_features,) if has_formula_of(self, AdditiveAttention) else ()

    def covered_logits(self, queries: Tensor, projected_keys: Tensor, coverage: Tensor) -> Tensor:
        """See et al. (2017) eq. 11: ``w_vᵀ tanh(W_q q + W_k k + w_c c_i) / T``, (B, Tq, Tk)."""
        if self.coverage_weight is None or self.coverage_weight.dim() == 0:
            return super().covered_logits(queries, projected_keys, coverage)
        features = torch.tanh(self.preactivations(queries, projected_keys, coverage))
        return self.w_v(features).squeeze(-1) / self.temperature  # (B, Tq, Tk)


class DotProductAttention(Attention):
    """Luong et al. (2015) "dot" and Vaswani et al. (2017) eq. (1): q·k, or q·k/√d if scaled.

    It has no parameters (but a learnable temperature). ``query_size`` and ``key_size`` are
    accepted, and unused, so that every scoring function is built by the same call; when they
    differ, the model projects the encoder outputs to the query size as keys (see
    ``needs_equal_sizes``).
    """

    needs_equal_sizes = True

    def __init__(
        self,
        dropout: float = 0.0,
        scaled: bool = True,
        temperature: float | str = 1.0,
        *,
        initial_temperature: float = 1.0,
        query_size: int | None = None,
        key_size: int | None = None,
    ) -> None:
        super().__init__(dropout, temperature, initial_temperature)
        self.scaled = scaled

    def score(self, queries: Tensor, projected_keys: Tensor) -> Tensor:
        _check_equal_sizes(queries.shape[-1], projected_keys.shape[-1])
        # (B,Tq,D) @ (B,D,Tk) -> (B,Tq,Tk)
        scores = torch.bmm(queries, projected_keys.transpose(1, 2))
        if self.scaled:
            scores = scores / math.sqrt(queries.shape[-1])
        return scores

    def context(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Tensor | None = None,
        *,
        projected_keys: Tensor | None = None,
        projected_values: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """The same context through PyTorch's fused ``F.scaled_dot_product_attention`` (flash or
        memory-efficient kernels on a GPU), where no dropout is active on the weights and the
        weights are this class's own softmax over every key."""
        if projected_values is not None:
            values = projected_values
        if (self.training and self.dropout.p > 0) or not scores_as(self, DotProductAttention):
            # Dropout on the weights, a subclass's own score, or other parts than global softmax:
            # the reference path computes it.
            return super().context(
                queries, keys, values, valid_lens, projected_keys=projected_keys,
                positions=positions,
            )  # fmt: skip
        keys = keys if projected_keys is None else projected_keys
        _check_equal_sizes(queries.shape[-1], keys.shape[-1])
        return sdpa_context(
            queries, keys, values, valid_lens, scaled=self.scaled, temperature=self.temperature
        )


class GeneralAttention(Attention):
    """Luong et al. (2015) "general": ``score(q, k) = qᵀ W k``, a learned bilinear form."""

    def __init__(
        self,
        query_size: int,
        key_size: int,
        dropout: float = 0.0,
        temperature: float | str = 1.0,
        initial_temperature: float = 1.0,
    ) -> None:
        super().__init__(dropout, temperature, initial_temperature)
        self.W = nn.Linear(key_size, query_size, bias=False)

    def project_keys(self, keys: Tensor) -> Tensor:
        return self.W(keys)  # (B, Tk, Dk) -> (B, Tk, Dq): W k, computed once per batch

    def score(self, queries: Tensor, projected_keys: Tensor) -> Tensor:
        return torch.bmm(queries, projected_keys.transpose(1, 2))  # (B,Tq,Dq)@(B,Dq,Tk)


# The name this class had before it took the name of its config and paper ("general").
MultiplicativeAttention = GeneralAttention

# The scoring functions this package ships; what ``own_formula`` compares a subclass with.
BUILTIN_SCORING: tuple[type[Attention], ...] = (
    AdditiveAttention,
    DotProductAttention,
    GeneralAttention,
)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al., 2017, section 3.2.2) around any scoring function:
    ``head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)``, the heads concatenated and projected by
    ``W_o``.

    ``W_q``, ``W_k`` and ``W_v`` map queries, keys and values to ``num_hiddens``, which splits into
    ``num_heads`` slices of ``num_hiddens / num_heads``; every head is one slice of each (the
    chapter's single matrix per role, cut into heads, rather than separate per-head matrices:
    the same function, one GEMM). ``scoring`` scores each head's slices and is **shared across
    heads**, as in the d2l design: for dot-product scoring that changes nothing (it has no
    parameters); general scoring learns one ``W`` and additive scoring one ``W_q``, ``W_k`` and
    ``w_v`` of the head's size that every head uses on its own slices (the heads still differ,
    through their slices of ``W_q``, ``W_k``, ``W_v``). Build ``scoring`` with
    ``query_size = key_size = num_hiddens / num_heads``.

    The block owns the masked softmax (or the parts' ``Normalization``, ``use_parts``), the
    dropout on the weights (``dropout``, as ``nn.MultiheadAttention``'s) and the weighted sum,
    once for all heads: the scoring function only scores (``Attention.logits``: its temperature
    applies, its own dropout and parts do not).

    Shape legend: B batch, Tq queries, Tk keys, h heads, d = num_hiddens / h, D = num_hiddens.
    """

    def __init__(
        self,
        scoring: Attention,
        num_heads: int,
        query_size: int,
        key_size: int,
        value_size: int,
        num_hiddens: int,
        bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        head_size(num_hiddens, num_heads, f"the attention's size {num_hiddens}")
        self.scoring = scoring
        self.num_heads = num_heads
        self.W_q = nn.Linear(query_size, num_hiddens, bias=bias)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=bias)
        self.W_v = nn.Linear(value_size, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.normalization: Normalization | None = None  # ``use_parts``; None: masked softmax
        self.coverage_weight: nn.Parameter | None = None  # γ (h,): ``use_parts``

    def use_parts(self, parts: AttentionParts, query_size: int) -> MultiHeadAttention:
        """``Attention.use_parts`` for every head at once: one normalizer, window and key bias
        shared by the heads (the window read from the queries before their projection), and with
        coverage, one γ per head added to its logits (whatever the scoring function)."""
        self.normalization = None if parts.is_default() else Normalization(parts, query_size)
        if parts.coverage:
            self.coverage_weight = nn.Parameter(torch.zeros(self.num_heads))
        return self

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B·h, T, d): head i of sentence b is row b·h + i."""
        batch, steps, size = x.shape
        x = x.reshape(batch, steps, self.num_heads, size // self.num_heads)  # (B, T, h, d)
        return x.transpose(1, 2).reshape(batch * self.num_heads, steps, -1)  # (B·h, T, d)

    def merge_heads(self, x: Tensor) -> Tensor:
        """(B·h, T, d) -> (B, T, D): the heads concatenated."""
        rows, steps, size = x.shape
        x = x.reshape(rows // self.num_heads, self.num_heads, steps, size)  # (B, h, T, d)
        return x.transpose(1, 2).reshape(rows // self.num_heads, steps, -1)  # (B, T, D)

    def head_lens(self, valid_lens: Tensor | None) -> Tensor | None:
        """(B,) or (B, Tq) lengths -> the same for every head: (B·h,) or (B·h, Tq)."""
        return None if valid_lens is None else valid_lens.repeat_interleave(self.num_heads, 0)

    def project_keys(self, keys: Tensor) -> Tensor:
        """The heads' keys, scored part included: ``scoring.project_keys`` of each head's slice of
        ``W_k k``, (B·h, Tk, ·). Computed once per source batch when the keys do not change."""
        return self.scoring.project_keys(self.split_heads(self.W_k(keys)))

    def project_values(self, values: Tensor) -> Tensor:
        """The heads' values, ``W_v v`` split, (B·h, Tk, d): once per source batch, too."""
        return self.split_heads(self.W_v(values))

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Tensor | None = None,
        *,
        projected_keys: Tensor | None = None,
        projected_values: Tensor | None = None,
        need_weights: bool = True,
        positions: Tensor | None = None,
        coverage: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """queries (B, Tq, Dq), keys (B, Tk, Dk), values (B, Tk, Dv), valid_lens (B,) or (B, Tq)
        -> context (B, Tq, D), weights (B, h, Tq, Tk) (None without ``need_weights``).

        ``projected_keys`` / ``projected_values`` (``project_keys`` / ``project_values``) stand
        in for the keys' and values' projections where they were computed once before;
        ``positions`` (B, Tq) are the queries' target steps (a local-m window); ``coverage``
        (B, Tq, Tk) each query's attention so far (heads averaged), for a model with coverage."""
        if projected_keys is None:
            projected_keys = self.project_keys(keys)
        if projected_values is None:
            projected_values = self.project_values(values)
        head_queries = self.split_heads(self.W_q(queries))  # (B·h, Tq, d)
        lens = self.head_lens(valid_lens)
        if not need_weights and coverage is None and self.sdpa_applies():
            assert isinstance(self.scoring, DotProductAttention)  # sdpa_applies checked
            context = sdpa_context(
                head_queries, projected_keys, projected_values, lens,
                scaled=self.scoring.scaled, temperature=self.scoring.temperature,
            )  # fmt: skip
            return self.W_o(self.merge_heads(context)), None
        logits = self.scoring.logits(head_queries, projected_keys)  # (B·h, Tq, Tk)
        if coverage is not None:
            if self.coverage_weight is None:
                raise ValueError(
                    "coverage was passed to a multi-head attention built without it: build the "
                    "model with attention.coverage=true (AttentionParts(coverage=True))."
                )
            # γ_i c for head i: (1, h, 1, 1) · (B, 1, Tq, Tk) -> (B, h, Tq, Tk) -> (B·h, Tq, Tk)
            scaled = self.coverage_weight[None, :, None, None] * coverage[:, None]
            logits = logits + scaled.flatten(0, 1)
        if self.normalization is None:
            weights = masked_softmax(logits, lens)  # (B·h, Tq, Tk)
        else:
            weights = self.normalization(logits, queries, valid_lens, positions, self.num_heads)
        # (B·h, Tq, Tk) @ (B·h, Tk, d) -> (B·h, Tq, d): every head's context
        context = torch.bmm(self.dropout(weights), projected_values)
        output = self.W_o(self.merge_heads(context))  # (B, Tq, D)
        batch = queries.shape[0]
        return output, weights.view(batch, self.num_heads, *weights.shape[1:])

    def context(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Tensor | None = None,
        *,
        projected_keys: Tensor | None = None,
        projected_values: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """Only the context (B, Tq, D): ``forward`` without the weights."""
        context, _ = self(
            queries, keys, values, valid_lens, projected_keys=projected_keys,
            projected_values=projected_values, need_weights=False, positions=positions,
        )  # fmt: skip
        return context

    def sdpa_applies(self) -> bool:
        """Whether ``F.scaled_dot_product_attention`` computes the context (no weights wanted):
        dot-product scoring, softmax over every key, no active dropout on the weights."""
        dropping = self.training and self.dropout.p > 0
        plain = self.normalization is None
        return scores_as(self.scoring, DotProductAttention) and plain and not dropping


def head_size(size: int, num_heads: object, what: str) -> int:
    """``size // num_heads``, the features each head attends with, once ``num_heads``
    (``model.num_heads``: the one key for the heads of every attention, RNN or Transformer) is
    checked to be a positive integer that divides ``size`` (``what`` names it for the message)."""
    if type(num_heads) is not int or num_heads < 1 or size % num_heads:
        # As the command line and the YAML write them: null, true, false.
        given = "null" if num_heads is None else repr(num_heads)
        given = given.lower() if isinstance(num_heads, bool) else given
        suggested = head_counts_near(size, num_heads)
        raise ConfigError(
            f"model.num_heads={given} must be a positive integer that divides {what} "
            f"(each head attends with an equal slice of it; 1 is the scoring function alone). "
            f"E.g. {' or '.join(f'model.num_heads={n}' for n in suggested)}."
        )
    return size // num_heads


def head_counts_near(size: int, num_heads: object) -> list[int]:
    """What the message of a wrong ``num_heads`` suggests: the numbers of heads above 1 that
    divide ``size`` nearest to it, one below and one above (4, or those nearest to 4, where it
    is no positive integer)."""
    counts = [n for n in range(2, size + 1) if size % n == 0] or [1]
    wanted = num_heads if type(num_heads) is int and num_heads > 0 else 4
    if wanted in counts:
        return [wanted]
    below = [n for n in counts if n < wanted][-1:]
    return below + [n for n in counts if n > wanted][:1]


# How a module is built and shown, not what it computes: a subclass may redefine these and
# keep its parent's function.
BUILDING = frozenset({"__init__", "extra_repr"})
# A class attribute by which a subclass declares that it computes its parent's function another
# way (an accelerated subclass, held to its parent by parity tests): what it redefines is not a
# formula of its own.
SAME_FUNCTION = "computes_its_parents_function"


def redefined(module: nn.Module, builtin: type[nn.Module]) -> list[str]:
    """The methods and properties of ``builtin`` (its own and its bases' up to ``nn.Module``,
    and ``forward``) that ``module``'s class, an instance of ``builtin``, redefines: a fast
    path that computes ``builtin``'s function another way must not stand in for any of them
    (``preactivations`` as much as ``score``). Not how a module is built and shown
    (``BUILDING``, a class's ``__doc__`` and other dunders), and not what a class that declares
    ``SAME_FUNCTION`` redefines."""
    # Classes hash by identity; torch's stubs type Module's __hash__ as an instance's.
    return list(redefined_by(type(module), builtin))  # type: ignore[arg-type]


@functools.cache
def redefined_by(klass: type[nn.Module], builtin: type[nn.Module]) -> tuple[str, ...]:
    """``redefined`` for a class: a function of the two classes alone, asked at every step."""
    own = {"forward", *members_below_module(builtin)}  # type: ignore[arg-type]  # see redefined
    names: list[str] = []
    for below in klass.__mro__:
        if below is builtin:
            break
        if vars(below).get(SAME_FUNCTION, False):
            continue
        names += [
            name for name in vars(below)
            if name in own - BUILDING and not name.startswith("__") and name not in names
        ]  # fmt: skip
    return tuple(names)


# The classes an attention is built of, each of which a fast path computes another way: a
# subclass of one that redefines part of it (``redefined``) keeps the reference path.
FORMULA_MODULES: frozenset[type[nn.Module]] = frozenset({
    *BUILTIN_SCORING, MultiHeadAttention, Normalization, LocalWindow, KeyBias, Softmax,
    Sparsemax, Entmax15, Entmax, nn.Linear, nn.LayerNorm, nn.Dropout, nn.Identity,
})  # fmt: skip


def scores_as(attention: Attention | MultiHeadAttention, builtin: type[Attention]) -> bool:
    """Whether ``attention`` computes the weights of the built-in ``builtin``: an instance of it
    that is built of this package's modules as they are (``own_formula`` is None), with
    softmax over every key (no ``AttentionParts`` of its own). What a fast path that computes
    ``builtin``'s formula another way must check; ``isinstance`` alone would let a subclass with
    its own ``score`` train on its parent's formula."""
    return attention.normalization is None and has_formula_of(attention, builtin)


def has_formula_of(attention: Attention | MultiHeadAttention, builtin: type[Attention]) -> bool:
    """Whether ``attention`` is a ``builtin`` built of this package's modules as they are
    (``own_formula`` is None), whatever its parts."""
    return isinstance(attention, builtin) and own_formula(attention) is None


def own_formula(attention: Attention | MultiHeadAttention) -> str | None:
    """Why no fast path computes ``attention``'s weights, or None when one may: every module
    it is built of (its scoring function, a multi-head block, the parts' normalizer, window and
    key bias, their linear maps and layer norms) is one of ``FORMULA_MODULES`` or a subclass
    of one that redefines none of it (``redefined``); a scoring function is one of
    ``BUILTIN_SCORING``, a normalizer not a user's; none has a function of the user's assigned
    in place of one of its methods (``assigned_methods``) or a hook (``hook_kinds``), which
    only the modules' own calls would run."""
    for module in attention.modules():
        if isinstance(module, Attention) and not isinstance(module, BUILTIN_SCORING):
            return f"{type(module).__name__} is not one of this package's scoring functions"
        if isinstance(module, UserNormalizer):
            named = getattr(module.function, "func", module.function)  # a partial's function
            name = getattr(named, "__name__", type(named).__name__)
            return f"the normalizer {name} (attention.normalizer) is your own"
        builtin = next((c for c in type(module).__mro__ if c in FORMULA_MODULES), None)
        if builtin is None:  # e.g. W_q replaced by a module of the user's (an MLP, a Sequential)
            return f"{type(module).__name__} is a module of your own inside the attention"
        overridden = redefined(module, builtin)
        if overridden:
            methods = ", ".join(f"{builtin.__name__}.{name}" for name in overridden)
            return f"{type(module).__name__} overrides {methods}"
        # Named by the built-in class: the accelerated subclass is not the user's to know.
        assigned = assigned_methods(module)
        if assigned:
            methods = ", ".join(f"{builtin.__name__}.{name}" for name in assigned)
            return f"a function of your own is assigned to {methods} on the instance"
        hooks = hook_kinds(module)
        if hooks:
            return f"{module_path(attention, module, builtin)} has a {hooks[0]} of your own"
    return None


def module_path(attention: nn.Module, module: nn.Module, builtin: type[nn.Module]) -> str:
    """Which of ``attention``'s modules ``module`` is, for a message: its attribute path and
    built-in class (``W_q (Linear) inside the attention``), or the attention itself. Looked up
    only once there is something to say: the usual call never builds the names."""
    name = next(name for name, below in attention.named_modules() if below is module)
    if not name:
        return f"the attention ({builtin.__name__}) itself"
    return f"{name} ({builtin.__name__}) inside the attention"


def assigned_methods(module: nn.Module) -> list[str]:
    """The methods of ``module``'s class that an attribute of the instance shadows (e.g.
    ``attention.score = my_score``): a fast path would call the class's."""
    names = method_names(type(module))  # type: ignore[arg-type]  # as in ``redefined``
    return [] if names.isdisjoint(module.__dict__) else sorted(names.intersection(module.__dict__))


@functools.cache
def method_names(klass: type[nn.Module]) -> frozenset[str]:
    """The functions ``klass`` defines or inherits below ``nn.Module``, ``forward`` included."""
    members = members_below_module(klass)  # type: ignore[arg-type]  # see redefined
    return frozenset(
        {"forward", *(name for name, value in members.items() if inspect.isfunction(value))}
    )


@functools.cache
def members_below_module(klass: type[nn.Module]) -> dict[str, object]:
    """What ``klass`` and its bases up to ``nn.Module`` define, name -> the nearest one's."""
    members: dict[str, object] = {}
    for base in klass.__mro__:
        if base is nn.Module:
            break
        for name, value in vars(base).items():
            members.setdefault(name, value)
    return members


def hook_kinds(module: nn.Module) -> list[str]:
    """The kinds of hook registered on ``module`` itself (``register_forward_hook`` and the
    like), which run only where the module is called: a fast path that computes it another way
    would skip them."""
    if not (
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
    ):
        return []  # the usual case, asked at every step: no dictionary built
    kinds = {
        "forward hook": module._forward_hooks,
        "forward pre-hook": module._forward_pre_hooks,
        "backward hook": module._backward_hooks,
        "backward pre-hook": module._backward_pre_hooks,
    }
    return [kind for kind, hooks in kinds.items() if hooks]


def sdpa_context(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    valid_lens: Tensor | None,
    scaled: bool = True,
    temperature: Tensor | float = 1.0,
) -> Tensor:
    """Dot-product attention context (B, Tq, Dv) through ``F.scaled_dot_product_attention``.

    Same result as ``DotProductAttention`` with the same ``temperature`` (including all-zero rows
    where ``valid_len == 0``), but without the weights.
    """
    scale = 1.0 / math.sqrt(queries.shape[-1]) if scaled else 1.0
    if isinstance(temperature, Tensor):
        # SDPA's scale must be a float; (q / T)·k = q·k / T keeps the gradient into T.
        queries = queries / temperature
    else:
        scale = scale / temperature
    # SDPA's 4-D form, (B, 1, T, ·), one "head": the form the ONNX exporter converts.
    queries, keys, values = queries[:, None], keys[:, None], values[:, None]
    if valid_lens is None:
        return F.scaled_dot_product_attention(queries, keys, values, scale=scale)[:, 0]
    # SDPA's boolean mask means "may attend" (True = valid), the polarity of valid_key_mask.
    has_valid_key = valid_key_mask(valid_lens, queries.shape[2], 1)  # (B, Tq, 1)
    # A row with no valid key makes SDPA return NaN; let it attend to key 0 and zero it afterwards.
    is_valid = valid_key_mask(valid_lens.clamp(min=1), queries.shape[2], keys.shape[2])
    context = F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=is_valid[:, None], scale=scale
    )  # (B, 1, Tq, Dv)
    return context[:, 0] * has_valid_key  # (B, Tq, Dv)


def _check_temperature(temperature: object, key: str) -> float:
    """A temperature (``attention.<key>``) as a float, or a ConfigError that says what is
    allowed."""
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not (math.isfinite(temperature) and temperature > 0)
    ):
        allowed = (
            f"a positive number (the softmax divides the scores by it; 1.0 leaves them "
            f"unchanged) or '{LEARNABLE}' (learned with the model, starting at "
            f"attention.initial_temperature)"
            if key == "temperature"
            else f"a positive number (where attention.temperature={LEARNABLE} starts)"
        )
        raise ConfigError(
            f"attention.{key} must be {allowed}, got {temperature!r}. Set it on the command "
            f"line, e.g. seq2seq train attention.temperature={LEARNABLE} "
            f"attention.initial_temperature=0.5."
        )
    return float(temperature)


def _check_equal_sizes(query_size: int, key_size: int) -> None:
    if query_size != key_size:
        raise ValueError(
            f"dot-product attention needs queries and keys of the same size, got query size "
            f"{query_size} and key size {key_size}. Use attention=general (a learned bilinear map "
            f"between the sizes), or let the model project the encoder outputs to the decoder "
            f"size as keys."
        )
