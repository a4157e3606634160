"""Attention diagnostics: the statistics that the theory of scoring functions makes claims about,
and a Lightning callback that logs them during training.

Shape legend: B batch, Tq queries, Tk keys, A attention hidden size, T target length, H decoder
hidden size.

Every statistic uses valid positions only: a (query, key) pair counts when the key is a real
source token and the query is the decoder state before a real target token. The callback measures
one fixed set of validation sentences, re-running the model's public pieces (``encode``,
``decode_step``, ``attention.logits``) without gradients, so that no module keeps any state for it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor

from seq2seq.analysis.metrics import attention_totals
from seq2seq.attention import (
    AdditiveAttention,
    Attention,
    MultiHeadAttention,
    Normalization,
    masked_softmax,
    valid_key_mask,
)
from seq2seq.models.model import EncoderDecoder, Seq2Seq
from seq2seq.models.transformer import Transformer

log = logging.getLogger(__name__)

# A tanh unit counts as saturated when |x| > 2: there tanh'(x) = 1 - tanh²(x) < 0.071, so less
# than a fourteenth of the gradient at 0 gets through.
SATURATION_THRESHOLD = 2.0
# The elements of a chunk of the additive score's (B, Tq, Tk, A) grid (``query_chunks``): 1 MB.
CHUNK_ELEMENTS = 1 << 18


@dataclass(frozen=True)
class AttentionStatistics:
    """Statistics over the valid (query, key) pairs of a batch; see ``attention_statistics``."""

    score_mean: float  # mean of the scores the softmax sees, score(q, k) / T
    score_std: float  # their standard deviation, pooled over all valid pairs
    score_row_std: float  # std within each query's row (what the softmax responds to), averaged
    entropy: float  # attention entropy in nats (over a sparse row's support), averaged
    max_weight: float  # largest weight of each query's row, averaged
    # ‖∂weights/∂scores‖_F of the normalizer per query, averaged: 0 when one-hot (softmax's, or
    # α-entmax's; None for a user's normalizer, whose Jacobian is unknown here)
    softmax_jacobian: float | None
    tanh_saturation: float | None  # additive only: fraction of tanh units with |x| > 2
    # share of exact-zero weights among the valid pairs: sparse normalizers and windows
    zero_share: float = 0.0

    def as_metrics(self, prefix: str = "attn/") -> dict[str, float]:
        """Metric names and values for a logger; statistics that do not apply are left out."""
        return {f"{prefix}{name}": v for name, v in asdict(self).items() if v is not None}


def valid_pairs(valid_lens: Tensor | None, query_mask: Tensor | None, shape: torch.Size) -> Tensor:
    """Boolean (B, Tq, Tk): True where both the key (``valid_lens``) and the query are real.

    ``valid_lens`` is None, (B,) or (B, Tq) as in ``masked_softmax``; ``query_mask`` (B, Tq) is
    None when every query is real.
    """
    _, num_queries, num_keys = shape
    if valid_lens is None:
        is_valid = torch.ones(shape, dtype=torch.bool)
    else:
        is_valid = valid_key_mask(valid_lens, num_queries, num_keys)  # (B, Tq, Tk)
    if query_mask is not None:
        is_valid = is_valid & query_mask[:, :, None].to(is_valid.device)  # (B,Tq,Tk) & (B,Tq,1)
    return is_valid


def entropy(weights: Tensor) -> Tensor:
    """Entropy in nats of each row of ``weights`` (..., Tk), renormalised to sum to 1 (local-p's
    rows sum to less); zero weights contribute 0, so a sparse row's entropy is over its support."""
    weights = weights.double()
    weights = weights / weights.sum(-1, keepdim=True).clamp(min=torch.finfo(weights.dtype).tiny)
    return -torch.special.xlogy(weights, weights).sum(-1)


def softmax_jacobian_norm(weights: Tensor) -> Tensor:
    """Frobenius norm of the softmax Jacobian ``diag(w) - w wᵀ`` of each row (..., Tk).

    Σ_ij (δ_ij w_i - w_i w_j)² = Σ w² - 2 Σ w³ + (Σ w²)²: 0 for one-hot weights, where no
    gradient reaches the scores, and largest for weights spread evenly over a few keys.
    """
    weights = weights.double()
    sum_squares = weights.pow(2).sum(-1)
    return (sum_squares - 2 * weights.pow(3).sum(-1) + sum_squares.pow(2)).clamp(min=0).sqrt()


def entmax_jacobian_norm(weights: Tensor, alpha: float) -> Tensor:
    """Frobenius norm of α-entmax's Jacobian ``diag(s) - s sᵀ / Σ s``, s = w^(2-α) on the support
    (``seq2seq.normalizers``), of each row (..., Tk); α = 1 is ``softmax_jacobian_norm``.

    With u = s / Σ s: Σ s² - 2 Σ s² u + (Σ s u)² ... = Σ s² - 2 Σ s³ / Σ s + (Σ s²)² / (Σ s)².
    """
    if alpha == 1.0:
        return softmax_jacobian_norm(weights)
    weights = weights.double()
    s = torch.where(weights > 0, weights.clamp(min=1e-300) ** (2 - alpha), 0.0)
    total = s.sum(-1).clamp(min=1e-300)
    squares = s.pow(2).sum(-1)
    norm = squares - 2 * s.pow(3).sum(-1) / total + squares.pow(2) / total.pow(2)
    return norm.clamp(min=0).sqrt()


def tanh_saturation(preactivations: Tensor, is_valid: Tensor) -> float:
    """Fraction of tanh inputs (B, Tq, Tk, A) with |x| > 2, over the valid (query, key) pairs."""
    return saturated_share(saturated_counts(preactivations), preactivations.shape[-1], is_valid)


def saturated_counts(preactivations: Tensor) -> Tensor:
    """How many of each pair's A tanh inputs have |x| > 2: (B, Tq, Tk, A) -> (B, Tq, Tk)."""
    return (preactivations.abs() > SATURATION_THRESHOLD).sum(-1)


def saturated_share(counts: Tensor, width: int, is_valid: Tensor) -> float:
    """``tanh_saturation`` from ``saturated_counts`` (B, Tq, Tk) of ``width`` units per pair: every
    valid pair has as many units, so the mean of the pairs' shares is one integer ratio."""
    return int(counts[is_valid].sum()) / (width * int(is_valid.sum()))


def query_chunks(queries: Tensor, keys: Tensor, width: int) -> list[slice]:
    """Slices of the query axis of queries (B, Tq, ·) against keys (B, Tk, ·) such that one
    slice's (B, ·, Tk, width) grid holds about ``CHUNK_ELEMENTS``: the whole grid of the
    callback's sentences, B·h·Tq·Tk·A floats with h heads, is many times the caches, and goes
    to fresh pages and main memory on every call, where a chunk stays in cache. A score is per
    query (decoding computes it one query at a time, so a score of the user's that mixed
    queries would disagree with its decoding already): chunks change nothing."""
    per_query = max(1, queries.shape[0] * keys.shape[1] * width)
    size = max(1, CHUNK_ELEMENTS // per_query)
    # No queries: one empty chunk, so that the caller's grids keep their (B, 0, Tk) shape.
    return [slice(start, start + size) for start in range(0, max(queries.shape[1], 1), size)]


def additive_logits_and_saturation(
    scoring: AdditiveAttention,
    queries: Tensor,
    projected_keys: Tensor,
    is_valid: Tensor,
    coverage: Tensor | None = None,
) -> tuple[Tensor, float | None]:
    """The logits (B, Tq, Tk) of an additive ``scoring`` (``covered_logits`` with coverage
    (B, Tq, Tk)) and its ``tanh_saturation`` over the ``is_valid`` pairs (None where there are
    none), a chunk of queries at a time (``query_chunks``). Coverage enters the tanh only where
    ``scoring`` has w_c."""
    inside = coverage is not None and bool(scoring.coverage_size())
    # A, the projected keys' width, sizes the chunks: W_q may be a module of the user's own.
    logits, counts = [], []
    for chunk in query_chunks(queries, projected_keys, projected_keys.shape[-1]):
        rows = queries[:, chunk]
        if coverage is None:
            logits.append(scoring.logits(rows, projected_keys))  # (B, chunk, Tk)
        else:
            logits.append(scoring.covered_logits(rows, projected_keys, coverage[:, chunk]))
        if inside:
            assert coverage is not None  # inside says so
            features = scoring.preactivations(rows, projected_keys, coverage[:, chunk])
        else:
            features = scoring.preactivations(rows, projected_keys)  # (B, chunk, Tk, A)
        counts.append(saturated_counts(features))  # (B, chunk, Tk)
        units = features.shape[-1]  # the tanh's inputs per pair, whatever preactivations gives
    saturation = None
    if is_valid.any():
        saturation = saturated_share(torch.cat(counts, dim=1), units, is_valid)
    return torch.cat(logits, dim=1), saturation


def attention_statistics(
    attention: Attention,
    queries: Tensor,
    projected_keys: Tensor,
    valid_lens: Tensor | None = None,
    query_mask: Tensor | None = None,
    positions: Tensor | None = None,
    coverage: Tensor | None = None,
) -> AttentionStatistics:
    """Score, weight and saturation statistics of ``attention`` over the valid pairs.

    queries (B, Tq, Dq), ``projected_keys = attention.project_keys(keys)``; ``valid_lens`` and
    ``query_mask`` as in ``valid_pairs``; ``positions`` (B, Tq) the queries' target steps (for a
    local-m window); ``coverage`` (B, Tq, Tk) each query's attention so far (a model with
    coverage). The weights are the attention's own (its normalizer, window, key bias and
    coverage). Rows without a valid key or with a padded query are left out; the pooled
    statistics weight every valid pair equally, the per-row ones every row.
    """
    saturation = None
    if isinstance(attention, AdditiveAttention):
        shape = torch.Size((queries.shape[0], queries.shape[1], projected_keys.shape[1]))
        is_valid = valid_pairs(valid_lens, query_mask, shape).to(queries.device)
        logits, saturation = additive_logits_and_saturation(
            attention, queries, projected_keys, is_valid, coverage
        )
    elif coverage is None:
        logits = attention.logits(queries, projected_keys)  # (B, Tq, Tk)
    else:
        logits = attention.covered_logits(queries, projected_keys, coverage)  # (B, Tq, Tk)
    return statistics_of(
        logits, attention.normalization, queries, valid_lens, query_mask, positions, 1, saturation
    )


@torch.no_grad()
def statistics_of(
    logits: Tensor,
    normalization: Normalization | None,
    queries: Tensor,
    valid_lens: Tensor | None,
    query_mask: Tensor | None,
    positions: Tensor | None,
    heads: int,
    saturation: float | None,
) -> AttentionStatistics:
    """``AttentionStatistics`` of logits (B·h, Tq, Tk) (h heads of B sentences, rows b·h + i),
    weighed by ``normalization`` (None: masked softmax) from the sentences' queries (B, Tq, Dq),
    ``valid_lens`` (B,) and ``positions`` (B, Tq); ``query_mask`` (B, Tq)."""
    alpha: float | None = 1.0
    if normalization is None:
        lens = None if valid_lens is None else valid_lens.repeat_interleave(heads, 0)
        normalized, factor = masked_softmax(logits, lens), None
    else:
        normalized, factor = normalization.parts(logits, queries, valid_lens, positions, heads)
        alpha = normalization.alpha
    weights = normalized if factor is None else normalized * factor
    if valid_lens is not None:
        valid_lens = valid_lens.repeat_interleave(heads, 0)
    if query_mask is not None:
        query_mask = query_mask.repeat_interleave(heads, 0)
    is_valid = valid_pairs(valid_lens, query_mask, logits.shape).to(logits.device)
    if not is_valid.any():
        raise ValueError("attention_statistics needs at least one valid (query, key) pair.")
    row_is_valid = is_valid.any(-1)  # (B·h, Tq)

    valid_scores = logits.double()[is_valid]  # (number of valid pairs,)
    # Per-row spread: the softmax ignores a row's mean (shift invariance), only its spread matters.
    counts = is_valid.sum(-1).clamp(min=1)  # (B·h, Tq)
    masked = logits.double().masked_fill(~is_valid, 0.0)
    row_mean = masked.sum(-1) / counts  # (B·h, Tq)
    row_var = ((masked - row_mean[..., None]).pow(2) * is_valid).sum(-1) / counts  # (B·h, Tq)
    jacobian = None
    if alpha is not None:
        jacobian = float(entmax_jacobian_norm(normalized, alpha)[row_is_valid].mean())
    return AttentionStatistics(
        score_mean=float(valid_scores.mean()),
        score_std=float(valid_scores.std(correction=0)),
        score_row_std=float(row_var.sqrt()[row_is_valid].mean()),
        entropy=float(entropy(weights)[row_is_valid].mean()),
        max_weight=float(weights.double().amax(-1)[row_is_valid].mean()),
        softmax_jacobian=jacobian,
        tanh_saturation=saturation,
        zero_share=float((weights[is_valid] == 0).double().mean()),
    )


def teacher_forced_queries(
    model: EncoderDecoder, src: Tensor, src_lens: Tensor, tgt_in: Tensor
) -> tuple[Tensor, Tensor]:
    """The decoder's queries under teacher forcing and the projected keys they meet.

    src (B, S), src_lens (B,), tgt_in (B, T) -> queries (B, T, H) (query t is the state that
    attends at step t: before reading tgt_in[:, t] in ``BahdanauDecoder``, after it in
    ``LuongDecoder``), projected keys (B, S, K').
    """
    source, state = model.encode(src, src_lens)
    queries = model.decoder.teacher_forced_queries(tgt_in, state, source)  # (B, T, H)
    return queries, source.projected_keys  # (B, T, H), (B, S, K')


@torch.no_grad()
def model_attention_statistics(
    model: EncoderDecoder, src: Tensor, src_lens: Tensor, tgt_in: Tensor, tgt_lens: Tensor
) -> AttentionStatistics:
    """``attention_statistics`` of a model's decoder on one teacher-forced batch, in eval mode.

    ``tgt_lens`` (B,) counts the real positions of ``tgt_in`` (BOS included); later queries are
    padding and are left out.
    """
    was_training = model.training
    model.eval()  # no dropout: the same batch and weights give the same numbers
    try:
        queries, projected_keys = teacher_forced_queries(model, src, src_lens, tgt_in)
        coverage = teacher_forced_coverage(model, src, src_lens, tgt_in)  # (B, T, S) or None
        positions = torch.arange(tgt_in.shape[1], device=tgt_in.device)  # (T,)
        query_mask = positions[None, :] < tgt_lens[:, None]  # (B, T)
        steps = positions.expand(len(src_lens), -1)  # (B, T): query t is target step t
        attention = model.decoder.attention
        if isinstance(attention, MultiHeadAttention):
            # Every head's scores, as B·h rows of queries against their sentence's keys.
            heads = attention.num_heads
            head_queries = attention.split_heads(attention.W_q(queries))  # (B·h, T, d)
            scoring = attention.scoring
            saturation = None
            if isinstance(scoring, AdditiveAttention):
                pairs = valid_pairs(
                    src_lens.repeat_interleave(heads), query_mask.repeat_interleave(heads, 0),
                    torch.Size((*head_queries.shape[:2], projected_keys.shape[1])),
                )  # fmt: skip
                logits, saturation = additive_logits_and_saturation(
                    scoring, head_queries, projected_keys, pairs.to(src.device)
                )
            else:
                logits = scoring.logits(head_queries, projected_keys)  # (B·h, T, S)
            if coverage is not None:
                assert attention.coverage_weight is not None  # the decoder covers
                # γ_i c for head i: (1, h, 1, 1) · (B, 1, T, S) -> (B·h, T, S)
                scaled = attention.coverage_weight[None, :, None, None] * coverage[:, None]
                logits = logits + scaled.flatten(0, 1)
            return statistics_of(
                logits, attention.normalization, queries, src_lens, query_mask, steps, heads,
                saturation,
            )  # fmt: skip
        return attention_statistics(
            attention, queries, projected_keys, src_lens, query_mask, steps, coverage
        )
    finally:
        model.train(was_training)


def teacher_forced_coverage(
    model: EncoderDecoder, src: Tensor, src_lens: Tensor, tgt_in: Tensor
) -> Tensor | None:
    """What each teacher-forced step had attended before it, c_t = Σ_{t'<t} a_t' (B, T, S), for
    a decoder with coverage; None for one without."""
    if not getattr(model.decoder, "covers", False):
        return None
    _, weights = model(src, src_lens, tgt_in)  # (B, T, S)
    assert weights is not None  # asked for by default
    return weights.cumsum(dim=1) - weights  # (B, T, S): the steps before t


def kl(p: Tensor, q: Tensor) -> Tensor:
    """KL(p || q) of each row (..., Tk) in nats, with 0 log 0 = 0 (where p > 0, q > 0 too)."""
    return (torch.special.xlogy(p, p) - torch.special.xlogy(p, q)).sum(-1)


def head_divergence(weights: Tensor, query_mask: Tensor) -> Tensor:
    """How differently the heads attend: the mean pairwise Jensen–Shannon divergence (nats,
    0 = identical maps, at most log 2) between the heads' attention rows, over the real queries.

    weights (B, h, Tq, Tk) rows of each head, query_mask (B, Tq) -> () for h >= 2.
    """
    weights = weights.double()
    heads = weights.shape[1]
    pairs = [(i, j) for i in range(heads) for j in range(i + 1, heads)]
    if not pairs:
        return torch.zeros((), dtype=torch.float64)
    first = weights[:, [i for i, _ in pairs]]  # (B, P, Tq, Tk)
    second = weights[:, [j for _, j in pairs]]
    middle = (first + second) / 2
    # KL(p || m) with 0 log 0 = 0; p > 0 implies m > 0.
    kl_first = torch.special.xlogy(first, first).sum(-1) - torch.special.xlogy(first, middle).sum(
        -1
    )
    kl_second = torch.special.xlogy(second, second).sum(-1) - (
        torch.special.xlogy(second, middle).sum(-1)
    )
    divergence = (kl_first + kl_second) / 2  # (B, P, Tq)
    mask = query_mask[:, None, :].expand_as(divergence)
    return divergence[mask].mean()


@torch.no_grad()
def transformer_head_metrics(
    model: Transformer, src: Tensor, src_lens: Tensor, tgt_in: Tensor, tgt_lens: Tensor
) -> dict[str, float]:
    """``attn/head_js/L<l>``: ``head_divergence`` of every decoder layer's cross-attention, and
    ``attn/entropy`` of the last layer's average, on one teacher-forced batch, in eval mode."""
    was_training = model.training
    model.eval()
    try:
        source, _ = model.encode(src, src_lens)
        weights = model.decoder.cross_attention_weights(tgt_in, source)  # (B, L, h, T, S)
    finally:
        model.train(was_training)
    positions = torch.arange(tgt_in.shape[1], device=tgt_in.device)
    query_mask = positions[None, :] < tgt_lens[:, None]  # (B, T)
    metrics = {
        f"attn/head_js/L{layer + 1}": float(head_divergence(weights[:, layer], query_mask))
        for layer in range(weights.shape[1])
    }
    average = weights[:, -1].mean(1)  # (B, T, S)
    metrics["attn/entropy"] = float(entropy(average)[query_mask].mean())
    # Exact zeros among the real (query, key) pairs of every layer's and head's cross-attention.
    real_keys = valid_key_mask(src_lens, weights.shape[3], weights.shape[4])  # (B, T, S)
    pairs = (real_keys & query_mask[:, :, None])[:, None, None].expand_as(weights)
    metrics["attn/zero_share"] = float((weights[pairs] == 0).double().mean())
    return metrics


@torch.no_grad()
def coverage_metrics(
    model: EncoderDecoder, src: Tensor, src_lens: Tensor, tgt_in: Tensor, tgt_lens: Tensor
) -> dict[str, float]:
    """``attn/coverage_over`` and ``attn/coverage_under``: the shares of real source tokens that
    one teacher-forced batch's real target steps attended more than 1.5 times and less than 0.5
    in total (``attention_totals``), in eval mode: the signs of over- and under-translation,
    which coverage is for, for any model (a Transformer's map: ``forward``'s)."""
    was_training = model.training
    model.eval()
    try:
        _, weights = model(src, src_lens, tgt_in)  # (B, T, S)
    finally:
        model.train(was_training)
    assert weights is not None  # asked for by default
    positions = torch.arange(tgt_in.shape[1], device=tgt_in.device)  # (T,)
    is_target = positions[None, :] < tgt_lens[:, None]  # (B, T): padded steps read nothing
    over, under = attention_totals(weights * is_target[:, :, None], src_lens)
    words = max(1, int(src_lens.sum()))
    return {"attn/coverage_over": sum(over) / words, "attn/coverage_under": sum(under) / words}


def learned_alphas(model: EncoderDecoder) -> dict[str, float]:
    """``attn/alpha``: the mean α of the attentions whose entmax learns it (``attention.alpha=
    learnable``), which no other metric shows; nothing when none does."""
    alphas = [
        float(alpha.detach())
        for module in model.modules()
        if isinstance(module, Normalization)
        and isinstance(alpha := getattr(module.normalizer, "alpha", None), Tensor)
    ]
    return {"attn/alpha": sum(alphas) / len(alphas)} if alphas else {}


def gradient_norm(parameters: Iterable[Tensor]) -> float | None:
    """L2 norm of the gradients of ``parameters`` together; None if none has a gradient."""
    norm = gradient_norm_tensor(parameters)
    return None if norm is None else float(norm)


def gradient_norm_tensor(parameters: Iterable[Tensor]) -> Tensor | None:
    """``gradient_norm`` as a float64 scalar tensor, taken without waiting for it (no ``float``)."""
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    if not grads:
        return None
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float64)))


class AttentionDiagnostics(pl.Callback):
    """Logs ``attn/*`` statistics of a fixed validation batch, and ``attn/grad_norm``.

    The statistics (``AttentionStatistics``) are measured at every training step whose logged
    values Lightning writes (every ``trainer.log_every_n_steps`` steps, and the step where the
    run stops) and at the end of every validation (there also ``coverage_metrics``), on
    ``num_sentences`` validation sentences spread evenly over the validation set (fixed for the
    whole run, so that changes over time come from the model, not the data). ``attn/grad_norm``
    is the norm of the attention parameters' gradient before clipping, on the same steps;
    scoring functions without parameters have none.

    Lightning writes a step's row with every value logged ``on_step`` so far, fresh or not: a row
    these values were not measured for would repeat the last ones. So the callback must see that a
    run stops at this step: put it after the callbacks that stop a run in ``on_train_batch_end``
    (a ``Timer`` of its own for ``max_time``: Lightning appends the one it builds after them all).
    While a stop waits for ``trainer.min_epochs`` or ``min_steps``, Lightning writes a row at every
    step; the statistics are measured on the grid only there, not at every step.
    """

    def __init__(self, num_sentences: int = 64) -> None:
        super().__init__()
        if num_sentences < 1:
            raise ValueError(f"num_sentences must be positive, got {num_sentences}")
        self.num_sentences = num_sentences
        self._batch: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
        self._warned = False
        # This batch's: whether the optimizer steps (not so within gradient accumulation), and
        # the norm, taken at every step because a stop (max_time) is known only after it.
        self._stepped = False
        self._grad_norm: Tensor | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._batch = None  # a new fit may have new data or a new device

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._stepped, self._grad_norm = False, None

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Here, not before the optimizer step: there NonFiniteGuard may already have dropped a
        # bad step's gradients, whose norm is the one worth seeing. Under gradient accumulation
        # the last micro-batch's backward leaves the whole step's gradient.
        model = _seq2seq(pl_module)
        if model is not None:  # a few tensors' norms, no sync: cheap next to any step
            self._grad_norm = gradient_norm_tensor(model.decoder.attention.parameters())

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        self._stepped = True

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if not (self._stepped and _is_written_step(trainer)):
            return
        self._log_statistics(trainer, pl_module, on_step=True)
        if self._grad_norm is not None:
            pl_module.log(
                "attn/grad_norm", float(self._grad_norm), on_step=True, on_epoch=False, batch_size=1
            )

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._log_statistics(trainer, pl_module, on_step=False)

    def _log_statistics(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, on_step: bool
    ) -> None:
        model = getattr(pl_module, "model", None)
        if not isinstance(model, Seq2Seq | Transformer):
            return
        batch = self._fixed_batch(trainer, pl_module.device)
        if batch is None:
            return
        if isinstance(model, Transformer):
            metrics = transformer_head_metrics(model, *batch)
        else:
            metrics = model_attention_statistics(model, *batch).as_metrics()
        metrics.update(learned_alphas(model))
        if not on_step:  # one more teacher-forced pass: at validations, not every n steps
            metrics.update(coverage_metrics(model, *batch))
        # Every rank measures the same sentences with the same weights: no syncing needed.
        pl_module.log_dict(metrics, on_step=on_step, on_epoch=not on_step, batch_size=1)

    def _fixed_batch(
        self, trainer: pl.Trainer, device: torch.device
    ) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        """(src, src_lens, tgt_in, tgt_lens) of the fixed sentences, built on first use."""
        if self._batch is None:
            loader = _validation_loader(trainer)
            if loader is None:
                if not self._warned:
                    log.warning("attention diagnostics are off: the trainer has no validation set")
                    self._warned = True
                return None
            dataset = loader.dataset
            size = len(dataset)
            count = min(self.num_sentences, size)
            # Evenly spaced, not the first ones: a validation loader may sort by length.
            indices = sorted({round(i * (size - 1) / max(count - 1, 1)) for i in range(count)})
            batch = loader.collate_fn([dataset[i] for i in indices])
            self._batch = (batch.src, batch.src_lens, batch.tgt_in, batch.tgt_lens)
        src, src_lens, tgt_in, tgt_lens = (tensor.to(device) for tensor in self._batch)
        return src, src_lens, tgt_in, tgt_lens


def _is_written_step(trainer: pl.Trainer) -> bool:
    """Whether Lightning writes the values logged at this training step, asked at its end (its
    logger connector's should_update_logs, from public attributes): every log_every_n_steps
    optimizer steps, and at the step where the run stops (should_stop, set by a callback before
    this one, at a step where Lightning lets it stop: ``stop_takes_effect``)."""
    # Lightning sets log_every_n_steps on the trainer at init without declaring it on the class.
    every = int(getattr(trainer, "log_every_n_steps", 0))
    step = trainer.global_step  # already counts this step
    if every <= 0 or step <= 0:
        return False
    return step % every == 0 or stop_takes_effect(trainer)


def stop_takes_effect(trainer: pl.Trainer) -> bool:
    """``trainer.should_stop``, where the fit loop obeys it: once ``trainer.min_epochs`` and
    ``min_steps`` are met (its ``_can_stop_early``, from public attributes). Before, the flag
    stays set and training goes on."""
    if not trainer.should_stop:
        return False
    loop = trainer.fit_loop
    # Lightning counts the epochs processed; mid-epoch that is current_epoch, those completed.
    epochs_met = not loop.min_epochs or trainer.current_epoch >= loop.min_epochs
    steps_met = not loop.min_steps or trainer.global_step >= loop.min_steps
    return epochs_met and steps_met


def _seq2seq(pl_module: pl.LightningModule) -> Seq2Seq | None:
    model = getattr(pl_module, "model", None)
    return model if isinstance(model, Seq2Seq) else None


def _validation_loader(trainer: pl.Trainer) -> Any:
    """The validation DataLoader (one, or the first of several), or None without one."""
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is not None and hasattr(datamodule, "val_dataloader"):
        loader = datamodule.val_dataloader()
    else:
        loader = trainer.val_dataloaders
    if isinstance(loader, list | tuple):
        loader = loader[0] if loader else None
    if loader is None or not hasattr(loader, "dataset") or len(loader.dataset) == 0:
        return None
    return loader
