"""Padded batches, built once in the collate function, and a length-bucketed sampler.

Shape legend: B batch, S source length, T target length (EOS or BOS included).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from seq2seq.data.tokenization import BOS_ID, EOS_ID, PAD_ID
from seq2seq.errors import ConfigError


@dataclass
class Batch:
    """One batch. Padding is described once, by lengths: positions ``>= src_lens`` are padding.

    ``tgt_in`` is BOS + target (what the decoder reads), ``tgt_out`` is target + EOS (what it must
    predict); both are PAD-filled beyond ``tgt_lens``.
    """

    src: Tensor  # (B, S) source ids
    src_lens: Tensor  # (B,) number of real source tokens
    tgt_in: Tensor  # (B, T)
    tgt_out: Tensor  # (B, T)
    tgt_lens: Tensor  # (B,) target tokens + 1 (for BOS/EOS)
    indices: Tensor  # (B,) positions of the examples in their dataset
    src_text: list[str]
    tgt_text: list[str]

    def to(self, device: torch.device) -> Batch:
        """This batch with its tensors on ``device``; the texts stay as they are."""
        # Asynchronous copies from pinned memory where the device allows, as Lightning's own
        # move_data_to_device does.
        non_blocking = device.type not in ("cpu", "mps")

        def move(tensor: Tensor) -> Tensor:
            return tensor.to(device, non_blocking=non_blocking)

        return replace(
            self, src=move(self.src), src_lens=move(self.src_lens), tgt_in=move(self.tgt_in),
            tgt_out=move(self.tgt_out), tgt_lens=move(self.tgt_lens), indices=move(self.indices),
        )  # fmt: skip


@dataclass(frozen=True)
class EncodedExample:
    src_ids: list[int]
    tgt_ids: list[int]
    src_text: str
    tgt_text: str


class EncodedDataset(Dataset[tuple[int, EncodedExample]]):
    """Examples already turned into ids; items carry their index so outputs can be put back."""

    def __init__(self, examples: Sequence[EncodedExample]) -> None:
        self.examples = list(examples)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> tuple[int, EncodedExample]:
        return index, self.examples[index]

    def lengths(self) -> list[int]:
        """Bucketing key: the longer side of each pair."""
        return [max(len(ex.src_ids), len(ex.tgt_ids) + 1) for ex in self.examples]


def pad(sequences: Sequence[Sequence[int]]) -> Tensor:
    """(B, max length) tensor of ``sequences``, PAD-filled."""
    longest = max(map(len, sequences))
    # One tensor from padded lists: a tensor per row costs a call per row, for every batch.
    return torch.tensor(
        [[*sequence, *[PAD_ID] * (longest - len(sequence))] for sequence in sequences],
        dtype=torch.long,
    )


def collate(items: Sequence[tuple[int, EncodedExample]]) -> Batch:
    examples = [example for _, example in items]
    return Batch(
        src=pad([ex.src_ids for ex in examples]),
        src_lens=torch.tensor([len(ex.src_ids) for ex in examples], dtype=torch.long),
        tgt_in=pad([[BOS_ID, *ex.tgt_ids] for ex in examples]),
        tgt_out=pad([[*ex.tgt_ids, EOS_ID] for ex in examples]),
        tgt_lens=torch.tensor([len(ex.tgt_ids) + 1 for ex in examples], dtype=torch.long),
        indices=torch.tensor([index for index, _ in items], dtype=torch.long),
        src_text=[ex.src_text for ex in examples],
        tgt_text=[ex.tgt_text for ex in examples],
    )


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of random or of similar lengths.

    With ``shuffle``, each epoch draws a permutation from ``seed + epoch``, sorts it by length in
    windows of ``bucket_batches`` batches, and shuffles the batch order: windows of one batch give
    random batches, wider ones batches of near-equal lengths (less padding). Without, the whole set
    is sorted by length once (for evaluation, where order does not matter but padding does).

    A batch holds ``batch_size`` sentences, or, with ``max_tokens``, as many as fit in that many
    padded tokens (batch size x longest length); a sentence longer than the budget is batched alone.
    Each batch lists its sentences longest first, the order packing puts them in
    (``seq2seq.kernels.packing.pack_tokens``).

    Under DDP each of ``num_replicas`` ranks serves every ``num_replicas``-th batch of the same
    epoch order, starting at its ``rank``. The batch list is first padded by repeating its first
    batches so that every rank gets the same number of batches: a rank that ran out early would
    leave the others waiting forever at their next gradient all-reduce.

    ``resume_at(epoch, batches_done)`` makes the next pass over that epoch skip the batches a
    resumed checkpoint had already trained on (``ResumableDataLoader`` calls it).
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        bucket_batches: int = 50,
        max_tokens: int | None = None,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas}).")
        if batch_size < 1:
            raise ConfigError(f"data.batch_size must be a positive integer, got {batch_size}.")
        if max_tokens is not None and max_tokens < 1:
            raise ConfigError(f"data.max_tokens must be a positive integer, got {max_tokens}.")
        self.lengths = torch.tensor(lengths, dtype=torch.long)
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.bucket_size = batch_size * bucket_batches if shuffle else max(1, len(lengths))
        self.epoch = 0
        self.resume_position: tuple[int, int] | None = None  # (epoch, batches already done)

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning before each epoch (through ``sampler``) so every epoch has its own
        order."""
        self.epoch = epoch

    @property
    def sampler(self) -> BucketBatchSampler:
        """Itself: Lightning sets the epoch on ``dataloader.batch_sampler.sampler`` (where torch's
        ``BatchSampler`` keeps its index sampler), never on the batch sampler itself."""
        return self

    def resume_at(self, epoch: int, batches_done: int) -> None:
        """Start the next pass over ``epoch`` after its first ``batches_done`` batches."""
        self.resume_position = (epoch, batches_done)

    def start_batch(self) -> int:
        """How many of this epoch's batches the next pass skips (0 unless resuming in it)."""
        if self.resume_position is not None and self.resume_position[0] == self.epoch:
            return self.resume_position[1]
        return 0

    def batches(self) -> list[list[int]]:
        """This epoch's batches of dataset indices for this rank, in the order they are served."""
        batches = self._all_batches()
        if self.num_replicas == 1:
            return batches
        shortfall = -len(batches) % self.num_replicas
        batches += batches[:shortfall]  # repeats are rare and only as many as there are ranks
        return batches[self.rank :: self.num_replicas]

    def _all_batches(self) -> list[list[int]]:
        """This epoch's batches for all ranks; the same on every rank (same seed and epoch)."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        n = len(self.lengths)
        order = torch.randperm(n, generator=generator) if self.shuffle else torch.arange(n)
        batches: list[list[int]] = []
        for start in range(0, n, self.bucket_size):
            window = order[start : start + self.bucket_size]
            # Stable sort keeps the random order among equal lengths.
            window = window[torch.argsort(self.lengths[window], stable=True)]
            if self.max_tokens is None:
                chunks = [chunk.tolist() for chunk in window.split(self.batch_size)]
            else:
                chunks = self._split_by_tokens(window.tolist(), self.max_tokens)
            batches.extend(chunk[::-1] for chunk in chunks)  # each longest first
        if self.shuffle:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=generator)]
        return batches

    def _split_by_tokens(self, sorted_indices: list[int], max_tokens: int) -> list[list[int]]:
        batches: list[list[int]] = []
        batch: list[int] = []
        for index in sorted_indices:
            # Sorted ascending, so this sentence is the longest of the batch it would join.
            if batch and (len(batch) + 1) * int(self.lengths[index]) > max_tokens:
                batches.append(batch)
                batch = []
            batch.append(index)
        if batch:
            batches.append(batch)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        start = self.start_batch()
        self.resume_position = None  # only the first pass after a resume is shortened
        return iter(self.batches()[start:])

    def __len__(self) -> int:
        if self.max_tokens is not None:
            total = len(self._all_batches())  # depends on the lengths drawn together; count them
        else:
            n = len(self.lengths)
            full_windows, rest = divmod(n, self.bucket_size)
            per_window = math.ceil(self.bucket_size / self.batch_size)
            total = full_windows * per_window + math.ceil(rest / self.batch_size)
        return math.ceil(total / self.num_replicas)


class ResumableDataLoader(DataLoader[tuple[int, EncodedExample]]):
    """Serves a ``BucketBatchSampler``'s batches and keeps its place in the epoch in checkpoints.

    Lightning saves ``state_dict()`` in every checkpoint and calls ``load_state_dict`` on resume (it
    treats any loader with both methods as resumable), so a run resumed from a mid-epoch checkpoint
    goes on with the next batch of the same epoch order, not with the epoch's first batches again.
    """

    def __init__(
        self,
        dataset: EncodedDataset,
        batch_sampler: BucketBatchSampler,
        num_workers: int = 0,
    ) -> None:
        super().__init__(
            dataset,
            batch_sampler=batch_sampler,
            collate_fn=collate,
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
            # Each new iterator draws a seed from this generator; without one it would draw from
            # the global RNG, and a resumed run's dropout stream would be shifted.
            generator=torch.Generator().manual_seed(batch_sampler.seed),
        )
        self.bucket_sampler = batch_sampler
        self.batches_served = 0  # batches of the current epoch handed out, skipped ones included
        # Run just before each batch is handed out, while ``state_dict`` still counts only the
        # batches handed out before: the one moment between two training steps when Lightning has
        # finished the first (its metrics row logged) and not begun the next. PeriodicCheckpoint
        # writes last.ckpt there.
        self.before_each_batch: Callable[[], None] | None = None

    # A generator on purpose, so nothing is drawn until the first batch is asked for: on a resumed
    # run Lightning calls iter() before it sets the sampler's epoch.
    def __iter__(self) -> Iterator[Batch]:  # type: ignore[override]  # DataLoader returns its own
        self.batches_served = self.bucket_sampler.start_batch()
        for batch in super().__iter__():
            if self.before_each_batch is not None:
                self.before_each_batch()
            self.batches_served += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.bucket_sampler.epoch,
            "batches_done": self.batches_served,
            "batches_per_epoch": len(self.bucket_sampler),
        }

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        epoch, done = state_dict["epoch"], state_dict["batches_done"]
        total = state_dict["batches_per_epoch"]
        if 0 < done < total and total != len(self.bucket_sampler):
            raise ConfigError(
                f"the checkpoint was saved {done} batches into an epoch of {total} batches, but "
                f"this config makes {len(self.bucket_sampler)} batches per epoch: resume with the "
                "data.* settings of the original run (its config.yaml), or start a new run."
            )
        self.bucket_sampler.resume_at(epoch, done)


def padding_ratio(batches: Sequence[Sequence[int]], lengths: Sequence[int]) -> float:
    """The share of padded positions when ``batches`` of sequences of ``lengths`` are padded."""
    real = sum(lengths[i] for batch in batches for i in batch)
    padded = sum(len(batch) * max(lengths[i] for i in batch) for batch in batches if batch)
    return 1.0 - real / padded if padded else 0.0
