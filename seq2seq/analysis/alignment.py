"""Word alignments: Pharaoh files, alignments read off attention, and alignment error rate (AER).

Convention: a link ``(i, j)`` joins source word ``i`` and target word ``j``, both 0-based, source
first, as in the Pharaoh/Moses format (``"0-0 1-2"``). A gold alignment has *sure* links S and
*possible* links P, with S ⊆ P (a sure link is also possible). Och and Ney (2003), eq. (22):

    AER(A; S, P) = 1 - (|A ∩ S| + |A ∩ P|) / (|A| + |S|)

0 is a perfect alignment. Corpus AER sums the four counts over all sentences before dividing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torch import Tensor

from seq2seq.data.corpora import read_lines
from seq2seq.errors import Seq2SeqError

Link = tuple[int, int]  # (source index, target index), 0-based

# "i-j" is a sure link; "i-p-j" and "ipj" (the two spellings in use) are possible links.
_LINK = re.compile(r"^(\d+)(?:-(p)-|(p)|-)(\d+)$")


class AlignmentFormatError(Seq2SeqError, ValueError):
    """A Pharaoh alignment that cannot be read; the message names the file, line and link."""


@dataclass(frozen=True)
class GoldAlignment:
    """The sure links of a sentence and its possible links (sure links included)."""

    sure: frozenset[Link]
    possible: frozenset[Link] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        object.__setattr__(self, "possible", self.possible | self.sure)  # S ⊆ P by definition

    @classmethod
    def from_links(cls, links: Iterable[Link]) -> GoldAlignment:
        """Gold alignment with sure links only (the toy task's)."""
        return cls(frozenset(links))


@dataclass(frozen=True)
class AlignmentCounts:
    """The four counts AER is made of; they add up over sentences (and over DDP ranks)."""

    hits_sure: int = 0  # |A ∩ S|
    hits_possible: int = 0  # |A ∩ P|
    predicted: int = 0  # |A|
    sure: int = 0  # |S|

    def __add__(self, other: AlignmentCounts) -> AlignmentCounts:
        return AlignmentCounts(
            self.hits_sure + other.hits_sure,
            self.hits_possible + other.hits_possible,
            self.predicted + other.predicted,
            self.sure + other.sure,
        )

    @property
    def precision(self) -> float:
        """|A ∩ P| / |A|: the share of predicted links that are possible (1 with none)."""
        return self.hits_possible / self.predicted if self.predicted else 1.0

    @property
    def recall(self) -> float:
        """|A ∩ S| / |S|: the share of sure links predicted (1 with none to find)."""
        return self.hits_sure / self.sure if self.sure else 1.0

    @property
    def aer(self) -> float:
        denominator = self.predicted + self.sure
        if denominator == 0:
            return 0.0  # nothing predicted and nothing to find: nothing wrong
        return 1.0 - (self.hits_sure + self.hits_possible) / denominator


def count_links(predicted: Iterable[Link], gold: GoldAlignment) -> AlignmentCounts:
    """AER counts of one sentence's predicted links against its gold alignment."""
    links = set(predicted)
    return AlignmentCounts(
        hits_sure=len(links & gold.sure),
        hits_possible=len(links & gold.possible),
        predicted=len(links),
        sure=len(gold.sure),
    )


def corpus_aer(predicted: Sequence[Iterable[Link]], gold: Sequence[GoldAlignment]) -> float:
    """AER of a corpus: the counts of every sentence summed, then divided once."""
    if len(predicted) != len(gold):
        raise ValueError(f"{len(predicted)} predicted alignments for {len(gold)} gold ones.")
    total = AlignmentCounts()
    for links, reference in zip(predicted, gold, strict=True):
        total += count_links(links, reference)
    return total.aer


def argmax_links(weights: Tensor, src_len: int, tgt_len: int) -> list[Link]:
    """Align each target word to the source word it attends to most.

    ``weights`` (T, S) holds the attention of target step ``j`` over the source; only the first
    ``tgt_len`` rows (the words, not EOS) and ``src_len`` columns (no padding) are read.
    """
    if tgt_len == 0 or src_len == 0:
        return []
    best_source = weights[:tgt_len, :src_len].argmax(dim=-1)  # (tgt_len,)
    return [(int(i), j) for j, i in enumerate(best_source.tolist())]


def exact_zeros(weights: Tensor) -> list[list[int]]:
    """For each row of ``weights`` (T, S), the columns whose weight is exactly 0.0 (a sparse
    normalizer's or a window's, told apart from a weight that rounds to 0 once stored)."""
    return [row.nonzero()[:, 0].tolist() for row in weights == 0]


def parse_pharaoh(line: str, origin: str = "the alignment") -> GoldAlignment:
    """Read one line of Pharaoh links: ``"0-0 1-2 3p4 2-p-2"``; an empty line has no links."""
    sure: set[Link] = set()
    possible: set[Link] = set()
    for token in line.split():
        match = _LINK.match(token)
        if match is None:
            raise AlignmentFormatError(
                f"{origin}: {token!r} is not an alignment link. Write links as i-j (sure) or "
                "i-p-j / ipj (possible), with 0-based source index i first and target index j "
                "second, separated by spaces."
            )
        link = (int(match.group(1)), int(match.group(4)))
        (possible if match.group(2) or match.group(3) else sure).add(link)
    return GoldAlignment(frozenset(sure), frozenset(possible))


def read_pharaoh(path: Path, what: str = "the alignment file") -> list[GoldAlignment]:
    """One gold alignment per line of ``path`` (``what`` names it in the missing-file error)."""
    lines = read_lines(path, what)
    return [parse_pharaoh(line, f"{path}:{number}") for number, line in enumerate(lines, 1)]


def check_in_range(gold: GoldAlignment, src_len: int, tgt_len: int, origin: str) -> None:
    """A link outside the sentence means the files are not parallel (or not 0-based)."""
    for i, j in sorted(gold.possible):
        if not (0 <= i < src_len and 0 <= j < tgt_len):
            raise AlignmentFormatError(
                f"{origin}: link {i}-{j} is outside a sentence pair of {src_len} source and "
                f"{tgt_len} target words. Links are 0-based (source first); check that the "
                "alignment file is line-parallel with the source and target files."
            )
