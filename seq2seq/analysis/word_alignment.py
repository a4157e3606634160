"""Word links from attention: subword weights to word weights, links out of them, symmetrization.

A model attends over *tokens* (subword pieces for a BPE or unigram vocabulary); an alignment links
*words*, the whitespace-separated words of the text as a user reads it (the Pharaoh convention,
``seq2seq.analysis.alignment``: source index first, both from 0). Between the two:

* **Which word a token belongs to.** A source token (and a reference target, read by teacher
  forcing) has its character span in the text (the tokenizer's offsets): it belongs to the word
  that holds its first non-space character at or after its start. A target token the model
  wrote has no text but the one decoding makes of it: it belongs to the word where its
  characters land in the decoded text (decoding a prefix of the ids gives a prefix of the text,
  for every tokenizer of this project). So a token that is only a space mark (``▁`` split off
  the piece it marks) belongs to the word that follows it, as the mark does; one with no word
  after it belongs to none, and neither does end of sentence (the attention's rows stop before
  it, and the source has none).
* **Word weights** (``word_weights``): a target word's weight on a source word is the *sum* over
  the source word's pieces (attention mass is additive over what is attended to) of the *average*
  over the target word's pieces (each piece is one step of attention). Rows of real words then
  still sum to 1. For a word-level vocabulary every word is one token and nothing changes.
* **Links** (``links_from_weights``): ``hard`` aligns each target word to the source word it
  attends to most (the usual reading of attention as alignment, and AER's here); a threshold
  ``t`` keeps every link with weight above ``t`` (several or none per target word), as Marian's
  ``--alignment THRESHOLD`` does.
* **Symmetrization** (``symmetrize``) of the links of a source→target and a target→source model
  (the latter's links turned around first), as statistical aligners do: ``intersection`` (high
  precision), ``union`` (high recall), and Koehn et al.'s (2005) ``grow-diag-final-and`` between
  them, with its parts ``grow-diag`` and ``grow-diag-final``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

import torch
from tokenizers import Tokenizer
from torch import Tensor

from seq2seq.analysis.alignment import Link
from seq2seq.data.tokenization import decode, token_ids

SYMMETRIZATIONS = ("intersection", "union", "grow-diag", "grow-diag-final", "grow-diag-final-and")
Symmetrization = Literal[
    "intersection", "union", "grow-diag", "grow-diag-final", "grow-diag-final-and"
]
# Koehn et al.'s neighbourhood, (target, source) offsets as Moses writes them: the four sides,
# then the four diagonals ("diag").
NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def word_spans(text: str) -> list[tuple[int, int]]:
    """The (start, end) character span of each whitespace-separated word of ``text``: the words
    of ``text.split()``, in order."""
    spans: list[tuple[int, int]] = []
    start = None
    for position, character in enumerate(text):
        if character.isspace():
            if start is not None:
                spans.append((start, position))
                start = None
        elif start is None:
            start = position
    if start is not None:
        spans.append((start, len(text)))
    return spans


def words_of_offsets(text: str, offsets: Sequence[tuple[int, int]]) -> list[int | None]:
    """For tokens with character ``offsets`` into ``text``: the index of the word each belongs to
    (the one holding the first non-space character at or after its start), None for a token
    with only spaces after its start."""
    spans = word_spans(text)
    return [_word_from(spans, start) for start, _ in offsets]


def _word_from(spans: Sequence[tuple[int, int]], position: int) -> int | None:
    """The word that holds ``position`` or, between words, the next one; None after the last."""
    return next((index for index, (_, end) in enumerate(spans) if position < end), None)


def words_of_ids(tokenizer: Tokenizer, ids: Sequence[int]) -> tuple[list[int | None], str]:
    """For token ``ids`` a model wrote: the word of the decoded text each belongs to (as
    ``words_of_offsets``: None for end of sentence), and that text.

    Token k's characters are what ``decode(ids[:k + 1])`` adds to ``decode(ids[:k])``."""
    text = decode(tokenizer, ids)
    spans = word_spans(text)
    words: list[int | None] = []
    before = 0  # characters of the text that the tokens so far decode to
    for k in range(len(ids)):
        prefix = decode(tokenizer, ids[: k + 1])
        if not text.startswith(prefix):  # not prefix-consistent: no character can be placed
            raise ValueError(
                f"decoding token {k} of {list(ids)} gives {prefix!r}, not a prefix of {text!r}."
            )
        words.append(_word_from(spans, before))
        before = len(prefix)
    return words, text


def sentence_word_weights(
    attention: Tensor,
    source: str,
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer,
    tgt_tokens: Sequence[str],
    target: str | None = None,
) -> Tensor:
    """The word weights (target words, source words) of one sentence's token ``attention`` (T, S):
    the S source tokens the model read of ``source`` (the first S, if the source was cut at the
    model's length limit), the T target tokens ``tgt_tokens``. With ``target`` (teacher forcing
    on a given reference), target words are that text's; without, the words of the text that the
    model's ``tgt_tokens`` decode to (a translation's ``text``)."""
    offsets = src_tokenizer.encode(source).offsets[: attention.shape[1]]
    src_words = words_of_offsets(source, offsets)
    if target is None:
        tgt_words, target = words_of_ids(tgt_tokenizer, token_ids(tgt_tokenizer, tgt_tokens))
    else:
        tgt_offsets = tgt_tokenizer.encode(target).offsets[: attention.shape[0]]
        tgt_words = words_of_offsets(target, tgt_offsets)
    return word_weights(
        attention, tgt_words, src_words, len(word_spans(target)), len(word_spans(source))
    )


def word_weights(
    weights: Tensor,
    tgt_words: Sequence[int | None],
    src_words: Sequence[int | None],
    tgt_count: int,
    src_count: int,
) -> Tensor:
    """Token attention ``weights`` (T, S) to word weights (tgt_count, src_count): the average over
    a target word's tokens of the sum over a source word's tokens. ``tgt_words`` / ``src_words``
    name each token's word (None: none; a token past the ends, such as one cut by the source's
    length limit, belongs to none either). A word with no token gets a row or column of zeros."""
    rows, columns = weights.shape
    if (rows, columns) != (len(tgt_words), len(src_words)):
        raise ValueError(
            f"weights {tuple(weights.shape)} for {len(tgt_words)} target and {len(src_words)} "
            "source tokens."
        )
    weights = weights.detach().double().cpu()
    tgt_map = _membership(tgt_words, tgt_count)  # (tgt_count, T): 1 where the token is the word's
    src_map = _membership(src_words, src_count)  # (src_count, S)
    pieces = tgt_map.sum(dim=1, keepdim=True).clamp(min=1)  # (tgt_count, 1): tokens per word
    return (tgt_map @ weights @ src_map.T) / pieces  # (tgt_count, T) (T, S) (S, src_count)


def _membership(words: Sequence[int | None], count: int) -> Tensor:
    """(count, len(words)) with a 1 where token k belongs to word w."""
    matrix = torch.zeros(count, len(words), dtype=torch.float64)
    for token, word in enumerate(words):
        if word is not None and word < count:
            matrix[word, token] = 1.0
    return matrix


def links_from_weights(weights: Tensor, method: str | float = "hard") -> list[Link]:
    """Links (source, target) out of word weights (T, S): ``"hard"``, each target word to its most
    attended source word (a row of zeros, a word the model did not read, gets none); a number
    ``t``, every link with weight above ``t``."""
    if weights.numel() == 0:
        return []
    if method == "hard":
        kept = weights.sum(dim=-1) > 0  # (T,)
        best = weights.argmax(dim=-1)  # (T,)
        return [(int(i), j) for j, i in enumerate(best.tolist()) if kept[j]]
    if isinstance(method, str):
        raise ValueError(f"alignment method {method!r}: give 'hard' or a threshold from 0 to 1.")
    above = (weights > method).nonzero().tolist()  # (links, 2): (target, source)
    return sorted((i, j) for j, i in above)


def transpose(links: Iterable[Link]) -> list[Link]:
    """The links of a target→source model, (its source i, its target j), turned around to
    (source, target) of the other direction."""
    return sorted((j, i) for i, j in links)


def symmetrize(
    forward: Iterable[Link],
    backward: Iterable[Link],
    method: Symmetrization = "grow-diag-final-and",
) -> list[Link]:
    """One alignment out of two of the same sentence pair, both (source, target): ``forward`` from
    a source→target model, ``backward`` from a target→source model already ``transpose``d.

    ``grow-diag`` starts from the intersection and, until nothing changes, adds each neighbour
    (side or diagonal) of a link that is in the union and joins a word not aligned yet;
    ``-final`` then adds every union link whose source *or* target word is still unaligned,
    ``-final-and`` only those whose source *and* target words are both unaligned (each
    direction's links in turn, forward first). Koehn et al. (2005), as Moses' documentation
    writes it (loops over target words, then source words, then neighbours in that order).
    """
    first, second = set(forward), set(backward)
    union = first | second
    links = first & second
    if method == "intersection":
        return sorted(links)
    if method == "union":
        return sorted(union)
    if method not in SYMMETRIZATIONS:
        raise ValueError(f"symmetrization {method!r}: give one of {', '.join(SYMMETRIZATIONS)}.")
    _grow_diag(links, union)
    if method != "grow-diag":
        both = method == "grow-diag-final-and"
        for direction in (first, second):
            _final(links, direction, both)
    return sorted(links)


def _grow_diag(links: set[Link], union: set[Link]) -> None:
    if not union:
        return
    sources = max(i for i, _ in union) + 1
    targets = max(j for _, j in union) + 1
    grew = True
    while grew:
        grew = False
        for j in range(targets):
            for i in range(sources):
                if (i, j) not in links:
                    continue
                for dj, di in NEIGHBOURS:  # Moses writes them (target, source)
                    new = (i + di, j + dj)
                    if new in union and new not in links and _joins_unaligned(links, new, False):
                        links.add(new)
                        grew = True


def _final(links: set[Link], direction: set[Link], both: bool) -> None:
    for link in sorted(direction, key=lambda link: (link[1], link[0])):
        if link not in links and _joins_unaligned(links, link, both):
            links.add(link)


def _joins_unaligned(links: set[Link], link: Link, both: bool) -> bool:
    """Whether ``link`` joins an unaligned source word or (``both``: and) target word."""
    source_free = all(i != link[0] for i, _ in links)
    target_free = all(j != link[1] for _, j in links)
    return source_free and target_free if both else source_free or target_free


def pharaoh(links: Iterable[Link]) -> str:
    """``"0-0 1-2 ..."``, sorted by source word, then target word (as fast_align and Marian)."""
    return " ".join(f"{i}-{j}" for i, j in sorted(links))


def soft(weights: Tensor) -> str:
    """Word weights (T, S) as Marian writes soft alignments: per target word, its weights over the
    source words joined by commas; the target words joined by spaces."""
    return " ".join(",".join(f"{value:.4f}" for value in row) for row in weights.tolist())
