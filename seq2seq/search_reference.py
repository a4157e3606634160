"""Beam search as it is usually written: one sentence at a time, a list of hypotheses, and the
four steps of every iteration named (expand, finish, prune, stop).

``seq2seq.search.beam_search`` is the same search batched over sentences and beams, with one
integer coding each candidate; this one is what it is tested against (``tests/test_search.py``),
as the C kernels are tested against the reference model, and what to read first. Both rank
hypotheses by log P(Y) / lp(Y) (GNMT's length penalty, |Y| counts EOS; plus GNMT's coverage
penalty of a finished hypothesis when asked), keep the K best live
hypotheses, and finish a hypothesis that ends in EOS (or reaches the length limit) only when it
ranks among the K best extensions of its step.

Shape legend: K beam size, S source length, V vocabulary, R live hypotheses (R <= K).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from seq2seq.search import (
    BeamOutput,
    Hypotheses,
    StepwiseModel,
    check_beam,
    check_coverage_penalty,
    check_length_penalty,
    coverage_penalty,
    length_penalty_factor,
    max_output_lengths,
)


@dataclass(frozen=True)
class Hypothesis:
    """A prefix: its tokens, log P of them (float32, as the batched search sums them), and the
    attention each token was produced with (S,) per token."""

    tokens: tuple[int, ...]
    log_prob: Tensor  # () float32
    attention: tuple[Tensor, ...]


@dataclass(frozen=True)
class Candidate:
    """One extension of a live hypothesis (its row among the live ones) by one token."""

    parent: int
    token: int
    log_prob: Tensor  # () float32: the parent's plus the token's


@torch.no_grad()
def beam_search_reference(
    model: StepwiseModel,
    src: Tensor,
    src_lens: Tensor,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    beam_size: int = 5,
    length_penalty: float = 0.6,
    max_len_a: float = 2.0,
    max_len_b: int = 10,
    n_best: int = 1,
    coverage_penalty_weight: float = 0.0,
) -> BeamOutput:
    """What ``seq2seq.search.beam_search`` returns, computed sentence by sentence."""
    check_beam(beam_size, n_best)
    check_length_penalty(length_penalty)
    check_coverage_penalty(coverage_penalty_weight)
    sentences = []
    for b in range(src.shape[0]):
        source, state = model.encode(src[b : b + 1], src_lens[b : b + 1])  # one sentence
        limit = max(1, int(max_output_lengths(src_lens[b : b + 1], max_len_a, max_len_b)[0]))
        lp = length_penalty_factor(torch.arange(limit + 2), length_penalty).tolist()
        start = Hypothesis((), torch.zeros((), dtype=torch.float32), ())
        live: list[Hypothesis] = [start]
        finished: list[tuple[Tensor, Hypothesis]] = []  # (log P / lp, hypothesis)
        for t in range(limit):
            # Expand: every live hypothesis by every token, the decoder run on all of them at once
            # (the R rows read the one sentence's source).
            prev_tokens = torch.tensor([h.tokens[-1] if h.tokens else bos_id for h in live])
            logits, state, weights = model.decode_step(prev_tokens, state, source)  # (R, V)
            log_probs = logits.float().log_softmax(dim=-1)  # (R, V)
            extended = torch.stack([h.log_prob for h in live])[:, None] + log_probs  # (R, V)
            candidates = best_extensions(extended, 2 * beam_size)
            # Finish: an EOS among the K best extensions, or any of them at the length limit.
            for candidate in candidates[:beam_size]:
                if candidate.token == eos_id or t + 1 == limit:
                    hypothesis = extend(live, candidate, weights)
                    score = candidate.log_prob / lp[t + 1]
                    if coverage_penalty_weight > 0:
                        # GNMT's cp over this sentence's real words, the attention summed step
                        # by step in float32.
                        covered = sum_attention(hypothesis)[: int(src_lens[b])]
                        score = score + coverage_penalty(
                            covered, torch.ones_like(covered, dtype=torch.bool),
                            coverage_penalty_weight,
                        )  # fmt: skip
                    finished.append((score, hypothesis))
            # Prune: the K best extensions that do not end in EOS stay live, with their states.
            kept = [c for c in candidates if c.token != eos_id][:beam_size]
            if t + 1 == limit or not kept:
                break
            parents = torch.tensor([c.parent for c in kept])  # (R',)
            state = tuple(tensor.index_select(0, parents) for tensor in state)
            live = [extend(live, c, weights) for c in kept]
            # Stop: once the N-th best finished score is at least what the best live hypothesis
            # could still reach (its log P can only fall; lp grows with α > 0 up to the limit).
            finished.sort(key=lambda entry: -float(entry[0]))
            if len(finished) >= n_best:
                best_possible = live[0].log_prob / max(lp[t + 2], lp[limit])
                if finished[n_best - 1][0] >= best_possible:
                    break
        finished.sort(key=lambda entry: -float(entry[0]))
        sentences.append(finished[:n_best])
    return pack(sentences, n_best, src.shape[1], pad_id)


def best_extensions(extended: Tensor, count: int) -> list[Candidate]:
    """The ``count`` best of the (R, V) extensions, best first (ties: the lower row and token)."""
    vocab_size = extended.shape[1]
    scores, codes = extended.flatten().sort(descending=True, stable=True)
    return [
        Candidate(code // vocab_size, code % vocab_size, score)
        for score, code in zip(scores[:count], codes[:count].tolist(), strict=True)
        if score > float("-inf")
    ]


def sum_attention(hypothesis: Hypothesis) -> Tensor:
    """The attention of the hypothesis's tokens summed step by step, float32 (S,)."""
    total = torch.zeros_like(hypothesis.attention[0], dtype=torch.float32)
    for weights in hypothesis.attention:
        total = total + weights.float()
    return total


def extend(live: list[Hypothesis], candidate: Candidate, weights: Tensor) -> Hypothesis:
    """The hypothesis ``candidate`` makes: its parent's prefix, the token and the attention the
    parent's row produced it with (``weights`` (R, S))."""
    parent = live[candidate.parent]
    return Hypothesis(
        (*parent.tokens, candidate.token),
        candidate.log_prob,
        (*parent.attention, weights[candidate.parent]),
    )


def pack(
    sentences: list[list[tuple[Tensor, Hypothesis]]], n_best: int, src_len: int, pad_id: int
) -> BeamOutput:
    """The N best of every sentence as ``BeamOutput``'s padded tensors (empty ranks: score -inf,
    length 0)."""
    batch_size = len(sentences)
    longest = max([1] + [len(h.tokens) for ranked in sentences for _, h in ranked])
    tokens = torch.full((batch_size, n_best, longest), pad_id, dtype=torch.long)
    attention = torch.zeros(batch_size, n_best, longest, src_len)
    lengths = torch.zeros(batch_size, n_best, dtype=torch.long)
    scores = torch.full((batch_size, n_best), float("-inf"))
    for b, ranked in enumerate(sentences):
        for rank, (score, hypothesis) in enumerate(ranked):
            steps = len(hypothesis.tokens)
            tokens[b, rank, :steps] = torch.tensor(hypothesis.tokens)
            rows = torch.stack(hypothesis.attention)  # (L, S') of this sentence's source length
            attention = attention.to(rows.dtype)
            attention[b, rank, :steps, : rows.shape[1]] = rows
            lengths[b, rank] = steps
            scores[b, rank] = score
    best_longest = max(1, int(lengths[:, 0].max()))
    best = Hypotheses(
        tokens[:, 0, :best_longest], lengths[:, 0], attention[:, 0, :best_longest], scores[:, 0]
    )
    return BeamOutput(best, tokens, lengths, attention, scores)
