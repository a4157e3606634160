"""Corpus metrics of an evaluation from per-sentence results that DDP ranks can pool exactly.

Each evaluated sentence becomes one ``SentenceScore`` keyed by its index in the dataset. Ranks
gather their scores, ``merge_sentence_scores`` drops the duplicates that a sharded sampler adds to
even out the ranks and restores dataset order, and ``corpus_metrics`` computes sacreBLEU, chrF,
the token-weighted loss, the mean attention entropy and AER once, over the whole split: the same
numbers as one process evaluating the same split. ``write_test_records`` keeps what paired tests
between runs read (``seq2seq.analysis.groups``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import sacrebleu
import torch
from torch import Tensor

from seq2seq.analysis.alignment import AlignmentCounts
from seq2seq.atomic import write_atomic


@dataclass(frozen=True)
class SentenceScore:
    """What one evaluated sentence contributes to the corpus metrics."""

    index: int  # position in its dataset
    hypothesis: str  # detokenized greedy translation
    reference: str
    loss_sum: float  # summed token cross-entropy under teacher forcing (nats)
    tokens: int  # target tokens scored, EOS included
    entropy_sum: float  # summed entropy (nats) of the attention rows of those tokens
    alignment: AlignmentCounts | None = None  # None: no gold alignment for this sentence
    # A Transformer's alignments head by head ("L1H2": layer 1, head 2), for AER per head.
    head_alignments: tuple[tuple[str, AlignmentCounts], ...] = ()
    # Over the greedy translation: the source tokens, and how many of them its steps attended
    # more than OVER_ATTENDED times in total, and less than UNDER_ATTENDED (``attention_totals``).
    source_tokens: int = 0
    over_attended: int = 0
    under_attended: int = 0


# A source token whose attention, summed over an output's steps, exceeds 1.5 was read one and a
# half times or more (over-translation's sign); one under 0.5 was barely read (under-translation).
OVER_ATTENDED, UNDER_ATTENDED = 1.5, 0.5


def attention_totals(attention: Tensor, src_lens: Tensor) -> tuple[list[int], list[int]]:
    """Per output, how many of its real source tokens got more than ``OVER_ATTENDED`` and less
    than ``UNDER_ATTENDED`` attention summed over its steps. attention (B, L, S), 0 after each
    output's end; src_lens (B,) -> two lists of B counts."""
    totals = attention.float().sum(dim=1)  # (B, S)
    is_real = torch.arange(totals.shape[1], device=totals.device)[None, :] < src_lens[:, None]
    over = ((totals > OVER_ATTENDED) & is_real).sum(dim=1)  # (B,)
    under = ((totals < UNDER_ATTENDED) & is_real).sum(dim=1)  # (B,)
    return over.tolist(), under.tolist()


def merge_sentence_scores(per_rank: Iterable[Sequence[SentenceScore]]) -> list[SentenceScore]:
    """One score per dataset index, in dataset order; a repeated index is kept once."""
    by_index: dict[int, SentenceScore] = {}
    for scores in per_rank:
        for score in scores:
            by_index.setdefault(score.index, score)
    return [by_index[index] for index in sorted(by_index)]


def corpus_metrics(scores: Sequence[SentenceScore], bleu_tokenize: str = "13a") -> dict[str, float]:
    """``bleu``, ``chrf``, ``loss`` (per token), ``entropy`` (per token), ``coverage_over`` and
    ``coverage_under`` (the shares of source tokens the translations attended more than 1.5 times
    and less than 0.5 in total, ``attention_totals``) and, when any sentence has a gold
    alignment, ``aer`` (and ``aer/L<l>H<h>`` for each Transformer head): each computed once over
    all ``scores``."""
    hypotheses = [score.hypothesis for score in scores]
    references = [[score.reference for score in scores]]
    tokens = max(1, sum(score.tokens for score in scores))
    metrics = {
        # tokenize="none" scores text that is tokenized on purpose (the toy tasks): say so
        # (force), or sacreBLEU guesses it was left tokenized by mistake and warns.
        "bleu": sacrebleu.corpus_bleu(
            hypotheses, references, tokenize=bleu_tokenize, force=bleu_tokenize == "none"
        ).score,
        "chrf": sacrebleu.corpus_chrf(hypotheses, references).score,
        # Token-weighted means, not means of batch means.
        "loss": sum(score.loss_sum for score in scores) / tokens,
        "entropy": sum(score.entropy_sum for score in scores) / tokens,
    }
    source_tokens = sum(score.source_tokens for score in scores)
    if source_tokens:
        metrics["coverage_over"] = sum(score.over_attended for score in scores) / source_tokens
        metrics["coverage_under"] = sum(score.under_attended for score in scores) / source_tokens
    aligned = [score.alignment for score in scores if score.alignment is not None]
    if aligned:
        metrics["aer"] = sum(aligned, AlignmentCounts()).aer
    per_head: dict[str, AlignmentCounts] = {}
    for score in scores:
        for name, counts in score.head_alignments:
            per_head[name] = per_head.get(name, AlignmentCounts()) + counts
    for name, counts in per_head.items():
        metrics[f"aer/{name}"] = counts.aer
    return metrics


# What a run keeps of its test pass, beside summary.json, for comparisons that pair sentences
# (seq2seq.analysis.significance): one line per test sentence, in dataset order.
TEST_HYPOTHESES = "test_hypotheses.txt"
TEST_REFERENCES = "test_references.txt"
# Per sentence, tab-separated: |A ∩ S|, |A ∩ P|, |A|, |S| of the argmax links (AlignmentCounts),
# or "-" for a sentence without gold links; only where the data has gold alignments.
TEST_ALIGNMENTS = "test_alignments.tsv"


def write_test_records(scores: Sequence[SentenceScore], run_dir: Path) -> None:
    """The test pass's translations, references and alignment counts, in dataset order."""
    lines = {
        TEST_HYPOTHESES: [score.hypothesis for score in scores],
        TEST_REFERENCES: [score.reference for score in scores],
    }
    if any(score.alignment is not None for score in scores):
        lines[TEST_ALIGNMENTS] = [
            "-"
            if (counts := score.alignment) is None
            else f"{counts.hits_sure}\t{counts.hits_possible}\t{counts.predicted}\t{counts.sure}"
            for score in scores
        ]
    for name, rows in lines.items():
        text = "".join(f"{row}\n" for row in rows)
        write_atomic(run_dir / name, functools.partial(write_text, text=text))


def write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
