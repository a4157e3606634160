"""Word links from attention: tokens to words (by hand and through real tokenizers), word weights,
hard and threshold links, and symmetrization against a literal transcription of Koehn's
pseudocode on random alignments."""

from __future__ import annotations

import random

import pytest
import torch

from seq2seq.analysis.alignment import Link
from seq2seq.analysis.word_alignment import (
    SYMMETRIZATIONS,
    links_from_weights,
    pharaoh,
    sentence_word_weights,
    soft,
    symmetrize,
    transpose,
    word_spans,
    word_weights,
    words_of_ids,
    words_of_offsets,
)
from seq2seq.data.tokenization import EOS_ID, TokenizerSpec, encode_batch


@pytest.mark.parametrize("text", ["", " ", "a", " two  words\t", "a\u00a0b c\u2028d", "x\x1cy"])
def test_word_spans_are_the_words_of_str_split(text: str) -> None:
    assert [text[start:end] for start, end in word_spans(text)] == text.split()


def test_subword_weights_average_a_target_words_pieces_and_sum_a_source_words() -> None:
    # Source "unbelievable dogs" split by hand into ▁un|believ|able ▁dogs, target "incroyables
    # chiens" into ▁incroy|ables ▁chiens|<space-only piece>; offsets as a tokenizer gives them.
    source = "unbelievable dogs"
    src_offsets = [(0, 2), (2, 8), (8, 12), (12, 17)]
    target = "incroyables chiens"
    tgt_offsets = [(0, 6), (6, 11), (11, 18), (18, 18)]  # the last: a space mark at the end
    src_words = words_of_offsets(source, src_offsets)
    tgt_words = words_of_offsets(target, tgt_offsets)
    assert src_words == [0, 0, 0, 1]
    assert tgt_words == [0, 0, 1, None]  # (11, 18) starts at the space, before "chiens"
    attention = torch.tensor(
        [
            [0.5, 0.2, 0.1, 0.2],
            [0.1, 0.1, 0.2, 0.6],
            [0.0, 0.1, 0.1, 0.8],
            [0.3, 0.3, 0.3, 0.1],  # the mark at the end: no word follows it
        ]
    )
    weights = word_weights(attention, tgt_words, src_words, 2, 2)
    # Row 0: the mean of pieces 0 and 1 of the sums over "unbelievable" (0.8, 0.4) and "dogs"
    # (0.2, 0.6): (0.6, 0.4). Row 1: (0.2, 0.8).
    torch.testing.assert_close(weights, torch.tensor([[0.6, 0.4], [0.2, 0.8]], dtype=torch.float64))
    assert links_from_weights(weights) == [(0, 0), (1, 1)]


def test_a_word_without_tokens_gets_zeros_and_no_hard_link() -> None:
    # The source's third word was cut by the length limit, the target's second has no token.
    weights = word_weights(torch.tensor([[0.3, 0.7]]), [0], [0, 1], 2, 3)
    expected = torch.tensor([[0.3, 0.7, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(weights, expected)
    assert links_from_weights(weights) == [(1, 0)]


def test_hard_and_threshold_links() -> None:
    weights = torch.tensor([[0.1, 0.6, 0.3], [0.45, 0.1, 0.45], [0.0, 0.0, 1.0]])
    assert links_from_weights(weights, "hard") == [(1, 0), (0, 1), (2, 2)]  # ties: the first
    assert links_from_weights(weights, 0.25) == [(0, 1), (1, 0), (2, 0), (2, 1), (2, 2)]
    assert links_from_weights(weights, 0.45) == [(1, 0), (2, 2)]  # above, not equal
    assert links_from_weights(torch.zeros(0, 3)) == []
    with pytest.raises(ValueError, match="'soft'"):
        links_from_weights(weights, "soft")


def test_pharaoh_and_soft_formats() -> None:
    assert pharaoh([(2, 1), (0, 0), (1, 1), (0, 2)]) == "0-0 0-2 1-1 2-1"  # by source word
    assert pharaoh([]) == ""
    assert soft(torch.tensor([[0.25, 0.75], [1.0, 0.0]])) == "0.2500,0.7500 1.0000,0.0000"
    assert transpose([(0, 2), (1, 0)]) == [(0, 1), (2, 0)]


@pytest.fixture(scope="module")
def bpe() -> tuple[list[str], object]:
    texts = [
        "the unbelievable dogs , run ! quickly",
        "a dog runs quickly . the dogs run",
        "unbelievable things happen (sometimes)",
    ] * 3
    return texts, TokenizerSpec("bpe", vocab_size=60).train(texts)


def test_real_subword_tokens_map_to_the_words_they_spell(bpe: tuple[list[str], object]) -> None:
    """Each word's tokens, space marks dropped, spell the word: from offsets (a given text) and
    from the ids a model would write (decoding)."""
    texts, tokenizer = bpe
    for text in texts[:3]:
        encoding = tokenizer.encode(text)  # type: ignore[attr-defined]
        words = text.split()
        assert any(len(encoding.ids) > len(words) for _ in [0])  # some word is split in pieces
        by_offsets = words_of_offsets(text, encoding.offsets)
        by_ids, decoded = words_of_ids(tokenizer, encoding.ids)  # type: ignore[arg-type]
        assert decoded == text and by_ids == by_offsets
        for index, word in enumerate(words):
            pieces = [t for t, w in zip(encoding.tokens, by_offsets, strict=True) if w == index]
            assert "".join(pieces).replace("\u2581", "") == word


def test_a_lone_space_mark_joins_the_next_word_end_of_sentence_none(
    bpe: tuple[list[str], object],
) -> None:
    _, tokenizer = bpe
    ids = encode_batch(tokenizer, ["the  dogs"])[0]  # type: ignore[arg-type]
    tokens = [tokenizer.id_to_token(i) for i in ids]  # type: ignore[attr-defined]
    words, text = words_of_ids(tokenizer, [*ids, EOS_ID])  # type: ignore[arg-type]
    assert text == "the  dogs" and words[-1] is None
    assert "\u2581" in tokens  # the second space is a lone mark, before "dogs"
    assert words[tokens.index("\u2581")] == 1
    assert words[:-1] == words_of_offsets(text, tokenizer.encode(text).offsets)  # type: ignore[attr-defined]


def test_sentence_word_weights_of_a_word_level_model_is_its_attention() -> None:
    tokenizer = TokenizerSpec("whitespace").train(["a b c", "x y"])
    attention = torch.softmax(torch.randn(2, 3), dim=-1)
    weights = sentence_word_weights(attention, "a b c", tokenizer, tokenizer, ["x", "y"])
    torch.testing.assert_close(weights, attention.double())
    forced = sentence_word_weights(attention, "a b c", tokenizer, tokenizer, ["x", "y"], "x y")
    torch.testing.assert_close(forced, attention.double())


# ---- symmetrization ------------------------------------------------------------------------


def test_symmetrization_of_a_hand_made_pair() -> None:
    # forward: 0-0 1-1 2-1 ; backward: 0-0 1-1 1-2 3-3 (source, target)
    forward = [(0, 0), (1, 1), (2, 1)]
    backward = [(0, 0), (1, 1), (1, 2), (3, 3)]
    assert symmetrize(forward, backward, "intersection") == [(0, 0), (1, 1)]
    assert symmetrize(forward, backward, "union") == [(0, 0), (1, 1), (1, 2), (2, 1), (3, 3)]
    # grow-diag from {0-0, 1-1}: 2-1 and 1-2 neighbour 1-1, are in the union and join a source
    # (2) or target (2) word not aligned yet. 3-3 neighbours nothing aligned: only final adds it.
    assert symmetrize(forward, backward, "grow-diag") == [(0, 0), (1, 1), (1, 2), (2, 1)]
    assert symmetrize(forward, backward, "grow-diag-final-and") == [
        (0, 0), (1, 1), (1, 2), (2, 1), (3, 3),
    ]  # fmt: skip


def test_final_and_needs_both_words_unaligned_final_either() -> None:
    # Intersection {0-0}; 0-2 (union) is no neighbour of it; its source word 0 is aligned.
    forward, backward = [(0, 0), (0, 2)], [(0, 0)]
    assert symmetrize(forward, backward, "grow-diag-final") == [(0, 0), (0, 2)]
    assert symmetrize(forward, backward, "grow-diag-final-and") == [(0, 0)]


def reference_gdfa(
    forward: set[Link], backward: set[Link], sources: int, targets: int, method: str
) -> set[Link]:
    """Koehn's pseudocode (Moses' documentation), word for word, on (e = target, f = source)."""
    neighbouring = [(-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)]
    union = forward | backward
    alignment = forward & backward

    def aligned_e(e: int) -> bool:
        return any(j == e for _, j in alignment)

    def aligned_f(f: int) -> bool:
        return any(i == f for i, _ in alignment)

    added = True
    while added:  # GROW-DIAG: iterate until no new points added
        added = False
        for e in range(targets):
            for f in range(sources):
                if (f, e) in alignment:
                    for de, df in neighbouring:
                        e_new, f_new = e + de, f + df
                        if (not aligned_e(e_new) or not aligned_f(f_new)) and (
                            f_new,
                            e_new,
                        ) in union:
                            alignment.add((f_new, e_new))
                            added = True
    if method == "grow-diag":
        return alignment
    for a in (forward, backward):  # FINAL(a) / FINAL-AND(a)
        for e_new in range(targets):
            for f_new in range(sources):
                free_e, free_f = not aligned_e(e_new), not aligned_f(f_new)
                free = free_e and free_f if method.endswith("-and") else free_e or free_f
                if free and (f_new, e_new) in a:
                    alignment.add((f_new, e_new))
    return alignment


@pytest.mark.parametrize("method", ["grow-diag", "grow-diag-final", "grow-diag-final-and"])
def test_symmetrization_is_koehns_pseudocode_on_random_alignments(method: str) -> None:
    generator = random.Random(0)
    for _ in range(300):
        sources, targets = generator.randint(1, 7), generator.randint(1, 7)
        cells = [(i, j) for i in range(sources) for j in range(targets)]
        forward = set(generator.sample(cells, generator.randint(0, len(cells) // 2)))
        backward = set(generator.sample(cells, generator.randint(0, len(cells) // 2)))
        expected = reference_gdfa(forward, backward, sources, targets, method)
        assert symmetrize(forward, backward, method) == sorted(expected)  # type: ignore[arg-type]


def test_every_symmetrization_lies_between_intersection_and_union() -> None:
    generator = random.Random(1)
    cells = [(i, j) for i in range(5) for j in range(5)]
    for _ in range(50):
        forward, backward = set(generator.sample(cells, 8)), set(generator.sample(cells, 8))
        for method in SYMMETRIZATIONS:
            links = set(symmetrize(forward, backward, method))  # type: ignore[arg-type]
            assert forward & backward <= links <= forward | backward
    with pytest.raises(ValueError, match="grow-diag-final-and"):
        symmetrize([], [], "grow")  # type: ignore[arg-type]
