"""A disk cache of encoded datasets, so that a second run skips reading, tokenizer training and
encoding.

An entry is one ``torch.save`` file named by a key that hashes everything its data depends on:

* the contents (sha256) of every file the corpus reads (``corpus.source_files()``);
* the corpus class and its settings (its dataclass fields);
* the tokenizer settings (``TokenizerSpec`` fields and ``joint_vocab``), or, when the data module
  was given tokenizers (a resumed model), those tokenizers' JSON;
* ``CACHE_FORMAT``, the ``tokenizers`` version and the source of the corpus and tokenization
  modules, so that a change of the reading or tokenizing code cannot serve data made by the old
  code.

A stale entry is therefore never found, only left behind (delete the directory to reclaim space).
Corpora without ``source_files`` (the generated toy tasks, which take under a second) are not
cached.

The file holds only tensors, strings, ints and bools, and is loaded with ``weights_only=True``:
no pickled code runs. Token ids are flat int32 tensors with int64 offsets, texts one string per
split and side with character offsets, because one object per sentence would make the loader
(torch's restricted unpickler is written in Python) the slowest part of a cache hit. Writes go to
a temporary file in the same directory that replaces the entry atomically, so readers see the old
entry or the new one, never half of one; an unreadable entry is a miss, logged and rewritten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import inspect
import itertools
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import tokenizers
import torch
from tokenizers import Tokenizer
from torch import Tensor

from seq2seq.atomic import write_atomic
from seq2seq.data import tokenization
from seq2seq.data.batching import EncodedDataset, EncodedExample
from seq2seq.data.tokenization import TokenizerSpec
from seq2seq.data.toy import Alignment

log = logging.getLogger(__name__)

# Bump when the file layout or the meaning of a field changes: the key changes with it.
CACHE_FORMAT = 1


@dataclass(frozen=True)
class CachedData:
    """What ``Seq2SeqDataModule.setup`` builds: tokenizers, encoded splits and their alignments."""

    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    datasets: dict[str, EncodedDataset]
    alignments: dict[str, list[Alignment | None]]


# --- Key ----------------------------------------------------------------------------------------


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _code_digest(obj: type | ModuleType) -> str:
    """sha256 of the source file that defines ``obj``; "" where there is none (a frozen app)."""
    try:
        source = inspect.getsourcefile(obj)
    except TypeError:  # a built-in class or module
        return ""
    return _sha256_file(Path(source)) if source else ""


def cache_key(
    corpus: object,
    spec: TokenizerSpec,
    joint_vocab: bool,
    tokenizers_given: tuple[Tokenizer, Tokenizer] | None = None,
) -> str | None:
    """The cache key of ``corpus`` encoded as configured, or None if it cannot be cached.

    None for a corpus without ``source_files`` or that is not a dataclass, and when a source file
    cannot be read (``corpus.splits()`` then reports it with its own message).
    """
    source_files = getattr(corpus, "source_files", None)
    if source_files is None or not dataclasses.is_dataclass(corpus) or isinstance(corpus, type):
        return None
    file_digests: list[str] = []
    for path in source_files():
        try:
            file_digests.append(_sha256_file(Path(path)))
        except OSError as error:
            log.debug("data cache: not used, cannot hash %s (%s)", path, error)
            return None
    corpus_type = type(corpus)
    tokenizer_part: dict[str, Any]
    if tokenizers_given is not None:
        # The given vocabularies replace training: the spec is then unused, their JSON is not.
        src_tokenizer, tgt_tokenizer = tokenizers_given
        tokenizer_part = {
            "src_json_sha256": _sha256_text(src_tokenizer.to_str()),
            "tgt_json_sha256": _sha256_text(tgt_tokenizer.to_str()),
        }
    else:
        tokenizer_part = {"spec": dataclasses.asdict(spec), "joint_vocab": joint_vocab}
    manifest = {
        "format": CACHE_FORMAT,
        "corpus_type": f"{corpus_type.__module__}.{corpus_type.__qualname__}",
        "corpus_fields": dataclasses.asdict(corpus),
        "source_sha256": file_digests,
        "tokenizer": tokenizer_part,
        "tokenizers_version": tokenizers.__version__,
        "code_sha256": [_code_digest(corpus_type), _code_digest(tokenization)],
    }
    # repr for anything JSON lacks, so that an odd field changes the key rather than failing.
    canonical = json.dumps(manifest, sort_keys=True, default=repr)
    return _sha256_text(canonical)[:32]


def cache_path(cache_dir: Path, corpus: object, key: str) -> Path:
    """Where the entry ``key`` of ``corpus`` lives: the class name is there for people."""
    return cache_dir / f"{type(corpus).__name__.lower()}-{key}.pt"


# --- Writing ------------------------------------------------------------------------------------


def _flat_ids(sequences: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]:
    """(N,) int32 ids of all sequences one after another, and (len + 1,) int64 offsets."""
    lengths = torch.tensor([len(sequence) for sequence in sequences], dtype=torch.int64)
    offsets = torch.zeros(len(sequences) + 1, dtype=torch.int64)
    torch.cumsum(lengths, dim=0, out=offsets[1:])
    flat = torch.tensor(list(itertools.chain.from_iterable(sequences)), dtype=torch.int32)
    return flat, offsets


def _flat_texts(texts: Sequence[str]) -> tuple[str, Tensor]:
    lengths = torch.tensor([len(text) for text in texts], dtype=torch.int64)
    offsets = torch.zeros(len(texts) + 1, dtype=torch.int64)
    torch.cumsum(lengths, dim=0, out=offsets[1:])
    return "".join(texts), offsets


def _encode_split(
    dataset: EncodedDataset, alignments: Sequence[Alignment | None]
) -> dict[str, Any]:
    examples = dataset.examples
    src_ids, src_offsets = _flat_ids([ex.src_ids for ex in examples])
    tgt_ids, tgt_offsets = _flat_ids([ex.tgt_ids for ex in examples])
    src_text, src_text_offsets = _flat_texts([ex.src_text for ex in examples])
    tgt_text, tgt_text_offsets = _flat_texts([ex.tgt_text for ex in examples])
    # Links as (source, target) pairs flattened; "present" tells None from an empty alignment.
    links, link_offsets = _flat_ids([[i for link in a or () for i in link] for a in alignments])
    present = torch.tensor([a is not None for a in alignments], dtype=torch.bool)
    return {
        "src_ids": src_ids,
        "src_offsets": src_offsets,
        "tgt_ids": tgt_ids,
        "tgt_offsets": tgt_offsets,
        "src_text": src_text,
        "src_text_offsets": src_text_offsets,
        "tgt_text": tgt_text,
        "tgt_text_offsets": tgt_text_offsets,
        "alignment_links": links,
        "alignment_offsets": link_offsets,
        "alignment_present": present,
    }


def _save_payload(payload: dict[str, Any], path: Path) -> None:
    with open(path, "wb") as file:
        torch.save(payload, file)


def save(path: Path, key: str, data: CachedData) -> None:
    """Write ``data`` as the entry ``key`` at ``path`` atomically; a failure is only logged."""
    payload = {
        "format": CACHE_FORMAT,
        "key": key,
        "src_tokenizer": data.src_tokenizer.to_str(),
        "tgt_tokenizer": data.tgt_tokenizer.to_str(),
        "joint": data.src_tokenizer is data.tgt_tokenizer,
        "splits": {
            name: _encode_split(dataset, data.alignments[name])
            for name, dataset in data.datasets.items()
        },
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A unique temporary file per call, so concurrent writers of one key never share one.
        write_atomic(path, lambda temporary: _save_payload(payload, temporary))
    except OSError as error:
        # The data is in memory already: a full disk or a read-only directory costs only speed.
        log.warning(
            "cannot write the data cache file %s (%s); continuing without it. Free space there, "
            "point data.cache_dir at a writable directory, or set data.cache_dir=null.",
            path,
            error.strerror or error,
        )


# --- Reading ------------------------------------------------------------------------------------


def _check_offsets(offsets: Any, count: int | None, total: int, name: str) -> int:
    """Validate ``offsets`` into ``total`` items; returns the number of sequences."""
    if not isinstance(offsets, Tensor) or offsets.dtype != torch.int64 or offsets.dim() != 1:
        raise ValueError(f"{name} is not a 1-D int64 tensor")
    if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != total:
        raise ValueError(f"{name} does not span its {total} items")
    if bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError(f"{name} decreases")
    if count is not None and len(offsets) - 1 != count:
        raise ValueError(f"{name} has {len(offsets) - 1} entries, expected {count}")
    return len(offsets) - 1


def _sequences(
    split: dict[str, Any], ids_name: str, offsets_name: str, count: int | None, vocab_size: int
) -> list[list[int]]:
    flat = split[ids_name]
    if not isinstance(flat, Tensor) or flat.dtype != torch.int32 or flat.dim() != 1:
        raise ValueError(f"{ids_name} is not a 1-D int32 tensor")
    _check_offsets(split[offsets_name], count, len(flat), offsets_name)
    if len(flat) and (int(flat.min()) < 0 or int(flat.max()) >= vocab_size):
        raise ValueError(f"{ids_name} holds ids outside the vocabulary of {vocab_size}")
    values: list[int] = flat.tolist()
    bounds: list[int] = split[offsets_name].tolist()
    return [values[start:end] for start, end in itertools.pairwise(bounds)]


def _texts(split: dict[str, Any], text_name: str, count: int) -> list[str]:
    joined = split[text_name]
    if not isinstance(joined, str):
        raise ValueError(f"{text_name} is not a string")
    offsets_name = f"{text_name}_offsets"
    _check_offsets(split[offsets_name], count, len(joined), offsets_name)
    bounds: list[int] = split[offsets_name].tolist()
    return [joined[start:end] for start, end in itertools.pairwise(bounds)]


def _alignments(split: dict[str, Any], count: int) -> list[Alignment | None]:
    present = split["alignment_present"]
    if not isinstance(present, Tensor) or present.dtype != torch.bool or present.shape != (count,):
        raise ValueError("alignment_present does not match the examples")
    if not bool(present.any()):
        return [None] * count
    # Positions, not ids: any non-negative int32 is valid, so the bound is int32's.
    flat = _sequences(split, "alignment_links", "alignment_offsets", count, 2**31 - 1)
    alignments: list[Alignment | None] = []
    for is_present, links in zip(present.tolist(), flat, strict=True):
        if len(links) % 2:
            raise ValueError("an alignment has an odd number of positions")
        pairs = tuple(zip(links[0::2], links[1::2], strict=True))
        alignments.append(pairs if is_present else None)
    return alignments


def _decode(payload: Any, key: str) -> CachedData:
    """``payload`` as CachedData; ValueError (or KeyError, TypeError) if it is malformed."""
    if not isinstance(payload, dict) or payload.get("format") != CACHE_FORMAT:
        raise ValueError(f"not a cache file of format {CACHE_FORMAT}")
    if payload.get("key") != key:
        raise ValueError(f"it holds the entry {payload.get('key')!r}, not {key!r}")
    src_tokenizer = Tokenizer.from_str(payload["src_tokenizer"])
    tgt_tokenizer = (
        src_tokenizer if payload["joint"] else Tokenizer.from_str(payload["tgt_tokenizer"])
    )
    src_vocab, tgt_vocab = src_tokenizer.get_vocab_size(), tgt_tokenizer.get_vocab_size()
    datasets: dict[str, EncodedDataset] = {}
    alignments: dict[str, list[Alignment | None]] = {}
    for name, split in payload["splits"].items():
        src_ids = _sequences(split, "src_ids", "src_offsets", None, src_vocab)
        count = len(src_ids)
        tgt_ids = _sequences(split, "tgt_ids", "tgt_offsets", count, tgt_vocab)
        src_texts = _texts(split, "src_text", count)
        tgt_texts = _texts(split, "tgt_text", count)
        datasets[name] = EncodedDataset(
            list(map(EncodedExample, src_ids, tgt_ids, src_texts, tgt_texts))
        )
        alignments[name] = _alignments(split, count)
    if "train" not in datasets:
        raise ValueError("it has no training split")
    return CachedData(src_tokenizer, tgt_tokenizer, datasets, alignments)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector, which would otherwise traverse the hundreds of
    thousands of new lists again and again while decoding creates them (it halves the time)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load(path: Path, key: str) -> CachedData | None:
    """The entry ``key`` stored at ``path``, or None if there is none or it is unreadable."""
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        with _collector_paused():
            return _decode(payload, key)
    except Exception as error:
        # A truncated or damaged file fails in zip, unpickler or tokenizer code with many error
        # types; every one of them only means "rebuild", never "stop the run".
        log.warning(
            "data cache file %s is unreadable (%s: %s); rebuilding it from the corpus and "
            "overwriting it. If this repeats, delete the file or set data.cache_dir=null.",
            path,
            type(error).__name__,
            error,
        )
        return None
