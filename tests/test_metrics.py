"""Pooling per-sentence scores: sharded, padded evaluation gives the single-process metrics."""

from __future__ import annotations

import random

import pytest
import sacrebleu
import torch

from seq2seq.analysis.alignment import AlignmentCounts
from seq2seq.analysis.metrics import (
    SentenceScore,
    attention_totals,
    corpus_metrics,
    merge_sentence_scores,
)
from seq2seq.data.batching import BucketBatchSampler

WORDS = ["the", "a", "dog", "cat", "sees", "runs", "big", "small", "red", "blue"]


def scores(n: int, seed: int = 0) -> list[SentenceScore]:
    rng = random.Random(seed)
    result = []
    for index in range(n):
        reference = " ".join(rng.choices(WORDS, k=rng.randint(2, 9)))
        hypothesis = " ".join(rng.choices(WORDS, k=rng.randint(1, 9)))
        tokens = len(reference.split()) + 1
        result.append(
            SentenceScore(
                index=index,
                hypothesis=hypothesis,
                reference=reference,
                loss_sum=rng.uniform(0, 3) * tokens,
                tokens=tokens,
                entropy_sum=rng.uniform(0, 2) * tokens,
                alignment=AlignmentCounts(*(rng.randint(0, 3) for _ in range(4))),
            )
        )
    return result


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_sharded_padded_scores_pool_to_the_single_process_metrics(world_size: int) -> None:
    all_scores = scores(37)
    sampler_lengths = [len(score.reference.split()) for score in all_scores]
    per_rank = []
    for rank in range(world_size):
        sampler = BucketBatchSampler(
            sampler_lengths, 4, shuffle=False, num_replicas=world_size, rank=rank
        )
        per_rank.append([all_scores[i] for batch in sampler for i in batch])
    shard_sizes = [len(shard) for shard in per_rank]
    assert sum(shard_sizes) >= len(all_scores)  # padded with repeats to even out the ranks
    pooled = merge_sentence_scores(per_rank)
    assert [score.index for score in pooled] == list(range(len(all_scores)))
    assert corpus_metrics(pooled) == corpus_metrics(all_scores)


def test_metrics_follow_their_formulas() -> None:
    all_scores = scores(20, seed=3)
    metrics = corpus_metrics(all_scores, bleu_tokenize="none")
    hypotheses = [score.hypothesis for score in all_scores]
    references = [[score.reference for score in all_scores]]
    assert metrics["bleu"] == sacrebleu.corpus_bleu(hypotheses, references, tokenize="none").score
    assert metrics["chrf"] == sacrebleu.corpus_chrf(hypotheses, references).score
    tokens = sum(score.tokens for score in all_scores)
    # Weighted by tokens: the mean of per-sentence means would differ.
    assert metrics["loss"] == pytest.approx(sum(score.loss_sum for score in all_scores) / tokens)
    assert metrics["entropy"] == pytest.approx(
        sum(score.entropy_sum for score in all_scores) / tokens
    )
    total = sum((score.alignment for score in all_scores if score.alignment), AlignmentCounts())
    assert metrics["aer"] == pytest.approx(total.aer)


def test_no_gold_alignment_means_no_aer() -> None:
    plain = [SentenceScore(0, "a b", "a b", 1.0, 3, 0.5)]
    assert "aer" not in corpus_metrics(plain)


def test_attention_totals_count_over_and_under_attended_real_source_tokens() -> None:
    # Sentence 0: 3 source tokens over 2 steps; token 0 gets 1.6 (over), tokens 1 and 2 get 0.3
    # and 0.1 (under). Sentence 1: 2 real tokens and a padded one (never counted), each read once.
    attention = torch.tensor(
        [
            [[0.8, 0.1, 0.1], [0.8, 0.2, 0.0]],
            [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]],
        ]
    )  # (B, L, S)
    over, under = attention_totals(attention, torch.tensor([3, 2]))
    assert over == [1, 0] and under == [2, 0]


def test_corpus_coverage_shares_pool_the_source_tokens() -> None:
    scores = [
        SentenceScore(0, "a", "a", 0.0, 1, 0.0, source_tokens=4, over_attended=1),
        SentenceScore(1, "b", "b", 0.0, 1, 0.0, source_tokens=6, under_attended=3),
    ]
    metrics = corpus_metrics(scores, "none")
    assert metrics["coverage_over"] == pytest.approx(1 / 10)
    assert metrics["coverage_under"] == pytest.approx(3 / 10)
