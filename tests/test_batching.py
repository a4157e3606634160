"""The length-bucketed batch sampler and the collate function."""

from __future__ import annotations

import random

import pytest
import torch

from seq2seq.data.batching import (
    BucketBatchSampler,
    EncodedExample,
    collate,
    padding_ratio,
)
from seq2seq.data.datamodule import Seq2SeqDataModule
from seq2seq.data.tokenization import BOS_ID, EOS_ID, PAD_ID
from seq2seq.errors import ConfigError

_rng = random.Random(0)
LENGTHS = [_rng.randint(1, 40) for _ in range(1000)]


@pytest.mark.parametrize("max_tokens", [None, 300])
def test_every_index_once_per_epoch_and_reproducible(max_tokens: int | None) -> None:
    sampler = BucketBatchSampler(LENGTHS, batch_size=16, seed=3, max_tokens=max_tokens)
    epoch0 = list(sampler)
    assert sorted(i for batch in epoch0 for i in batch) == list(range(len(LENGTHS)))
    assert len(sampler) == len(epoch0)
    assert list(BucketBatchSampler(LENGTHS, 16, seed=3, max_tokens=max_tokens)) == epoch0
    sampler.set_epoch(1)
    assert list(sampler) != epoch0  # a new order every epoch, from the seed
    sampler.set_epoch(0)
    assert list(sampler) == epoch0


def test_sentence_batches_have_the_batch_size() -> None:
    batches = list(BucketBatchSampler(LENGTHS, batch_size=16, bucket_batches=10))
    assert all(len(batch) <= 16 for batch in batches)
    assert sum(len(batch) == 16 for batch in batches) >= len(batches) - 7  # window remainders


def test_token_budget_bounds_padded_batch_size() -> None:
    long = [*LENGTHS, 500]  # longer than the budget on its own
    batches = list(BucketBatchSampler(long, batch_size=16, max_tokens=300))
    for batch in batches:
        padded = len(batch) * max(long[i] for i in batch)
        assert padded <= 300 or len(batch) == 1
    assert [len(LENGTHS)] in batches


def test_bucketing_pads_less_than_random_batches() -> None:
    bucketed = list(BucketBatchSampler(LENGTHS, batch_size=32, seed=1))
    order = list(range(len(LENGTHS)))
    random.Random(1).shuffle(order)
    unsorted = [order[i : i + 32] for i in range(0, len(order), 32)]
    assert padding_ratio(bucketed, LENGTHS) < padding_ratio(unsorted, LENGTHS) / 3


def test_padding_ratio_counts_padded_positions() -> None:
    assert padding_ratio([[0, 1], [2]], [2, 4, 3]) == pytest.approx(1 - 9 / 11)


def test_evaluation_order_is_sorted_and_fixed() -> None:
    """Shortest batch first, each batch longest first (the order the fused encoder takes)."""
    batches = list(BucketBatchSampler(LENGTHS, batch_size=50, shuffle=False))
    flat = [i for batch in batches[::-1] for i in batch]
    assert [LENGTHS[i] for i in flat] == sorted(LENGTHS, reverse=True)
    assert batches == list(BucketBatchSampler(LENGTHS, batch_size=50, shuffle=False))


@pytest.mark.parametrize("max_tokens", [None, 200])
def test_every_batch_is_longest_first(max_tokens: int | None) -> None:
    sampler = BucketBatchSampler(LENGTHS, batch_size=16, max_tokens=max_tokens, seed=3)
    for batch in sampler.batches():
        lengths = [LENGTHS[i] for i in batch]
        assert lengths == sorted(lengths, reverse=True)


def test_bad_sizes_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"data\.batch_size"):
        BucketBatchSampler(LENGTHS, batch_size=0)
    with pytest.raises(ConfigError, match=r"data\.max_tokens"):
        BucketBatchSampler(LENGTHS, batch_size=4, max_tokens=0)


@pytest.mark.parametrize(
    ("bucket_batches", "max_tokens", "expected"),
    [(None, None, 1), (None, 2000, 50), (7, None, 7), (7, 2000, 7)],
)
def test_training_batches_are_random_unless_a_token_budget_needs_windows(
    bucket_batches: int | None, max_tokens: int | None, expected: int
) -> None:
    module = Seq2SeqDataModule(None, max_tokens=max_tokens, bucket_batches=bucket_batches)  # type: ignore[arg-type]
    assert module.bucket_batches == expected


def test_random_batches_mix_lengths_and_list_each_longest_first() -> None:
    batches = list(BucketBatchSampler(LENGTHS, batch_size=32, seed=1, bucket_batches=1))
    assert sorted(i for batch in batches for i in batch) == list(range(len(LENGTHS)))
    spans = [LENGTHS[batch[0]] - LENGTHS[batch[-1]] for batch in batches]
    assert min(spans) > 20  # lengths 1-40 drawn at random: each batch spans most of them
    for batch in batches:
        lengths = [LENGTHS[i] for i in batch]
        assert lengths == sorted(lengths, reverse=True)


def test_a_bad_bucket_window_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"data\.bucket_batches must be a positive integer"):
        Seq2SeqDataModule(None, bucket_batches=0)  # type: ignore[arg-type]


def test_collate_builds_teacher_forcing_pairs_and_lengths() -> None:
    items = [
        (7, EncodedExample([5, 6, 7], [8, 9], "a b c", "x y")),
        (2, EncodedExample([5], [8, 9, 10], "a", "x y z")),
    ]
    batch = collate(items)
    assert batch.src.tolist() == [[5, 6, 7], [5, PAD_ID, PAD_ID]]
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.long
    assert batch.src_lens.tolist() == [3, 1]
    assert batch.tgt_in.tolist() == [[BOS_ID, 8, 9, PAD_ID], [BOS_ID, 8, 9, 10]]
    assert batch.tgt_out.tolist() == [[8, 9, EOS_ID, PAD_ID], [8, 9, 10, EOS_ID]]
    assert batch.tgt_lens.tolist() == [3, 4]
    assert torch.equal(batch.indices, torch.tensor([7, 2]))
    assert batch.tgt_text == ["x y", "x y z"]


@pytest.mark.parametrize("max_tokens", [None, 300])
@pytest.mark.parametrize("num_replicas", [2, 3])
def test_ranks_get_disjoint_shards_of_equal_length(
    num_replicas: int, max_tokens: int | None
) -> None:
    samplers = [
        BucketBatchSampler(
            LENGTHS, 16, seed=5, max_tokens=max_tokens, num_replicas=num_replicas, rank=rank
        )
        for rank in range(num_replicas)
    ]
    whole = BucketBatchSampler(LENGTHS, 16, seed=5, max_tokens=max_tokens).batches()
    shards = [sampler.batches() for sampler in samplers]
    assert len({len(shard) for shard in shards}) == 1  # no rank waits for another
    assert all(len(sampler) == len(shard) for sampler, shard in zip(samplers, shards, strict=True))
    served = [tuple(batch) for shard in shards for batch in shard]
    assert set(served) == {tuple(batch) for batch in whole}  # every batch served...
    assert len(served) - len(whole) < num_replicas  # ...and at most a few twice, as padding
    for sampler in samplers:
        sampler.set_epoch(1)
    assert [s.batches() for s in samplers] != shards  # reshuffled together each epoch
