"""LightningDataModule: corpus -> tokenizers -> id sequences -> bucketed batches."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytorch_lightning as pl
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader

from seq2seq.data import cache
from seq2seq.data.batching import (
    Batch,
    BucketBatchSampler,
    EncodedDataset,
    EncodedExample,
    ResumableDataLoader,
    collate,
    padding_ratio,
)
from seq2seq.data.tokenization import TokenizerSpec, encode_batch, train_tokenizers
from seq2seq.errors import ConfigError

if TYPE_CHECKING:
    from seq2seq.data.toy import Example

log = logging.getLogger(__name__)

# ``bucket_batches`` when the config leaves it null (conf/data_common/base.yaml says why): random
# batches of ``batch_size`` sentences, or, under a ``max_tokens`` budget, windows of 50 batches'
# sentences to cut budget-sized batches from.
RANDOM_BATCHES = 1
TOKEN_BUDGET_WINDOW = 50


class Corpus(Protocol):
    """Anything that yields named splits of text pairs (``train``, ``val``, ``test``, ...)."""

    def splits(self) -> dict[str, list[Example]]: ...


class Seq2SeqDataModule(pl.LightningDataModule):
    """Trains the tokenizers on the training split and serves batches: for training, random or
    length-bucketed (``bucket_batches``, ``BucketBatchSampler``); for evaluation, sorted by length.

    Pass ``src_tokenizer``/``tgt_tokenizer`` to reuse existing vocabularies (a resumed or loaded
    model) instead of training new ones. With ``cache_dir``, the tokenizers and encoded splits of
    a corpus read from files are cached there (``seq2seq.data.cache``); None or "" disables it.
    """

    def __init__(
        self,
        corpus: Corpus,
        batch_size: int = 64,
        max_tokens: int | None = None,
        eval_batch_size: int = 256,
        bucket_batches: int | None = None,
        tokenizer: TokenizerSpec | None = None,
        joint_vocab: bool = False,
        num_workers: int = 0,
        seed: int = 0,
        src_tokenizer: Tokenizer | None = None,
        tgt_tokenizer: Tokenizer | None = None,
        cache_dir: str | Path | None = None,
    ) -> None:
        super().__init__()
        if bucket_batches is None:  # random batches, unless a token budget needs full windows
            bucket_batches = RANDOM_BATCHES if max_tokens is None else TOKEN_BUDGET_WINDOW
        for key, value in [
            ("batch_size", batch_size),
            ("eval_batch_size", eval_batch_size),
            ("bucket_batches", bucket_batches),
        ]:
            if value < 1:  # checked here so that it fails before any data is read
                raise ConfigError(f"data.{key} must be a positive integer, got {value}.")
        self.corpus = corpus
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.eval_batch_size = eval_batch_size
        self.bucket_batches = bucket_batches
        self.tokenizer_spec = tokenizer or TokenizerSpec()
        self.joint_vocab = joint_vocab
        self.num_workers = num_workers
        self.seed = seed
        self.src_tokenizer = src_tokenizer
        self.tgt_tokenizer = tgt_tokenizer
        # "" too, so that SEQ2SEQ_CACHE_DIR= (set but empty) turns the cache off.
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else None
        self.datasets: dict[str, EncodedDataset] = {}
        self.alignments: dict[str, list[tuple[tuple[int, int], ...] | None]] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:  # Lightning calls setup again after the pipeline did
            return
        entry = self._cache_entry()
        if entry is not None:
            key, path = entry
            cached = cache.load(path, key)
            if cached is not None:
                log.info("data cache hit: %s (%s)", key, path)
                if self.src_tokenizer is None or self.tgt_tokenizer is None:
                    self.src_tokenizer, self.tgt_tokenizer = (
                        cached.src_tokenizer,
                        cached.tgt_tokenizer,
                    )
                self.datasets, self.alignments = cached.datasets, cached.alignments
                self._log_padding()
                return
            log.info("data cache miss: writing %s", path)
        splits = self.corpus.splits()
        if not splits.get("train"):
            raise ConfigError("the corpus has no training examples: check data.* in the config.")
        train = splits["train"]
        if self.src_tokenizer is None or self.tgt_tokenizer is None:
            # Vocabularies come from the training split only, never from val or test.
            self.src_tokenizer, self.tgt_tokenizer = train_tokenizers(
                self.tokenizer_spec,
                [ex.src for ex in train],
                [ex.tgt for ex in train],
                joint=self.joint_vocab,
            )
        for name, examples in splits.items():
            self.datasets[name] = self._encode(examples)
            self.alignments[name] = [ex.alignment for ex in examples]
        if entry is not None:
            key, path = entry
            data = cache.CachedData(
                self.src_tokenizer, self.tgt_tokenizer, self.datasets, self.alignments
            )
            cache.save(path, key, data)
        self._log_padding()

    def _cache_entry(self) -> tuple[str, Path] | None:
        """The cache key and file of this module's data, or None if it is not cached."""
        if self.cache_dir is None:
            return None
        given = None
        if self.src_tokenizer is not None and self.tgt_tokenizer is not None:
            # Ids encoded with other vocabularies must not be served: key on these ones.
            given = (self.src_tokenizer, self.tgt_tokenizer)
        key = cache.cache_key(self.corpus, self.tokenizer_spec, self.joint_vocab, given)
        if key is None:
            return None
        return key, cache.cache_path(self.cache_dir, self.corpus, key)

    def _log_padding(self) -> None:
        """How much of the first epoch's training batches is padding, per side."""
        dataset = self.datasets["train"]
        batches = self._sampler("train", self.batch_size, shuffle=True).batches()
        src_lengths = [len(ex.src_ids) for ex in dataset.examples]
        tgt_lengths = [len(ex.tgt_ids) + 1 for ex in dataset.examples]  # + BOS or EOS
        log.info(
            "train: %d pairs in %d batches; padding: %.1f%% of source, %.1f%% of target tokens",
            len(dataset),
            len(batches),
            100 * padding_ratio(batches, src_lengths),
            100 * padding_ratio(batches, tgt_lengths),
        )

    def _encode(self, examples: Sequence[Example]) -> EncodedDataset:
        assert self.src_tokenizer is not None and self.tgt_tokenizer is not None
        src_ids = encode_batch(self.src_tokenizer, [ex.src for ex in examples])
        tgt_ids = encode_batch(self.tgt_tokenizer, [ex.tgt for ex in examples])
        return EncodedDataset(
            [
                EncodedExample(src, tgt, ex.src, ex.tgt)
                for src, tgt, ex in zip(src_ids, tgt_ids, examples, strict=True)
            ]
        )

    def _sampler(self, split: str, batch_size: int, shuffle: bool) -> BucketBatchSampler:
        # The token budget shapes training batches; evaluation batches count sentences. Under DDP
        # every split is sharded across ranks; evaluation pools the ranks' sentence scores again
        # (seq2seq.analysis.metrics), dropping the repeats that even out the shards.
        trainer = self.trainer
        ranks = (trainer.world_size, trainer.global_rank) if trainer else (1, 0)
        return BucketBatchSampler(
            self.datasets[split].lengths(),
            batch_size,
            shuffle,
            self.seed,
            self.bucket_batches,
            max_tokens=self.max_tokens if shuffle else None,
            num_replicas=ranks[0],
            rank=ranks[1],
        )

    def _loader(
        self, split: str, batch_size: int, shuffle: bool
    ) -> DataLoader[tuple[int, EncodedExample]]:
        return DataLoader(
            self.datasets[split],
            batch_sampler=self._sampler(split, batch_size, shuffle),
            collate_fn=collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            # Not the global RNG: validating must not shift the training run's dropout stream.
            generator=torch.Generator().manual_seed(self.seed),
        )

    def train_dataloader(self) -> ResumableDataLoader:
        # Resumable: its place in the epoch is saved in checkpoints (exact mid-epoch resume).
        sampler = self._sampler("train", self.batch_size, shuffle=True)
        if self.trainer is not None:
            # Lightning reads len() before it sets the epoch; under a token budget the number of
            # batches differs between epochs (the pipeline reloads this loader every epoch), so
            # len() must count the epoch about to be served.
            sampler.set_epoch(self.trainer.current_epoch)
        return ResumableDataLoader(self.datasets["train"], sampler, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader[tuple[int, EncodedExample]]:
        return self._loader("val", self.eval_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader[tuple[int, EncodedExample]]:
        return self._loader("test", self.eval_batch_size, shuffle=False)

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        # Lightning's default walks every field, deep-copying the dataclass and visiting each of
        # its 2 x B strings, at every training step.
        if isinstance(batch, Batch):
            return batch.to(device)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)
