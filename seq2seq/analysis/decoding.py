"""Choosing the beam size and length penalty on the validation set, never on test.

``tune_decoding`` translates the validation sources with every (beam size, length penalty) pair of
a grid and scores each with sacreBLEU; the best pair is then used once on the test set. Beam 1
(greedy search) ignores the length penalty, so it is translated once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sacrebleu.metrics.bleu import BLEU


class Translates(Protocol):
    def translate(
        self, sentences: Sequence[str], beam_size: int, length_penalty: float, batch_size: int
    ) -> list[str]: ...


@dataclass(frozen=True)
class DecodingScore:
    beam_size: int
    length_penalty: float
    bleu: float


def tune_decoding(
    translator: Translates,
    sources: Sequence[str],
    references: Sequence[str],
    beam_sizes: Sequence[int] = (1, 5),
    length_penalties: Sequence[float] = (0.0, 0.6, 1.0),
    tokenize: str = BLEU.TOKENIZER_DEFAULT,
    batch_size: int = 64,
) -> list[DecodingScore]:
    """Every pair's corpus BLEU on (``sources``, ``references``), best first (ties: the smaller
    beam, then the smaller penalty: cheaper and closer to the model's own scores)."""
    scores = []
    bleu = BLEU(tokenize=tokenize)
    for beam_size in sorted(set(beam_sizes)):
        penalties = [0.0] if beam_size == 1 else sorted(set(length_penalties))
        for penalty in penalties:
            hypotheses = translator.translate(sources, beam_size, penalty, batch_size)
            score = bleu.corpus_score(hypotheses, [list(references)]).score
            scores.append(DecodingScore(beam_size, penalty, score))
    return sorted(scores, key=lambda s: (-s.bleu, s.beam_size, s.length_penalty))
