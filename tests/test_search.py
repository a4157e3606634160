"""Beam search against references: greedy search, one-by-one decoding, exhaustive enumeration.

Shape legend: B batch, N n-best size, S source length, L output length, V vocabulary.
"""

from __future__ import annotations

import itertools
from functools import partial
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from seq2seq.attention import AdditiveAttention, AttentionParts, DotProductAttention
from seq2seq.models.decoder import (
    AttentionFactory,
    BahdanauDecoder,
    DecoderState,
    EncodedSource,
    LuongDecoder,
)
from seq2seq.models.model import Seq2Seq
from seq2seq.models.transformer import Transformer
from seq2seq.search import (
    beam_search,
    greedy_search,
    length_penalty_factor,
    max_output_lengths,
)
from seq2seq.search_reference import beam_search_reference

ATTENTIONS: dict[str, AttentionFactory] = {
    "additive": partial(AdditiveAttention, num_hiddens=12),
    "dot": partial(DotProductAttention, scaled=True),
}
PAD, BOS, EOS = 0, 2, 3


def make_model(
    seed: int,
    attention: str = "additive",
    tgt_vocab_size: int = 11,
    eos_bias: float = 0.0,
    input_feeding: bool = False,
    coverage: bool = False,
) -> Seq2Seq:
    """A small random model in eval mode; ``eos_bias`` makes EOS likelier so hypotheses vary.
    A Bahdanau decoder, or with ``input_feeding`` an input-fed Luong decoder; with ``coverage``,
    its coverage weights drawn at random (they start at 0, where coverage changes nothing)."""
    torch.manual_seed(seed)
    model = Seq2Seq(
        src_vocab_size=13,
        tgt_vocab_size=tgt_vocab_size,
        attention=ATTENTIONS[attention],
        embedding_size=8,
        hidden_size=16,
        dropout=0.3,
        decoder=LuongDecoder if input_feeding else BahdanauDecoder,
        input_feeding=input_feeding,
        attention_parts=AttentionParts(coverage=coverage),
    ).eval()
    with torch.no_grad():
        model.decoder.output_layer.bias[EOS] += eos_bias
        if coverage:
            model.decoder.attention.coverage_weight.normal_(std=2.0)
    return model


def make_batch(seed: int, src_lens: list[int]) -> tuple[Tensor, Tensor]:
    """Random source ids (B, S) with padding after each length, and the lengths (B,)."""
    generator = torch.Generator().manual_seed(seed)
    lens = torch.tensor(src_lens)
    src = torch.randint(4, 13, (len(src_lens), max(src_lens)), generator=generator)
    src[torch.arange(src.shape[1])[None, :] >= lens[:, None]] = PAD
    return src, lens


def sequence_log_probs(
    model: nn.Module, src: Tensor, src_lens: Tensor, tokens: Tensor, lengths: Tensor
) -> Tensor:
    """log P of each row of ``tokens`` (B, L) up to its length (B,), by teacher forcing."""
    tgt_in = torch.cat([torch.full_like(tokens[:, :1], BOS), tokens[:, :-1]], dim=1)  # (B, L)
    with torch.no_grad():
        logits, _ = model(src, src_lens, tgt_in)  # (B, L, V)
    token_log_probs = logits.log_softmax(-1).gather(2, tokens[:, :, None])[:, :, 0]  # (B, L)
    inside = torch.arange(tokens.shape[1])[None, :] < lengths[:, None]  # (B, L)
    return (token_log_probs * inside).sum(dim=1)  # (B,)


def all_sequences(vocab_size: int, limit: int) -> list[list[int]]:
    """Every output beam search can produce under ``limit``: ends in EOS, or has ``limit`` tokens.

    Any token may follow any other (beam search masks none), so PAD and BOS count as words.
    """
    words = [token for token in range(vocab_size) if token != EOS]
    sequences = []
    for length in range(1, limit + 1):
        last_tokens = range(vocab_size) if length == limit else [EOS]
        for prefix in itertools.product(words, repeat=length - 1):
            sequences += [[*prefix, last] for last in last_tokens]
    return sequences


def exhaustive_ranking(
    model: nn.Module, src: Tensor, src_lens: Tensor, limit: int, alpha: float, vocab_size: int
) -> tuple[list[list[int]], Tensor]:
    """All sequences of one sentence (src (1, S)) ranked by log P / lp, and their scores."""
    sequences = all_sequences(vocab_size, limit)
    count = len(sequences)
    tokens = torch.full((count, limit), PAD)  # (number of sequences, L)
    for row, sequence in enumerate(sequences):
        tokens[row, : len(sequence)] = torch.tensor(sequence)
    lengths = torch.tensor([len(sequence) for sequence in sequences])
    log_probs = sequence_log_probs(
        model, src.expand(count, -1), src_lens.expand(count), tokens, lengths
    )
    scores = log_probs / length_penalty_factor(lengths, alpha)
    order = scores.argsort(descending=True)
    return [sequences[i] for i in order.tolist()], scores[order]


def output_tokens(tokens: Tensor, length: Tensor) -> list[int]:
    return [int(token) for token in tokens[: int(length)]]


@pytest.mark.parametrize("coverage", [False, True], ids=["", "coverage"])
@pytest.mark.parametrize("attention", list(ATTENTIONS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_size_one_is_greedy_without_length_penalty(
    attention: str, seed: int, coverage: bool
) -> None:
    model = make_model(seed, attention, eos_bias=1.0, coverage=coverage)
    src, src_lens = make_batch(seed, [6, 2, 4, 5])
    assert_beam_one_is_greedy(model, src, src_lens)


def assert_beam_one_is_greedy(model: Seq2Seq, src: Tensor, src_lens: Tensor) -> None:
    """With no length penalty, a beam of one makes exactly greedy's choices (any decoder)."""
    greedy = greedy_search(model, src, src_lens, BOS, EOS, PAD, max_len_a=1.0, max_len_b=3)
    beam = beam_search(
        model, src, src_lens, BOS, EOS, PAD, beam_size=1, length_penalty=0.0, max_len_a=1.0,
        max_len_b=3,
    ).best  # fmt: skip
    assert torch.equal(beam.tokens, greedy.tokens)
    assert torch.equal(beam.lengths, greedy.lengths)
    torch.testing.assert_close(beam.attention, greedy.attention)


@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_batch_equals_one_by_one(attention: str) -> None:
    model = make_model(3, attention, eos_bias=1.0)
    src, src_lens = make_batch(3, [7, 2, 5, 3])
    batch = beam_search(model, src, src_lens, BOS, EOS, PAD, beam_size=4, n_best=3)
    for b in range(src.shape[0]):
        n = int(src_lens[b])
        alone = beam_search(
            model, src[b : b + 1, :n], src_lens[b : b + 1], BOS, EOS, PAD, beam_size=4, n_best=3
        )
        assert torch.equal(batch.lengths[b], alone.lengths[0])
        for rank in range(3):
            length = int(alone.lengths[0, rank])
            assert output_tokens(batch.tokens[b, rank], batch.lengths[b, rank]) == output_tokens(
                alone.tokens[0, rank], alone.lengths[0, rank]
            )
            torch.testing.assert_close(
                batch.attention[b, rank, :length, :n],
                alone.attention[0, rank, :length],
                atol=1e-5,
                rtol=1e-5,
            )
        torch.testing.assert_close(batch.scores[b], alone.scores[0], atol=1e-5, rtol=1e-5)
        # Padded source positions get no attention.
        assert (batch.attention[b, :, :, n:] == 0).all()


@pytest.mark.parametrize("alpha", [0.0, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_large_beam_finds_the_exhaustive_argmax(seed: int, alpha: float) -> None:
    vocab_size, limit, n_best = 5, 3, 4
    model = make_model(seed, tgt_vocab_size=vocab_size, eos_bias=1.5)
    src, src_lens = make_batch(seed, [4, 3])
    # A beam of V^L holds every prefix, so nothing is ever pruned: the search is exhaustive
    # except for the early stop, whose bound is what this test checks.
    beam_size = vocab_size**limit
    result = beam_search(
        model, src, src_lens, BOS, EOS, PAD, beam_size, alpha, max_len_a=0.0, max_len_b=limit,
        n_best=n_best,
    )  # fmt: skip
    for b in range(src.shape[0]):
        n = int(src_lens[b])
        ranking, scores = exhaustive_ranking(
            model, src[b : b + 1, :n], src_lens[b : b + 1], limit, alpha, vocab_size
        )
        found = [output_tokens(result.tokens[b, r], result.lengths[b, r]) for r in range(n_best)]
        assert found == ranking[:n_best]
        torch.testing.assert_close(result.scores[b], scores[:n_best], atol=1e-5, rtol=1e-5)
        assert output_tokens(result.best.tokens[b], result.best.lengths[b]) == ranking[0]


WORD = 4  # the one real word of ScriptedModel's vocabulary {PAD, 1, BOS, EOS, WORD}


def distribution(eos: float, word: float) -> Tensor:
    """Probabilities (V,) with EOS and WORD given and the other three tokens sharing the rest."""
    rest = (1.0 - eos - word) / 3
    return torch.tensor([rest, rest, rest, eos, word])


class ScriptedModel:
    """A stand-in with hand-set probabilities, to build cases where the search rules decide.

    After <bos>: ``first`` = (P(EOS), P(WORD)). After the n-th WORD: WORD has ``next_word`` and
    EOS half of what is left while n < ``words_before_eos``, then EOS has 0.99. After anything
    else: uniform. Attention is uniform over the source.
    """

    def __init__(self, first: tuple[float, float], next_word: float, words_before_eos: int) -> None:
        self.first = distribution(*first)
        self.continue_ = distribution((1.0 - next_word) / 2, next_word)
        self.end = distribution(0.99, 0.0025)
        self.words_before_eos = words_before_eos

    def encode(self, src: Tensor, src_lens: Tensor) -> tuple[EncodedSource, DecoderState]:
        memory = torch.zeros(src.shape[0], src.shape[1], 1)  # (B, S, 1): nothing to read
        steps = torch.zeros(src.shape[0], 1)  # (B, 1): the state counts decoded tokens
        return EncodedSource(memory, memory, memory, src_lens), (steps,)

    def decode_step(
        self, prev_tokens: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, DecoderState, Tensor]:
        steps = state[0][:, 0]  # (B,)
        after_word = torch.where(
            (steps < self.words_before_eos)[:, None], self.continue_, self.end
        )  # (B, V)
        uniform = torch.full_like(self.first, 1.0 / len(self.first))
        probs = torch.where(
            (steps == 0)[:, None],
            self.first,
            torch.where((prev_tokens == WORD)[:, None], after_word, uniform),
        )  # (B, V)
        src_len = source.memory.shape[1]
        weights = torch.full((len(prev_tokens), src_len), 1.0 / src_len)  # (B, S)
        return probs.log(), (state[0] + 1,), weights


def decode_one(model: ScriptedModel, beam_size: int, alpha: float) -> tuple[list[int], Tensor]:
    src, src_lens = torch.ones(1, 3, dtype=torch.long), torch.tensor([3])  # limit 2 · 3 + 10
    result = beam_search(model, src, src_lens, BOS, EOS, PAD, beam_size, alpha)
    assert result.best.scores is not None
    return output_tokens(result.best.tokens[0], result.best.lengths[0]), result.best.scores[0]


@pytest.mark.parametrize("beam_size", [1, 2, 4])
@pytest.mark.parametrize("words", [1, 4])
def test_length_normalization_lets_a_longer_hypothesis_win(beam_size: int, words: int) -> None:
    # "EOS" has log P = log 0.5 = -0.69; "WORD^n EOS" has log 0.48 + n log 0.99 = -0.74 (n = 1)
    # or log 0.43 + 4 log 0.99 = -0.88 (n = 4). Without normalization "EOS" wins; with α = 1 the
    # longer one wins: -0.74 / lp(2) = -0.64 and -0.88 / lp(5) = -0.53. With n = 4 a stop after
    # "EOS" that bounded the live "WORD" (-0.84) by lp(2) instead of lp(limit) would miss it.
    model = ScriptedModel(first=(0.5, 0.48 if words == 1 else 0.43), next_word=0.99,
                          words_before_eos=words)  # fmt: skip
    longer = [WORD] * words + [EOS]
    for alpha, expected in [(0.0, [EOS]), (1.0, longer)]:
        tokens, score = decode_one(model, beam_size, alpha)
        assert tokens == expected
        # The distribution each token was drawn from: the first, then one per WORD before it.
        steps = [model.first] + [
            model.continue_ if words_so_far < words else model.end
            for words_so_far in range(1, len(expected))
        ]
        log_p = sum(float(probs[token].log()) for probs, token in zip(steps, expected, strict=True))
        lp = length_penalty_factor(torch.tensor(len(expected)), alpha)
        torch.testing.assert_close(score, torch.tensor(log_p) / lp)


def test_eos_finishes_only_among_the_top_k_so_one_beam_is_greedy() -> None:
    # WORD leads at every step until EOS, so greedy returns "WORD WORD WORD EOS" with
    # log P = 3 log 0.6 + log 0.99 = -1.54, although "EOS" alone has log 0.3 = -1.20. One beam
    # must still return greedy's answer (EOS was second, outside a beam of 1); two beams find "EOS".
    model = ScriptedModel(first=(0.3, 0.6), next_word=0.6, words_before_eos=3)
    src, src_lens = torch.ones(1, 3, dtype=torch.long), torch.tensor([3])
    greedy = greedy_search(model, src, src_lens, BOS, EOS, PAD)
    assert output_tokens(greedy.tokens[0], greedy.lengths[0]) == [WORD, WORD, WORD, EOS]
    one_beam, one_score = decode_one(model, beam_size=1, alpha=0.0)
    two_beams, two_score = decode_one(model, beam_size=2, alpha=0.0)
    assert one_beam == [WORD, WORD, WORD, EOS] and two_beams == [EOS]
    assert two_score > one_score


def test_a_done_sentence_gains_nothing_while_others_decode() -> None:
    # The first sentence's limit is 1 token, the second's 5; WORD WORD ... keeps log P near
    # log 0.6, so with α = 1 each extra WORD would raise the score. Once the first sentence is
    # done, the steps the second still needs must not extend it.
    model = ScriptedModel(first=(0.3, 0.6), next_word=0.99, words_before_eos=10)
    src, src_lens = torch.ones(2, 5, dtype=torch.long), torch.tensor([1, 5])
    batch = beam_search(model, src, src_lens, BOS, EOS, PAD, 2, 1.0, max_len_a=1.0, max_len_b=0)
    assert batch.best.lengths.tolist() == [1, 5]
    for b in range(2):
        n = int(src_lens[b])
        alone = beam_search(
            model, src[b : b + 1, :n], src_lens[b : b + 1], BOS, EOS, PAD, 2, 1.0, 1.0, 0
        )
        assert torch.equal(batch.best.tokens[b, :n], alone.best.tokens[0])
        assert batch.best.scores is not None and alone.best.scores is not None
        torch.testing.assert_close(batch.best.scores[b], alone.best.scores[0])


def test_n_best_is_sorted_distinct_and_led_by_the_best() -> None:
    model = make_model(4, eos_bias=1.0)
    src, src_lens = make_batch(4, [5, 3, 6])
    result = beam_search(model, src, src_lens, BOS, EOS, PAD, beam_size=6, n_best=6)
    assert result.tokens.shape[:2] == (3, 6) and result.scores.shape == (3, 6)
    assert (result.scores[:, :-1] >= result.scores[:, 1:]).all()
    assert result.best.scores is not None
    torch.testing.assert_close(result.best.scores, result.scores[:, 0])
    assert torch.equal(result.best.lengths, result.lengths[:, 0])
    for b in range(3):
        n_best = [output_tokens(result.tokens[b, r], result.lengths[b, r]) for r in range(6)]
        assert len({tuple(tokens) for tokens in n_best}) == 6
        assert output_tokens(result.best.tokens[b], result.best.lengths[b]) == n_best[0]
        # Each score is the normalized log-probability of its own sequence.
        tokens = result.tokens[b]  # (N, L)
        log_probs = sequence_log_probs(
            model, src[b : b + 1].expand(6, -1), src_lens[b].expand(6), tokens, result.lengths[b]
        )
        expected = log_probs / length_penalty_factor(result.lengths[b], 0.6)
        torch.testing.assert_close(result.scores[b], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_attention_is_that_of_teacher_forcing_the_chosen_hypothesis(attention: str) -> None:
    model = make_model(5, attention, eos_bias=1.0)
    src, src_lens = make_batch(5, [6, 3, 5])
    result = beam_search(model, src, src_lens, BOS, EOS, PAD, beam_size=5, n_best=3)
    for rank in range(3):
        tokens = result.tokens[:, rank]  # (B, L)
        tgt_in = torch.cat([torch.full_like(tokens[:, :1], BOS), tokens[:, :-1]], dim=1)
        with torch.no_grad():
            _, weights = model(src, src_lens, tgt_in)  # (B, L, S)
        assert weights is not None
        for b in range(3):
            length = int(result.lengths[b, rank])
            torch.testing.assert_close(
                result.attention[b, rank, :length], weights[b, :length], atol=1e-5, rtol=1e-5
            )
            assert (result.attention[b, rank, length:] == 0).all()
    length = int(result.best.lengths[0])
    torch.testing.assert_close(
        result.best.attention[0], result.attention[0, 0, : result.best.tokens.shape[1]]
    )
    assert (result.best.attention[0, length:] == 0).all()


@pytest.mark.parametrize(("max_len_a", "max_len_b"), [(0.0, 1), (0.5, 2), (1.5, 0)])
def test_outputs_respect_the_length_limit(max_len_a: float, max_len_b: int) -> None:
    model = make_model(6, eos_bias=-3.0)  # EOS unlikely: most hypotheses run into the limit
    src, src_lens = make_batch(6, [5, 2, 3])
    limits = max_output_lengths(src_lens, max_len_a, max_len_b)  # (B,)
    result = beam_search(
        model, src, src_lens, BOS, EOS, PAD, beam_size=3, max_len_a=max_len_a, max_len_b=max_len_b,
        n_best=3,
    )  # fmt: skip
    for b in range(3):
        for rank in range(3):
            length = int(result.lengths[b, rank])
            assert 1 <= length <= int(limits[b])
            tokens = result.tokens[b, rank]
            assert (tokens[length:] == PAD).all()
            assert (tokens[: length - 1] != EOS).all()  # EOS only ever ends a hypothesis
            assert int(tokens[length - 1]) == EOS or length == int(limits[b])


@pytest.mark.parametrize(
    ("beam_size", "n_best", "argument"),
    [(0, 1, "beam_size"), (-2, 1, "beam_size"), (3, 0, "n_best"), (3, 4, "n_best")],
)
def test_invalid_beam_size_or_n_best_is_refused(beam_size: int, n_best: int, argument: str) -> None:
    model = make_model(0)
    src, src_lens = make_batch(0, [3])
    value = beam_size if argument == "beam_size" else n_best
    with pytest.raises(ValueError, match=rf"^{argument} must .*, got {value}\.$"):
        beam_search(model, src, src_lens, BOS, EOS, PAD, beam_size=beam_size, n_best=n_best)


class RowCounting:
    """Wraps a model and records how many rows each ``decode_step`` call decodes."""

    def __init__(self, model: Seq2Seq) -> None:
        self.model = model
        self.rows: list[int] = []

    def encode(self, src: Tensor, src_lens: Tensor) -> tuple[EncodedSource, DecoderState]:
        return self.model.encode(src, src_lens)

    def decode_step(
        self, prev_tokens: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, DecoderState, Tensor]:
        self.rows.append(len(prev_tokens))
        return self.model.decode_step(prev_tokens, state, source)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_done_sentences_leave_the_batch_and_the_outputs_do_not_change(beam_size: int) -> None:
    # EOS is unlikely, so each sentence runs to its limit: 1, 3 and 7 tokens (max_len_a = 1).
    model = make_model(7, eos_bias=-5.0)
    src, src_lens = make_batch(7, [1, 3, 7])
    counting = RowCounting(model)
    if beam_size == 1:
        batch = greedy_search(counting, src, src_lens, BOS, EOS, PAD, max_len_a=1.0, max_len_b=0)
    else:
        batch = beam_search(
            counting, src, src_lens, BOS, EOS, PAD, beam_size, max_len_a=1.0, max_len_b=0
        ).best
    if beam_size == 1:
        # Greedy search keeps an ended sentence's row until half the rows have ended: all
        # three rows until the third step, then the longest alone.
        assert counting.rows == [3] * 3 + [1] * 4
    else:
        # Three sentences for one step, two until the third step, then the longest alone.
        assert counting.rows == [3 * beam_size] + [2 * beam_size] * 2 + [beam_size] * 4
    assert batch.lengths.tolist() == [1, 3, 7]
    for b in range(3):
        n = int(src_lens[b])
        if beam_size == 1:
            alone = greedy_search(
                model, src[b : b + 1, :n], src_lens[b : b + 1], BOS, EOS, PAD, 1.0, 0
            )
        else:
            alone = beam_search(
                model, src[b : b + 1, :n], src_lens[b : b + 1], BOS, EOS, PAD, beam_size,
                max_len_a=1.0, max_len_b=0,
            ).best  # fmt: skip
        assert torch.equal(batch.tokens[b, :n], alone.tokens[0])
        assert (batch.tokens[b, n:] == PAD).all() and (batch.attention[b, n:] == 0).all()
        torch.testing.assert_close(
            batch.attention[b, :n, :n], alone.attention[0], atol=1e-5, rtol=1e-5
        )


def test_ranks_without_a_hypothesis_are_empty_slots() -> None:
    """A vocabulary of 4 and a length limit of 1 allow 4 hypotheses, so a fifth rank is empty:
    score -inf, length 0, padding and no attention."""
    model = make_model(0, tgt_vocab_size=4)
    src, src_lens = make_batch(0, [3, 2])
    result = beam_search(
        model, src, src_lens, BOS, EOS, PAD, 5, 0.6, max_len_a=0.0, max_len_b=1, n_best=5
    )
    assert torch.isfinite(result.scores[:, :4]).all()
    assert (result.scores[:, 4] == float("-inf")).all()
    assert (result.lengths[:, :4] == 1).all() and (result.lengths[:, 4] == 0).all()
    assert (result.tokens[:, 4] == PAD).all() and (result.attention[:, 4] == 0).all()
    for b in range(2):
        assert sorted(result.tokens[b, :4, 0].tolist()) == [0, 1, 2, 3]


# ---- the batched search against the plain one ---------------------------------------------------


# Each decoder state the search must reorder with its beams: h (Bahdanau), h and h~ (input
# feeding), h and the coverage (B·K, S), all three, and a Transformer's key/value cache.
FAMILIES = ["bahdanau", "luong+feed", "bahdanau+coverage", "luong+feed+coverage", "transformer"]


@pytest.mark.parametrize(
    ("beam_size", "alpha", "n_best"), [(1, 0.0, 1), (3, 0.6, 2), (5, 1.0, 5), (4, -0.3, 3)]
)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_beam_search_is_the_plain_one(
    family: str, seed: int, beam_size: int, alpha: float, n_best: int
) -> None:
    """``beam_search`` (B sentences × K beams as rows, candidates coded as integers, sentences
    dropped when done) returns what ``beam_search_reference`` (a list of hypotheses per
    sentence, the steps named) does: the same N best, their scores, lengths and attention."""
    switches = family.split("+")[1:]
    model: nn.Module = (
        make_tiny_transformer(seed)
        if family == "transformer"
        else make_model(
            seed, eos_bias=2.0, input_feeding="feed" in switches, coverage="coverage" in switches
        )
    )
    src, src_lens = make_batch(seed, [6, 2, 5, 4])
    assert_beam_search_is_the_plain_one(
        model, src, src_lens, beam_size=beam_size, length_penalty=alpha, n_best=n_best,
        max_len_b=4,
    )  # fmt: skip


@pytest.mark.parametrize("family", ["bahdanau+coverage", "luong+feed+coverage"])
@pytest.mark.parametrize("seed", range(12))
def test_beam_search_with_coverage_is_the_plain_one_on_random_models(
    family: str, seed: int
) -> None:
    """Long outputs from strongly coverage-driven random models, sources with padding, n-best:
    each hypothesis's coverage (B·K, S) must follow its beam at every step, or the scores and
    attention of later steps differ from the reference's, which keeps a state per hypothesis."""
    model = make_model(seed, eos_bias=-2.0, input_feeding="feed" in family, coverage=True)
    with torch.no_grad():
        model.decoder.attention.coverage_weight.normal_(std=4.0)
    src, src_lens = make_batch(seed, [7, 3, 9, 5, 1])
    assert_beam_search_is_the_plain_one(
        model, src, src_lens, beam_size=4, length_penalty=0.6, n_best=3, max_len_b=6
    )


@pytest.mark.parametrize("beta", [0.2, 1.0, 5.0])
@pytest.mark.parametrize("family", ["bahdanau", "bahdanau+coverage", "transformer"])
@pytest.mark.parametrize("seed", range(4))
def test_beam_search_with_a_coverage_penalty_is_the_plain_one(
    family: str, seed: int, beta: float
) -> None:
    """GNMT's coverage penalty on finished hypotheses, over each sentence's real source words
    only (the padded ones have no attention), in both searches: the same N best and scores."""
    model: nn.Module = (
        make_tiny_transformer(seed)
        if family == "transformer"
        else make_model(seed, eos_bias=1.0, coverage=family.endswith("coverage"))
    )
    src, src_lens = make_batch(seed, [7, 3, 9, 5, 1])
    assert_beam_search_is_the_plain_one(
        model, src, src_lens, beam_size=4, length_penalty=0.6, n_best=3, max_len_b=5,
        coverage_penalty=beta,
    )  # fmt: skip


def test_the_coverage_penalty_is_its_formula_and_covers_no_less() -> None:
    """The best hypothesis's score is log P / lp + β Σ_i log(min(Σ_j a_ji, 1)), recomputed by
    hand; a large β picks outputs that cover more of the source."""
    model = make_model(3, eos_bias=1.0)
    src, src_lens = make_batch(3, [7, 3, 9, 5])
    plain = beam_search(model, src, src_lens, BOS, EOS, PAD, beam_size=4, length_penalty=0.6)
    penalized = beam_search(
        model, src, src_lens, BOS, EOS, PAD, beam_size=4, length_penalty=0.6,
        coverage_penalty_weight=2.0,
    )  # fmt: skip
    best = penalized.best
    for b in range(4):
        steps = int(best.lengths[b])
        log_p = sequence_log_probs(
            model, src[b : b + 1], src_lens[b : b + 1], best.tokens[b : b + 1, :steps],
            best.lengths[b : b + 1],
        )  # fmt: skip
        coverage = best.attention[b, :steps, : int(src_lens[b])].sum(dim=0)  # (S_b,)
        penalty = 2.0 * coverage.clamp(min=1e-6, max=1.0).log().sum()
        expected = log_p / length_penalty_factor(best.lengths[b], 0.6) + penalty
        assert float(best.scores[b]) == pytest.approx(float(expected), abs=1e-4)

    def covered_share(output: Any) -> float:
        totals = [
            output.best.attention[b, :, : int(src_lens[b])].sum(0).clamp(max=1).mean()
            for b in range(4)
        ]
        return float(sum(totals)) / 4

    assert covered_share(penalized) >= covered_share(plain)


@pytest.mark.parametrize(
    ("keyword", "value", "message"),
    [
        *[("coverage_penalty_weight", beta, "coverage_penalty must be a number >= 0")
          for beta in (-0.1, float("nan"), float("inf"), True, "0.5")],
        *[("length_penalty", alpha, "length_penalty must be a finite number")
          for alpha in (float("nan"), float("inf"), -float("inf"), "0.6")],
        *[("beam_size", size, "beam_size must be an integer >= 1")
          for size in (0, True, 2.5, "5")],
        *[("n_best", n, r"n_best must be an integer from 1 to beam_size \(5\)")
          for n in (0, 6, True, 2.5)],
    ],
)  # fmt: skip
def test_a_penalty_the_search_cannot_rank_by_is_refused(
    keyword: str, value: object, message: str
) -> None:
    """β below 0 or not finite; α not a finite number (any finite α ranks, negative too); a beam
    or an n-best list that is no whole number in range."""
    model = make_model(0)
    src, src_lens = make_batch(0, [3, 2])
    for search in (beam_search, beam_search_reference):
        with pytest.raises(ValueError, match=message):
            search(model, src, src_lens, BOS, EOS, PAD, **{keyword: value})


def assert_beam_search_is_the_plain_one(
    model: nn.Module,
    src: Tensor,
    src_lens: Tensor,
    beam_size: int,
    length_penalty: float,
    n_best: int,
    max_len_b: int,
    coverage_penalty: float = 0.0,
) -> None:
    """The same N best, scores, lengths and attention from both searches, in float64 (no
    near-tie flips between batched and one-sentence arithmetic)."""
    model = model.double()
    settings: dict[str, Any] = dict(
        beam_size=beam_size, length_penalty=length_penalty, n_best=n_best, max_len_b=max_len_b,
        coverage_penalty_weight=coverage_penalty,
    )  # fmt: skip
    fast = beam_search(model, src, src_lens, BOS, EOS, PAD, **settings)
    plain = beam_search_reference(model, src, src_lens, BOS, EOS, PAD, **settings)
    assert torch.equal(fast.lengths, plain.lengths)
    longest = fast.tokens.shape[2]
    assert torch.equal(fast.tokens, plain.tokens[:, :, :longest])
    torch.testing.assert_close(fast.scores, plain.scores)
    torch.testing.assert_close(fast.attention, plain.attention[:, :, :longest])
    assert torch.equal(fast.best.tokens, plain.best.tokens)


def make_tiny_transformer(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return Transformer(
        src_vocab_size=13, tgt_vocab_size=11, attention=ATTENTIONS["dot"], d_model=16,
        num_heads=2, d_ff=32, encoder_layers=1, decoder_layers=2, dropout=0.0,
    ).eval()  # fmt: skip
