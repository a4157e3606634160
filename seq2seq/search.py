"""Decoding as free functions over any model with ``encode`` and ``decode_step``.

Shape legend: B batch, K beam size, N n-best size, S source length, L output length (at most the
length limit), V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from seq2seq.decoder import DecoderState, EncodedSource


class StepwiseModel(Protocol):
    """What decoding needs from a model (``Seq2Seq`` is one): encode once, then step."""

    def encode(self, src: Tensor, src_lens: Tensor) -> tuple[EncodedSource, DecoderState]: ...

    def decode_step(
        self, prev_tokens: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, DecoderState, Tensor]: ...


@dataclass
class Hypotheses:
    """Decoded token ids and the attention weights that produced them."""

    tokens: Tensor  # (B, L) ids, EOS included, padding after EOS
    lengths: Tensor  # (B,) number of tokens up to and including EOS (or the length limit)
    attention: Tensor  # (B, L, S) weights of each output token over the source, 0 after the end
    scores: Tensor | None = None  # (B,) beam search's log P(Y) / lp(Y); greedy search leaves None


@dataclass
class BeamOutput:
    """What ``beam_search`` returns: the best hypothesis per sentence and the N best, ranked.

    A sentence with fewer than N possible hypotheses (tiny vocabulary and length limit) fills the
    missing ranks with score -inf, length 0 and padding.
    """

    best: Hypotheses  # rank 0 of each sentence, with scores (B,)
    tokens: Tensor  # (B, N, L) ids, EOS included, padding after the end
    lengths: Tensor  # (B, N) number of tokens up to and including EOS (or the length limit)
    attention: Tensor  # (B, N, L, S) weights of each output token over the source, 0 after the end
    scores: Tensor  # (B, N) log P(Y) / lp(Y), best first


def max_output_lengths(src_lens: Tensor, a: float, b: int) -> Tensor:
    """The length limit ``a · source_length + b`` for each sentence (B,)."""
    return (src_lens.float() * a).floor().long() + b


@torch.no_grad()
def greedy_search(
    model: StepwiseModel,
    src: Tensor,
    src_lens: Tensor,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    max_len_a: float = 2.0,
    max_len_b: int = 10,
) -> Hypotheses:
    """Batched greedy decoding: the most probable token at each step, until EOS or the limit.

    A sentence leaves the decoder's batch at its EOS (or limit), so the steps the longer ones still
    need cost nothing for it.
    """
    batch_size, device = src.shape[0], src.device
    source, state = model.encode(src, src_lens)
    limits = max_output_lengths(src_lens, max_len_a, max_len_b).to(device)  # (B,)
    max_steps = max(1, int(limits.max()))
    # The sentences still decoding, in the order of the decoder's rows (A,).
    active = torch.arange(batch_size, device=device)
    active_limits = limits  # (A,)
    prev_tokens = torch.full((batch_size,), bos_id, dtype=torch.long, device=device)  # (A,)
    # Each step writes its active rows in place (PAD and zero weights stay for the finished
    # ones): a step costs as few small ops as possible, which is most of greedy's time here.
    tokens = torch.full((batch_size, max_steps), pad_id, dtype=torch.long, device=device)
    weights: Tensor | None = None  # (B, L, S), once the first step gives the dtype
    num_steps = max_steps
    for t in range(max_steps):
        logits, state, step_weights = model.decode_step(prev_tokens, state, source)
        next_tokens = logits.argmax(dim=-1)  # (A,)
        if weights is None:
            weights = step_weights.new_zeros(batch_size, max_steps, step_weights.shape[1])
        tokens[active, t] = next_tokens
        weights[active, t] = step_weights
        finishing = (next_tokens == eos_id) | (t + 1 >= active_limits)  # (A,)
        num_finishing = int(finishing.sum())  # the one host sync of the step
        if num_finishing == len(active):
            num_steps = t + 1
            break
        prev_tokens = next_tokens
        if num_finishing:
            still = (~finishing).nonzero()[:, 0]  # (A',) positions among the active sentences
            active, active_limits, prev_tokens = (
                active[still],
                active_limits[still],
                prev_tokens[still],
            )
            source = source.index_select(still)
            state = tuple(tensor.index_select(0, still) for tensor in state)
    assert weights is not None  # the loop runs at least once
    tokens = tokens[:, :num_steps]  # (B, L)
    # A sentence ends at its first EOS, or else at its limit (one token at least).
    is_eos = tokens == eos_id  # (B, L)
    lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, limits.clamp(min=1))
    return Hypotheses(tokens, lengths, weights[:, :num_steps])


def length_penalty_factor(lengths: Tensor, alpha: float) -> Tensor:
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ** α (Wu et al. 2016, eq. 14) for lengths of any shape.

    α = 0 gives 1 (raw log-probabilities); larger α favours longer hypotheses.
    """
    return ((5.0 + lengths.float()) / 6.0) ** alpha


@torch.no_grad()
def beam_search(
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
) -> BeamOutput:
    """Batched beam search: all B sentences and their K beams are decoded together as B·K rows.

    Hypotheses are ranked by log P(Y) / lp(Y) (``length_penalty_factor``, |Y| counts EOS). At each
    step the 2K best extensions of the K live hypotheses are taken: an EOS among the first K of
    them moves that hypothesis to its sentence's finished set, and the K best non-EOS extensions
    stay live (each live hypothesis has one EOS extension, so at most K of the 2K end in EOS). A
    hypothesis that reaches the length limit ``max_output_lengths`` without EOS finishes there.
    Search goes on after the first EOS, since with α > 0 a longer hypothesis can still win; a
    sentence stops when no live hypothesis can beat its N-th finished one (see the bound below).

    With α = 0, ``beam_size=1`` reproduces ``greedy_search`` exactly. With α > 0 it need not: the
    single live beam continues past a finished EOS hypothesis and may find a longer one whose
    normalized score is higher.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be an integer >= 1, got {beam_size}.")
    if not 1 <= n_best <= beam_size:
        raise ValueError(
            f"n_best must be between 1 and beam_size ({beam_size}) inclusive, got {n_best}."
        )
    device = src.device
    batch_size, num_beams = src.shape[0], beam_size
    source, state = model.encode(src, src_lens)
    # Beam k of sentence b lives in row b·K + k. The K beams of a sentence share its one copy of
    # the encoding (the decoder's ``attend`` reads B·K query rows against B sentences), so only
    # the state is repeated.
    rows = torch.arange(batch_size, device=device).repeat_interleave(num_beams)  # (B·K,)
    state = tuple(tensor.index_select(0, rows) for tensor in state)  # each (B·K, H)
    # A limit below 1 still emits one token, as in greedy_search.
    limits = max_output_lengths(src_lens, max_len_a, max_len_b).to(device).clamp(min=1)  # (B,)
    max_steps = int(limits.max())
    lp = length_penalty_factor(torch.arange(max_steps + 2, device=device), length_penalty)

    # A sentence is dropped from the decoder's batch as soon as it is done, so the steps that the
    # others still need cost nothing for it. ``active`` (A,) lists the sentences still searching,
    # in the order of their rows: active sentence a owns rows a·K .. a·K + K - 1.
    active = torch.arange(batch_size, device=device)  # (A,)
    active_limits = limits  # (A,)

    # Live hypotheses of the active sentences: raw log P. At the start all K beams hold the same
    # prefix <bos>, so only beam 0 may expand; the others start at -inf and the first step fills
    # the beam with distinct tokens instead of K copies of the best one.
    live_scores = torch.full((batch_size, num_beams), float("-inf"), device=device)  # (A, K)
    live_scores[:, 0] = 0.0
    prev_tokens = torch.full((batch_size * num_beams,), bos_id, dtype=torch.long, device=device)

    # Finished hypotheses of every sentence: only the N best ever matter (the output and the
    # stopping rule read nothing else), so each sentence keeps N slots, best first. A hypothesis is
    # stored as the step it ended at, the live beam it extended and its last token; backtracking
    # through the per-step history below recovers the rest.
    finished_scores = torch.full((batch_size, n_best), float("-inf"), device=device)  # (B, N)
    finished_end = torch.full((batch_size, n_best), -1, dtype=torch.long, device=device)
    finished_parent = torch.zeros((batch_size, n_best), dtype=torch.long, device=device)
    finished_token = torch.full((batch_size, n_best), pad_id, dtype=torch.long, device=device)
    # Per step t, for every sentence (zeros for those already done, which backtracking never
    # reads): the live beams' parents (B, K) and tokens (B, K), and the attention (B, K, S) each
    # beam of step t - 1 used to produce the token at position t.
    history: list[tuple[Tensor, Tensor, Tensor]] = []

    for t in range(max_steps):
        logits, state, weights = model.decode_step(prev_tokens, state, source)
        num_active, vocab_size = live_scores.shape[0], logits.shape[-1]
        log_probs = logits.float().log_softmax(dim=-1)  # (A·K, V), float32 for the sums below
        # Every extension of every live beam, per sentence: (A·K, V) -> (A, K, V) -> (A, K·V).
        extended = live_scores[:, :, None] + log_probs.view(num_active, num_beams, vocab_size)
        candidates = extended.view(num_active, num_beams * vocab_size)
        num_candidates = min(2 * num_beams, candidates.shape[1])
        # (A, 2K) best first; index = beam · V + token.
        cand_scores, cand_indices = candidates.topk(num_candidates, dim=1)
        cand_parents = cand_indices // vocab_size  # (A, 2K) live beam each candidate extends
        cand_tokens = cand_indices % vocab_size  # (A, 2K)
        is_eos = cand_tokens == eos_id  # (A, 2K)
        length = t + 1  # every candidate now has this many tokens
        at_limit = length >= active_limits  # (A,)

        # A candidate finishes if it ends in EOS or hits the limit, and only if it ranks among the
        # first K: a beam of K would have kept it (this is what makes K = 1 greedy). Dead beams
        # (-inf) add nothing.
        finishing = (is_eos | at_limit[:, None]) & torch.isfinite(cand_scores)
        finishing[:, num_beams:] = False
        new_scores = (cand_scores / lp[length]).masked_fill(~finishing, float("-inf"))  # (A, 2K)
        # Merge with the finished set and keep the N best: (A, N + 2K) -> (A, N).
        merged = torch.cat([finished_scores[active], new_scores], dim=1)
        active_finished_scores, keep = merged.topk(n_best, dim=1)
        end_steps = torch.full_like(cand_tokens, t)  # (A, 2K)
        for finished, candidate in [
            (finished_end, end_steps),
            (finished_parent, cand_parents),
            (finished_token, cand_tokens),
        ]:
            merged_values = torch.cat([finished[active], candidate], dim=1).gather(1, keep)
            finished.index_copy_(0, active, merged_values)  # (A, N) into the rows of (B, N)
        finished_scores.index_copy_(0, active, active_finished_scores)

        # The K best non-EOS candidates stay live. They all have the same length, so raw log P
        # ranks them as the normalized score would.
        non_eos_scores = cand_scores.masked_fill(is_eos, float("-inf"))  # (A, 2K)
        # (A, K) log P and (A, K) positions among the 2K candidates.
        live_scores, live_slots = non_eos_scores.topk(num_beams, dim=1)
        live_parents = cand_parents.gather(1, live_slots)  # (A, K)
        live_tokens = cand_tokens.gather(1, live_slots)  # (A, K)
        # Rows are a·K + k, so (A·K, S) -> (A, K, S) groups each sentence's beams; the active
        # sentences' rows go into zero-filled (B, ...) tensors.
        step_weights = weights.view(num_active, num_beams, -1)  # (A, K, S)
        history.append(
            (
                live_parents.new_zeros(batch_size, num_beams).index_copy(0, active, live_parents),
                live_tokens.new_zeros(batch_size, num_beams).index_copy(0, active, live_tokens),
                step_weights.new_zeros(batch_size, num_beams, step_weights.shape[2]).index_copy(
                    0, active, step_weights
                ),
            )
        )

        # Stopping bound. A live hypothesis with log P = s <= 0 at length t + 1 can only finish
        # at a length n in [t + 2, limit] with log P <= s, so its score is at most
        # s / lp(n) <= s / max(lp(t + 2), lp(limit)): dividing a non-positive s by a larger lp
        # gives a larger score. For α > 0 the max is lp(limit), for α = 0 it is 1 (score <= s),
        # for α < 0 it is lp(t + 2). live_scores[:, 0] is the best live s, and the bound grows
        # with s, so once the N-th finished score reaches it nothing live can enter the top N.
        best_possible = live_scores[:, 0] / torch.maximum(lp[t + 2], lp[active_limits])  # (A,)
        done = at_limit | (active_finished_scores[:, -1] >= best_possible)  # (A,)
        num_done = int(done.sum())  # the one host sync of the step
        if num_done == num_active:
            break
        # Reorder the decoder state to follow each live beam's parent: row a·K + parent.
        parent_rows = torch.arange(num_active, device=device)[:, None] * num_beams + live_parents
        if num_done:
            # Drop the done sentences: their rows leave the state, the source and the scores.
            still = (~done).nonzero()[:, 0]  # (A',) positions among the active sentences
            active, active_limits = active[still], active_limits[still]
            live_scores, live_tokens = live_scores[still], live_tokens[still]
            parent_rows = parent_rows[still]  # (A', K)
            source = source.index_select(still)
        state = tuple(tensor.index_select(0, parent_rows.view(-1)) for tensor in state)
        prev_tokens = live_tokens.view(-1)  # (A', K) -> (A'·K,)

    tokens, attention = _backtrack(
        history, finished_end, finished_parent, finished_token, src.shape[1], pad_id
    )
    lengths = finished_end + 1  # (B, N); 0 for an empty slot
    longest = max(1, int(lengths.max()))
    tokens, attention = tokens[:, :, :longest], attention[:, :, :longest]  # trim to (B, N, L)
    best_longest = max(1, int(lengths[:, 0].max()))
    best = Hypotheses(
        tokens[:, 0, :best_longest],  # (B, L)
        lengths[:, 0],
        attention[:, 0, :best_longest],  # (B, L, S)
        finished_scores[:, 0],
    )
    return BeamOutput(best, tokens, lengths, attention, finished_scores)


def _backtrack(
    history: list[tuple[Tensor, Tensor, Tensor]],
    finished_end: Tensor,
    finished_parent: Tensor,
    finished_token: Tensor,
    src_len: int,
    pad_id: int,
) -> tuple[Tensor, Tensor]:
    """Tokens (B, N, T) and attention (B, N, T, S) of the finished hypotheses, T = len(history).

    Walks from each hypothesis's last step back to step 0: ``cursor`` is the live beam (after step
    t) whose prefix the hypothesis shares, and its parent is the beam it extended at step t.
    """
    batch_size, n_best = finished_end.shape
    num_steps = len(history)
    device = finished_end.device
    dtype = history[0][2].dtype
    tokens = torch.full((batch_size, n_best, num_steps), pad_id, dtype=torch.long, device=device)
    attention = torch.zeros((batch_size, n_best, num_steps, src_len), dtype=dtype, device=device)
    cursor = torch.zeros_like(finished_end)  # (B, N)
    for t in reversed(range(num_steps)):
        parents, step_tokens, weights = history[t]  # (B, K), (B, K), (B, K, S)
        ends_here = finished_end == t  # (B, N)
        covered = finished_end >= t  # (B, N) position t is part of the hypothesis
        parent = torch.where(ends_here, finished_parent, parents.gather(1, cursor))  # (B, N)
        token = torch.where(ends_here, finished_token, step_tokens.gather(1, cursor))  # (B, N)
        # Attention of the parent beam's step, one row per hypothesis: (B, K, S) -> (B, N, S).
        step_attention = weights.gather(1, parent[:, :, None].expand(-1, -1, src_len))
        tokens[:, :, t] = token.masked_fill(~covered, pad_id)
        attention[:, :, t] = step_attention.masked_fill(~covered[:, :, None], 0.0)
        cursor = torch.where(covered, parent, cursor)
    return tokens, attention
