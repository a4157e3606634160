"""Decoding as free functions over any model with ``encode`` and ``decode_step``.

Shape legend: B batch, K beam size, N n-best size, S source length, L output length (at most the
length limit), V vocabulary.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from seq2seq.models.decoder import DecoderState, EncodedSource


class StepwiseModel(Protocol):
    """What decoding needs from a model (``Seq2Seq`` is one): encode once, then step."""

    def encode(self, src: Tensor, src_lens: Tensor) -> tuple[EncodedSource, DecoderState]: ...

    def decode_step(
        self, prev_tokens: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, DecoderState, Tensor]: ...


@dataclass(frozen=True)
class GreedyTask:
    """What greedy decoding of a batch needs besides its source and first state."""

    limits: Tensor  # (B,) each sentence's most tokens, EOS included
    max_steps: int  # the largest limit
    bos_id: int
    eos_id: int
    pad_id: int  # what follows each sentence's end in the tokens


@runtime_checkable
class FusedGreedyModel(Protocol):
    """A model that may decode a whole batch greedily in one call, e.g. in native code
    (``seq2seq.kernels``' accelerated model); None where it cannot: ``greedy_search`` steps."""

    def fused_greedy(
        self, source: EncodedSource, state: DecoderState, task: GreedyTask
    ) -> tuple[Tensor, Tensor, int] | None: ...


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

    A sentence stops decoding at its EOS (or limit); the stepped loop drops the rows of ended
    sentences once half of its rows have ended (``worth_compacting``), so the steps the longer
    ones still need cost the ended ones little (a model's fused loop, ``FusedGreedyModel``,
    decodes only the sentences still going).
    """
    source, state = model.encode(src, src_lens)
    limits = max_output_lengths(src_lens, max_len_a, max_len_b).to(src.device)  # (B,)
    task = GreedyTask(limits, max(1, int(limits.max())), bos_id, eos_id, pad_id)
    fused = None
    if isinstance(model, FusedGreedyModel):  # the same loop in one C call, where it applies
        fused = model.fused_greedy(source, state, task)
    tokens, weights, num_steps = fused or _greedy_steps(model, source, state, task)
    tokens = tokens[:, :num_steps]  # (B, L)
    # A sentence ends at its first EOS, or else at its limit (one token at least).
    is_eos = tokens == eos_id  # (B, L)
    lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, limits.clamp(min=1))
    return Hypotheses(tokens, lengths, weights[:, :num_steps])


def _greedy_steps(
    model: StepwiseModel, source: EncodedSource, state: DecoderState, task: GreedyTask
) -> tuple[Tensor, Tensor, int]:
    """``greedy_search``'s loop over ``decode_step``: tokens (B, L), weights (B, L, S) and the
    number of steps run."""
    limits, max_steps, bos_id, eos_id = task.limits, task.max_steps, task.bos_id, task.eos_id
    batch_size, device = limits.shape[0], limits.device
    # The decoder's rows, each a sentence's row in the outputs (A,); a row whose sentence has
    # ended points at row B, a spare that is cut off at the end, until the rows are compacted.
    active = torch.arange(batch_size, device=device)
    active_limits = limits  # (A,)
    decoding = torch.ones(batch_size, dtype=torch.bool, device=device)  # (A,) not yet ended
    num_decoding = batch_size
    prev_tokens = torch.full((batch_size,), bos_id, dtype=torch.long, device=device)  # (A,)
    # Each step writes its rows in place (PAD and zero weights stay for the finished ones):
    # a step costs as few small ops as possible, which is most of greedy's time here.
    tokens = torch.full((batch_size + 1, max_steps), task.pad_id, dtype=torch.long, device=device)
    weights: Tensor | None = None  # (B + 1, L, S), once the first step gives the dtype
    num_steps = max_steps
    for t in range(max_steps):
        logits, state, step_weights = model.decode_step(prev_tokens, state, source)
        next_tokens = logits.argmax(dim=-1)  # (A,)
        if weights is None:
            weights = step_weights.new_zeros(batch_size + 1, max_steps, step_weights.shape[1])
        tokens[active, t] = next_tokens
        weights[active, t] = step_weights
        finishing = ((next_tokens == eos_id) | (t + 1 >= active_limits)) & decoding  # (A,)
        num_finishing = int(finishing.sum())  # the one host sync of the step
        if num_finishing == num_decoding:
            num_steps = t + 1
            break
        prev_tokens = next_tokens
        if num_finishing:
            num_decoding -= num_finishing
            decoding = decoding & ~finishing
            active = active.masked_fill(finishing, batch_size)
            if worth_compacting(len(active), num_decoding):
                still = decoding.nonzero()[:, 0]  # (A',) the rows still decoding
                active, active_limits, prev_tokens = (
                    active[still],
                    active_limits[still],
                    prev_tokens[still],
                )
                decoding = decoding[still]
                source = source.index_select(still)
                state = tuple(tensor.index_select(0, still) for tensor in state)
    assert weights is not None  # the loop runs at least once
    return tokens[:batch_size], weights[:batch_size], num_steps


def worth_compacting(rows: int, decoding: int) -> bool:
    """Whether greedy search drops its ended sentences' rows from the decoder's batch: once
    half of them have ended. A compaction copies every per-sentence tensor of the source for
    the rows that stay (several heads' keys are a few megabytes a batch, in fresh memory), while
    an ended row costs a step only its share of the step's row-wise work, much of a step being
    fixed cost: compacting at every sentence's end copied the source about 15 times a batch.
    Halving bounds the rows copied over a batch's decoding by the batch itself, and the rows
    decoded for nothing by those still decoding."""
    return 2 * (rows - decoding) >= rows


def length_penalty_factor(lengths: Tensor, alpha: float) -> Tensor:
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ** α (Wu et al. 2016, eq. 14) for lengths of any shape.

    α = 0 gives 1 (raw log-probabilities); larger α favours longer hypotheses.
    """
    return ((5.0 + lengths.float()) / 6.0) ** alpha


# A source word the hypothesis never attended (an exact zero of a sparse normalizer) counts as
# this much coverage in the coverage penalty, whose log would otherwise be -inf.
COVERAGE_FLOOR = 1e-6


def coverage_penalty(coverage: Tensor, is_real: Tensor, beta: float) -> Tensor:
    """GNMT's cp(X; Y) = β Σ_i log(min(Σ_j a_ji, 1)) (Wu et al. 2016, eq. 14) over the real
    source words: coverage (..., S), the attention summed over the hypothesis's steps, float32;
    is_real (..., S) -> (...). 0 when every word got at least 1; below 0 for each one that got
    less (at least ``COVERAGE_FLOOR``)."""
    capped = coverage.clamp(min=COVERAGE_FLOOR, max=1.0).log()  # (..., S), <= 0
    return beta * (capped * is_real).sum(dim=-1)


def is_count(value: object) -> bool:
    """Whether ``value`` is a whole number (a bool is no count, though Python's int says so)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_beam(beam_size: int, n_best: int = 1) -> None:
    """The beam and the n-best list are whole numbers of hypotheses (``is_count``), the beam at
    least 1, the list from 1 to the beam's size."""
    if not is_count(beam_size) or beam_size < 1:
        raise ValueError(f"beam_size must be an integer >= 1, got {beam_size!r}.")
    if not is_count(n_best) or not 1 <= n_best <= beam_size:
        raise ValueError(
            f"n_best must be an integer from 1 to beam_size ({beam_size}), got {n_best!r}."
        )


def check_length_penalty(alpha: float) -> None:
    """α must be a finite number: a NaN or an infinite α makes every normalized score NaN, and
    the search then ranks and stops on garbage. (The stopping bound of ``beam_search`` holds for
    any finite α, negative too; the command line, training and the server take 0 to 10.)"""
    if isinstance(alpha, bool) or not (isinstance(alpha, numbers.Real) and math.isfinite(alpha)):
        raise ValueError(
            f"length_penalty must be a finite number (α of GNMT's length penalty; 0 ranks by "
            f"log-probability), got {alpha!r}."
        )


def check_coverage_penalty(beta: float) -> None:
    """β must be a finite number >= 0: the penalty only lowers scores, which the stopping bound
    of ``beam_search`` relies on."""
    real = isinstance(beta, numbers.Real) and not isinstance(beta, bool)
    if not (real and math.isfinite(beta) and beta >= 0):
        raise ValueError(
            f"coverage_penalty must be a number >= 0 (β of GNMT's coverage penalty; 0 turns it "
            f"off), got {beta!r}."
        )


def best_search(
    model: StepwiseModel,
    src: Tensor,
    src_lens: Tensor,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    beam_size: int = 1,
    length_penalty: float = 0.6,
    max_len_a: float = 2.0,
    max_len_b: int = 10,
    coverage_penalty_weight: float = 0.0,
) -> Hypotheses:
    """Each sentence's one translation: greedy search with a beam of 1 and no coverage penalty
    (which needs finished hypotheses to rank), else ``beam_search``'s best hypothesis."""
    if beam_size == 1 and coverage_penalty_weight == 0:
        return greedy_search(model, src, src_lens, bos_id, eos_id, pad_id, max_len_a, max_len_b)
    return beam_search(
        model, src, src_lens, bos_id, eos_id, pad_id, beam_size=beam_size,
        length_penalty=length_penalty, max_len_a=max_len_a, max_len_b=max_len_b,
        coverage_penalty_weight=coverage_penalty_weight,
    ).best  # fmt: skip


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
    coverage_penalty_weight: float = 0.0,
) -> BeamOutput:
    """Batched beam search: all B sentences and their K beams are decoded together as B·K rows.

    Hypotheses are ranked by log P(Y) / lp(Y) (``length_penalty_factor``, |Y| counts EOS), plus
    GNMT's ``coverage_penalty`` with β = ``coverage_penalty_weight`` > 0 (finished hypotheses
    only, as in Wu et al.: the attention each has summed over its steps). At each
    step the 2K best extensions of the K live hypotheses are taken: an EOS among the first K of
    them moves that hypothesis to its sentence's finished set, and the K best non-EOS extensions
    stay live (each live hypothesis has one EOS extension, so at most K of the 2K end in EOS). A
    hypothesis that reaches the length limit ``max_output_lengths`` without EOS finishes there.
    Search goes on after the first EOS, since with α > 0 a longer hypothesis can still win; a
    sentence stops when no live hypothesis can beat its N-th finished one (``_Beams.beaten``).

    With α = 0, ``beam_size=1`` reproduces ``greedy_search`` exactly. With α > 0 it need not: the
    single live beam continues past a finished EOS hypothesis and may find a longer one whose
    normalized score is higher.
    """
    check_beam(beam_size, n_best)
    check_length_penalty(length_penalty)
    check_coverage_penalty(coverage_penalty_weight)
    device = src.device
    batch_size = src.shape[0]
    source, state = model.encode(src, src_lens)
    # Beam k of sentence b lives in row b·K + k. The K beams of a sentence share its one copy of
    # the encoding (the decoder's ``attend`` reads B·K query rows against B sentences), so only
    # the state is repeated.
    rows = torch.arange(batch_size, device=device).repeat_interleave(beam_size)  # (B·K,)
    state = tuple(tensor.index_select(0, rows) for tensor in state)  # each (B·K, H)
    # A limit below 1 still emits one token, as in greedy_search.
    limits = max_output_lengths(src_lens, max_len_a, max_len_b).to(device).clamp(min=1)  # (B,)
    beams = _Beams.start(
        limits, beam_size, n_best, length_penalty, coverage_penalty_weight,
        torch.arange(src.shape[1], device=device)[None, :] < src_lens.to(device)[:, None],
    )  # fmt: skip
    prev_tokens = torch.full((batch_size * beam_size,), bos_id, dtype=torch.long, device=device)
    num_steps = beams.max_steps
    for t in range(beams.max_steps):
        logits, state, weights = model.decode_step(prev_tokens, state, source)
        candidates = beams.expand(logits, eos_id)
        at_limit = beams.limits <= t + 1  # (A,) every candidate now has t + 1 tokens
        beams.finish(t, candidates, at_limit, weights)
        live_codes = beams.keep_live(t, candidates, weights)  # (A, K)
        done = at_limit | beams.beaten(t)  # (A,)
        num_done = int(done.sum())  # the one host sync of the step
        if num_done == len(done):
            num_steps = t + 1
            break
        # Reorder the decoder state to follow each live beam's parent: row a·K + parent.
        parent_rows = beams.row_base + live_codes // candidates.vocab_size  # (A, K)
        if num_done:  # the done sentences leave the batch: the state, the source and the beams
            still = beams.drop(done)  # (A',) positions among the active sentences
            live_codes, parent_rows = live_codes[still], parent_rows[still]  # (A', K)
            source = source.index_select(still)
        state = tuple(tensor.index_select(0, parent_rows.view(-1)) for tensor in state)
        beams.follow(parent_rows)
        prev_tokens = (live_codes % candidates.vocab_size).view(-1)  # (A', K) -> (A'·K,)
    return beams.output(num_steps, candidates.vocab_size, pad_id)


@dataclass(frozen=True)
class _Candidates:
    """One step's 2K best extensions of each active sentence's K live beams, best first."""

    scores: Tensor  # (A, 2K) raw log P
    codes: Tensor  # (A, 2K) each one's index among its sentence's K·V extensions, k·V + token
    is_eos: Tensor  # (A, 2K)
    vocab_size: int


@dataclass
class _Beams:
    """``beam_search`` between two steps: the live beams of the sentences still searching (the
    active ones, A of the B), their N best finished hypotheses, and what backtracking reads.

    A candidate of step t is coded as its index among its sentence's K·V extensions, k·V + token
    (k: the live beam it extends), and a finished hypothesis as t·K·V + that index. One integer
    carries the end step, the parent beam and the last token, so keeping the N best moves one
    tensor, and backtracking through the live beams' per-step codes recovers the rest. Only the
    N best finished hypotheses ever matter (the output and the stopping rule read nothing
    else): each active sentence keeps N slots, best first (-inf: empty), which go to the (B, N)
    results when the sentence leaves the batch.
    """

    num_beams: int  # K
    max_steps: int  # the largest length limit
    lp_of: list[float]  # lp(n) of each length n up to max_steps + 1, as Python floats
    # The sentences still searching, in the order of their rows: active sentence a owns rows
    # a·K .. a·K + K - 1. A sentence is dropped as soon as it is done, so the steps that the
    # others still need cost nothing for it.
    active: Tensor  # (A,)
    limits: Tensor  # (A,) each active sentence's length limit
    limit_lp: Tensor  # (A,) lp(limit)
    row_base: Tensor  # (A, 1) each active sentence's first row
    # Raw log P of the live hypotheses. At the start all K beams hold the same prefix <bos>, so
    # only beam 0 may expand; the others start at -inf and the first step fills the beam with
    # distinct tokens instead of K copies of the best one.
    live_scores: Tensor  # (A, K)
    active_scores: Tensor  # (A, N) the active sentences' N best finished, best first
    active_codes: Tensor  # (A, N) their codes
    finished_scores: Tensor  # (B, N), final for the sentences no longer active
    finished_codes: Tensor  # (B, N)
    # Per step t, for every sentence (zeros for those already done, which backtracking never
    # reads): the live beams' codes (B, L, K), and the attention (B, L, K, S) each beam of step
    # t - 1 used to produce the token at position t, allocated when the first step gives S's dtype.
    history_codes: Tensor
    history_weights: Tensor | None
    # GNMT's coverage penalty (β > 0): each live row's attention summed over its steps
    # (A·K, S), float32, reordered with the beams (None before the first step: zeros), and the
    # rows' sums with this step's attention, step_coverage (``finish``), which ``follow`` reorders.
    penalty_weight: float  # β
    real_keys: Tensor  # (B, S) the source positions that are words, not padding
    live_coverage: Tensor | None = None
    step_coverage: Tensor | None = None

    @staticmethod
    def start(
        limits: Tensor,
        num_beams: int,
        n_best: int,
        length_penalty: float,
        penalty_weight: float,
        real_keys: Tensor,
    ) -> _Beams:
        """Every sentence active, beam 0 of each live at <bos>, nothing finished."""
        batch_size, device = len(limits), limits.device
        max_steps = int(limits.max())
        lp = length_penalty_factor(torch.arange(max_steps + 2, device=device), length_penalty)
        active = torch.arange(batch_size, device=device)  # (A,)
        live_scores = torch.full((batch_size, num_beams), float("-inf"), device=device)
        live_scores[:, 0] = 0.0
        active_scores = torch.full((batch_size, n_best), float("-inf"), device=device)
        active_codes = torch.full((batch_size, n_best), -1, dtype=torch.long, device=device)
        history_codes = torch.zeros(
            (batch_size, max_steps, num_beams), dtype=torch.long, device=device
        )
        return _Beams(
            num_beams=num_beams,
            max_steps=max_steps,
            lp_of=lp.tolist(),  # Python floats for the per-step divisions: one op each
            active=active,
            limits=limits,
            limit_lp=lp[limits],
            row_base=active[:, None] * num_beams,
            live_scores=live_scores,
            active_scores=active_scores,
            active_codes=active_codes,
            finished_scores=torch.empty_like(active_scores),
            finished_codes=torch.empty_like(active_codes),
            history_codes=history_codes,
            history_weights=None,
            penalty_weight=penalty_weight,
            real_keys=real_keys,
        )

    def expand(self, logits: Tensor, eos_id: int) -> _Candidates:
        """The 2K best extensions of each active sentence's live beams by this step's logits
        (A·K, V)."""
        num_active, vocab_size = self.live_scores.shape[0], logits.shape[-1]
        span = self.num_beams * vocab_size  # candidates per sentence
        log_probs = logits.float().log_softmax(dim=-1)  # (A·K, V), float32 for the sums below
        # Every extension of every live beam, per sentence: (A·K, V) -> (A, K, V) -> (A, K·V).
        extended = self.live_scores[:, :, None] + log_probs.view(
            num_active, self.num_beams, vocab_size
        )
        # (A, 2K) best first, and their codes k·V + token.
        scores, codes = extended.view(num_active, span).topk(min(2 * self.num_beams, span), dim=1)
        return _Candidates(scores, codes, codes % vocab_size == eos_id, vocab_size)

    def finish(self, t: int, candidates: _Candidates, at_limit: Tensor, weights: Tensor) -> None:
        """Step t's finished hypotheses merged into each active sentence's N best.

        A candidate finishes if it ends in EOS or hits the limit (``at_limit`` (A,)), and only
        if it ranks among the first K: a beam of K would have kept it (this is what makes K = 1
        greedy). Dead beams (-inf) add nothing. ``weights`` (A·K, S): this step's attention,
        which the coverage penalty adds to each row's."""
        num_beams, vocab_size = self.num_beams, candidates.vocab_size
        first_scores = candidates.scores[:, :num_beams]  # (A, K)
        is_end = candidates.is_eos[:, :num_beams] | at_limit[:, None]
        finishing = is_end & (first_scores > float("-inf"))  # (A, K)
        normalized = first_scores / self.lp_of[t + 1]  # (A, K)
        if self.penalty_weight > 0:
            # The attention of each row's extensions, this step's included: (A·K, S).
            step = weights.float()
            summed = step if self.live_coverage is None else self.live_coverage + step
            is_real = self.real_keys[self.active].repeat_interleave(num_beams, 0)  # (A·K, S)
            penalty = coverage_penalty(summed, is_real, self.penalty_weight)  # (A·K,)
            parents = candidates.codes[:, :num_beams] // vocab_size  # (A, K): each one's beam
            num_active = first_scores.shape[0]
            normalized = normalized + penalty.view(num_active, num_beams).gather(1, parents)
            self.step_coverage = summed  # what ``follow`` reorders
        new_scores = torch.where(finishing, normalized, float("-inf"))
        # Merge with the finished set and keep the N best: (A, N + K) -> (A, N).
        n_best = self.active_scores.shape[1]
        merged = torch.cat([self.active_scores, new_scores], dim=1)
        self.active_scores, keep = merged.topk(n_best, dim=1)
        new_codes = candidates.codes[:, :num_beams] + t * num_beams * vocab_size  # (A, K)
        self.active_codes = torch.cat([self.active_codes, new_codes], dim=1).gather(1, keep)

    def keep_live(self, t: int, candidates: _Candidates, weights: Tensor) -> Tensor:
        """The K best non-EOS candidates stay live: their log P, and step t's history of every
        active sentence (the live codes, and the attention ``weights`` (A·K, S) of the rows they
        extend). Returns the live codes (A, K). They all have the same length, so raw log P
        ranks them as the normalized score would."""
        non_eos_scores = candidates.scores.masked_fill(candidates.is_eos, float("-inf"))
        # (A, K) log P and (A, K) positions among the 2K candidates.
        self.live_scores, live_slots = non_eos_scores.topk(self.num_beams, dim=1)
        live_codes = candidates.codes.gather(1, live_slots)  # (A, K)
        # Rows are a·K + k, so (A·K, S) -> (A, K, S) groups each sentence's beams.
        num_active = live_codes.shape[0]
        step_weights = weights.view(num_active, self.num_beams, -1)  # (A, K, S)
        if self.history_weights is None:
            batch_size, max_steps = self.history_codes.shape[:2]
            self.history_weights = step_weights.new_zeros(
                batch_size, max_steps, self.num_beams, step_weights.shape[2]
            )
        if num_active == self.history_codes.shape[0]:  # a slice copy beats scattering rows
            self.history_codes[:, t] = live_codes
            self.history_weights[:, t] = step_weights
        else:
            self.history_codes[self.active, t] = live_codes
            self.history_weights[self.active, t] = step_weights
        return live_codes

    def beaten(self, t: int) -> Tensor:
        """(A,) whether no live hypothesis of a sentence can enter its N best after step t.

        A live hypothesis with log P = s <= 0 at length t + 1 can only finish at a length n in
        [t + 2, limit] with log P <= s, so its score is at most s / max(lp(t + 2), lp(limit)):
        dividing a non-positive s by a larger lp gives a larger score. For α > 0 the max is
        lp(limit), for α = 0 it is 1 (score <= s), for α < 0 it is lp(t + 2). live_scores[:, 0]
        is the best live s, and the bound grows with s, so once the N-th finished score reaches
        it nothing live can enter the top N."""
        best_possible = self.live_scores[:, 0] / self.limit_lp.clamp(min=self.lp_of[t + 2])
        return self.active_scores[:, -1] >= best_possible

    def drop(self, done: Tensor) -> Tensor:
        """The ``done`` (A,) sentences leave: every active one's N best go to the results
        (final for the done ones), and the done ones' rows leave the beams. Returns the
        positions (A',) of those still searching among the active ones."""
        self.settle()
        still = (~done).nonzero()[:, 0]  # (A',)
        self.active, self.limits = self.active[still], self.limits[still]
        self.limit_lp, self.row_base = self.limit_lp[still], self.row_base[: len(still)]
        self.live_scores = self.live_scores[still]
        self.active_scores, self.active_codes = self.active_scores[still], self.active_codes[still]
        return still

    def follow(self, parent_rows: Tensor) -> None:
        """The coverage penalty's per-row sums follow the live beams to their parents' rows,
        ``parent_rows`` (A', K)."""
        if self.step_coverage is not None:
            self.live_coverage = self.step_coverage.index_select(0, parent_rows.view(-1))

    def settle(self) -> None:
        """The active sentences' N best into the (B, N) results."""
        self.finished_scores.index_copy_(0, self.active, self.active_scores)
        self.finished_codes.index_copy_(0, self.active, self.active_codes)

    def output(self, num_steps: int, vocab_size: int, pad_id: int) -> BeamOutput:
        """Every sentence's N best, backtracked through the ``num_steps`` steps' history."""
        self.settle()
        assert self.history_weights is not None  # the loop runs at least once
        # An empty slot (-inf) may hold any candidate's code; it has no end step.
        empty = self.finished_scores == float("-inf")
        codes = self.finished_codes.masked_fill(empty, -1)
        tokens, attention, lengths = _backtrack(
            self.history_codes[:, :num_steps], self.history_weights[:, :num_steps], codes,
            vocab_size, pad_id,
        )  # fmt: skip
        longest = max(1, int(lengths.max()))
        tokens, attention = tokens[:, :, :longest], attention[:, :, :longest]  # (B, N, L)
        best_longest = max(1, int(lengths[:, 0].max()))
        best = Hypotheses(
            tokens[:, 0, :best_longest],  # (B, L)
            lengths[:, 0],
            attention[:, 0, :best_longest],  # (B, L, S)
            self.finished_scores[:, 0],
        )
        return BeamOutput(best, tokens, lengths, attention, self.finished_scores)


def _backtrack(
    history_codes: Tensor,
    history_weights: Tensor,
    finished_codes: Tensor,
    vocab_size: int,
    pad_id: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Tokens (B, N, T), attention (B, N, T, S) and lengths (B, N) of the finished hypotheses.

    ``history_codes`` (B, T, K) holds each step's live beams as k·V + token (k: the live beam of
    the step before that it extends), ``history_weights`` (B, T, K, S) the attention of each row
    of each step, and ``finished_codes`` (B, N) each hypothesis as t·K·V + k·V + token (-1: an
    empty slot). Walks from each hypothesis's last step back to step 0: ``cursor`` is the live
    beam (after step t) whose prefix the hypothesis shares, and its parent is the beam it
    extended at step t.
    """
    batch_size, num_steps, num_beams = history_codes.shape
    span = num_beams * vocab_size
    ends = torch.where(finished_codes >= 0, finished_codes // span, -1)  # (B, N) end steps
    last_codes = finished_codes % span  # (B, N) k·V + token of the last step
    n_best = ends.shape[1]
    tokens = torch.empty((batch_size, n_best, num_steps), dtype=torch.long, device=ends.device)
    parents = torch.empty_like(tokens)  # (B, N, T) the beam each position's token extended
    cursor = torch.zeros_like(ends)  # (B, N)
    for t in reversed(range(num_steps)):
        covered = ends >= t  # (B, N) position t is part of the hypothesis
        code = torch.where(ends == t, last_codes, history_codes[:, t].gather(1, cursor))
        parent = code // vocab_size  # (B, N)
        tokens[:, :, t] = torch.where(covered, code % vocab_size, pad_id)
        parents[:, :, t] = parent
        cursor = torch.where(covered, parent, cursor)
    # Each position's attention is that of its parent beam's row: (B, T, K, S) -> (B, T, N, S).
    src_len = history_weights.shape[3]
    index = parents.transpose(1, 2)[:, :, :, None].expand(-1, -1, -1, src_len)  # (B, T, N, S)
    attention = history_weights.gather(2, index).transpose(1, 2)  # (B, N, T, S)
    positions = torch.arange(num_steps, device=ends.device)  # (T,)
    covered = positions <= ends[:, :, None]  # (B, N, T)
    attention = attention.masked_fill(~covered[:, :, :, None], 0.0)
    return tokens, attention, ends + 1  # lengths: 0 for an empty slot
