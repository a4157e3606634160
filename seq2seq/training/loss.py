"""The training loss: summed token cross-entropy under teacher forcing, guided alignment, and
the coverage loss.

Shape legend: B batch, S source length, T target length, V target vocabulary, N scored tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.data.tokenization import PAD_ID
from seq2seq.models.decoder import AttentionDecoder
from seq2seq.models.model import EncoderDecoder


def decoder_loss(
    decoder: AttentionDecoder,
    tgt_in: Tensor,
    tgt_out: Tensor,
    memory: Tensor,
    src_lens: Tensor,
    *state: Tensor,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Summed token cross-entropy (in float32) of the decoder under teacher forcing, padding
    excluded; with ``label_smoothing`` ε, against targets that put 1 - ε on the reference token
    and ε spread evenly over the vocabulary (Szegedy et al., 2016).

    tgt_in, tgt_out (B, T), memory (B, S, M), src_lens (B,), state tensors of (B, H) -> ().
    """
    source = decoder.prepare_source(memory, src_lens)
    logits, targets = decoder.teacher_forced_logits(tgt_in, tgt_out, state, source)  # (N, V)
    return token_cross_entropy(logits, targets, label_smoothing)


def token_cross_entropy(logits: Tensor, targets: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """The summed cross-entropy (in float32) of logits (N, V) against targets (N,), PAD excluded,
    with label smoothing ε as ``decoder_loss`` says."""
    return F.cross_entropy(
        logits.float(),
        targets,
        ignore_index=PAD_ID,
        reduction="sum",
        label_smoothing=label_smoothing,
    )


class DecoderLoss(nn.Module):
    """``decoder_loss`` as a module, which is what ``make_graphed_callables`` records (it needs the
    module to know which parameters the graph differentiates)."""

    def __init__(self, decoder: AttentionDecoder, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.decoder = decoder
        self.label_smoothing = label_smoothing

    def forward(
        self, tgt_in: Tensor, tgt_out: Tensor, memory: Tensor, src_lens: Tensor, *state: Tensor
    ) -> Tensor:
        return decoder_loss(
            self.decoder, tgt_in, tgt_out, memory, src_lens, *state,
            label_smoothing=self.label_smoothing,
        )  # fmt: skip


def teacher_forced_loss(
    model: EncoderDecoder,
    decode: Callable[..., Tensor],
    src: Tensor,
    src_lens: Tensor,
    tgt_in: Tensor,
    tgt_out: Tensor,
) -> Tensor:
    """The encoder (always eager), the decoder's initial state, then ``decode``: a
    ``DecoderLoss`` or a ``DecoderGraphs``, which take (tgt_in, tgt_out, memory, src_lens,
    *state). src (B, S), tgt_in, tgt_out (B, T) -> ()."""
    memory, summary = model.encoder(src, src_lens)  # (B, S, M), (B, M)
    state = model.initial_state(summary, memory)
    return decode(tgt_in, tgt_out, memory, src_lens, *state)


def gold_attention(
    links: Sequence[Sequence[tuple[int, int]] | None], src_steps: int, tgt_steps: int
) -> Tensor:
    """The attention each target step should have, (B, T, S), from gold (source, target) word
    links: row j (the step that predicts target word j) spreads 1 evenly over the source words
    linked to word j; rows of unlinked words, of EOS and of padding are all zeros (no target),
    and so is every row of a sentence without a gold alignment (None)."""
    gold = torch.zeros(len(links), tgt_steps, src_steps)  # (B, T, S)
    for row, sentence in enumerate(links):
        for source, target in sentence or ():
            if source < src_steps and target < tgt_steps:  # a cut sentence keeps its first links
                gold[row, target, source] = 1.0
    return gold / gold.sum(dim=-1, keepdim=True).clamp(min=1.0)


def alignment_loss(weights: Tensor, gold: Tensor) -> Tensor:
    """Guided alignment (Garg et al., 2019; OpenNMT-py's ``lambda_align``): the cross-entropy
    between each target step's gold attention and the model's, summed over the steps that have
    gold links: ``-Σ_b Σ_t Σ_s gold[b,t,s] · log weights[b,t,s]``. weights, gold (B, T, S) -> ().

    Weights are clamped away from 0 before the log: a padded key has weight exactly 0, and no
    gold link points at one."""
    log_weights = weights.float().clamp(min=torch.finfo(torch.float32).tiny).log()  # (B, T, S)
    return -(gold.to(log_weights.device) * log_weights).sum()


def coverage_loss(weights: Tensor, is_target: Tensor) -> Tensor:
    """See et al. (2017), eq. 12: ``Σ_b Σ_t Σ_i min(a_ti, c_ti)`` over the real target steps,
    where c_ti = Σ_{t'<t} a_t'i is what the steps before t gave source word i: the attention
    that goes again to words already attended. weights (B, T, S), is_target (B, T) -> ()."""
    weights = weights.float()
    coverage = weights.cumsum(dim=1) - weights  # (B, T, S): the sum over the steps before t
    repeated = torch.minimum(weights, coverage).sum(dim=-1)  # (B, T)
    return (repeated * is_target.to(repeated.dtype)).sum()


def loss_with_weights(
    model: EncoderDecoder,
    src: Tensor,
    src_lens: Tensor,
    tgt_in: Tensor,
    tgt_out: Tensor,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """The summed token cross-entropy of one teacher-forced pass that also returns the attention
    weights (B, T, S) (a Transformer's: its last layer's cross-attention, averaged over the
    heads, the map that AER scores), for the losses on them. src (B, S), tgt_in, tgt_out (B, T)
    -> ((), (B, T, S))."""
    # (N, V) against (N,) targets, (B, T, S)
    logits, targets, weights = model.teacher_forced_logits_and_weights(
        src, src_lens, tgt_in, tgt_out
    )
    return token_cross_entropy(logits, targets, label_smoothing), weights


def guided_loss(
    model: EncoderDecoder,
    src: Tensor,
    src_lens: Tensor,
    tgt_in: Tensor,
    tgt_out: Tensor,
    gold: Tensor,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """The summed token cross-entropy and ``alignment_loss`` of one pass (``loss_with_weights``).
    src (B, S), tgt_in, tgt_out (B, T), gold (B, T, S) -> ((), ())."""
    token_loss, weights = loss_with_weights(model, src, src_lens, tgt_in, tgt_out, label_smoothing)
    return token_loss, alignment_loss(weights, gold)
