"""The encoded-data cache: hits give identical data without reading the corpus, every change of
an input misses, damaged entries are rebuilt, writes leave no temporary files."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from seq2seq.data import cache, corpora
from seq2seq.data.batching import EncodedDataset, EncodedExample
from seq2seq.data.corpora import DataError, ParallelCorpus, TsvCorpus
from seq2seq.data.datamodule import Corpus, Seq2SeqDataModule
from seq2seq.data.tokenization import TokenizerSpec, encode_batch, train_tokenizers
from seq2seq.data.toy import ToyTranslation

CONF = Path(__file__).resolve().parents[1] / "conf"
WORD = TokenizerSpec(level="word", vocab_size=0, min_frequency=1)
PARALLEL_FILES = ["train.de", "train.en", "val.de", "val.en", "test.de", "test.en"]


def _sentences(count: int, offset: int) -> list[tuple[str, str]]:
    nouns = ["dog", "cat", "house", "tree", "car", "bird", "apple"]
    adjectives = ["big", "small", "red", "old", "happy"]
    # Lengths vary (0-2 "again", 0-3 "encore"), so that length limits drop some pairs, not all.
    return [
        (
            f"The {adjectives[i % 5]} {nouns[i % 7]} number {i + offset} runs{' again' * (i % 3)}.",
            f"Le {nouns[i % 7]} {adjectives[(i + 1) % 5]} numéro {i + offset} court"
            f"{' encore' * (i % 4)} !",
        )
        for i in range(count)
    ]


def tsv_corpus(tmp_path: Path) -> TsvCorpus:
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{src}\t{tgt}\tCC-BY\n" for src, tgt in _sentences(80, 0)))
    return TsvCorpus(path=str(path), val_size=10, test_size=10)


def parallel_corpus(tmp_path: Path) -> ParallelCorpus:
    root = tmp_path / "parallel"
    root.mkdir()
    for split, count, offset in [("train", 60, 0), ("val", 8, 100), ("test", 8, 200)]:
        pairs = _sentences(count, offset)
        (root / f"{split}.de").write_text("".join(f"{src}\n" for src, _ in pairs))
        (root / f"{split}.en").write_text("".join(f"{tgt}\n" for _, tgt in pairs))
    return ParallelCorpus(root=str(root), src_lang="de", tgt_lang="en")


CORPORA: dict[str, Callable[[Path], Corpus]] = {"tsv": tsv_corpus, "parallel": parallel_corpus}


def prepared(
    corpus: Corpus,
    cache_dir: Path | None,
    spec: TokenizerSpec = WORD,
    joint_vocab: bool = False,
) -> Seq2SeqDataModule:
    datamodule = Seq2SeqDataModule(
        corpus, batch_size=8, tokenizer=spec, joint_vocab=joint_vocab, cache_dir=cache_dir
    )
    datamodule.setup()
    return datamodule


def assert_same_data(first: Seq2SeqDataModule, second: Seq2SeqDataModule) -> None:
    assert list(first.datasets) == list(second.datasets)
    for name, dataset in first.datasets.items():
        assert dataset.examples == second.datasets[name].examples  # ids and texts
    assert first.alignments == second.alignments
    assert first.src_tokenizer is not None and second.src_tokenizer is not None
    assert first.tgt_tokenizer is not None and second.tgt_tokenizer is not None
    assert first.src_tokenizer.to_str() == second.src_tokenizer.to_str()
    assert first.tgt_tokenizer.to_str() == second.tgt_tokenizer.to_str()


def cache_files(cache_dir: Path) -> list[str]:
    return sorted(path.name for path in cache_dir.iterdir()) if cache_dir.exists() else []


def forbid_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every way of reading a corpus fail, so that a hit proves it did not read it."""

    def fail(*args: object) -> None:
        raise AssertionError("the corpus was read although the cache holds its data")

    monkeypatch.setattr(ParallelCorpus, "splits", fail)
    monkeypatch.setattr(TsvCorpus, "splits", fail)
    monkeypatch.setattr(corpora, "read_lines", fail)
    monkeypatch.setattr("seq2seq.data.datamodule.train_tokenizers", fail)
    monkeypatch.setattr("seq2seq.data.datamodule.encode_batch", fail)


# --- Hits ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["word", "bpe"])
@pytest.mark.parametrize("kind", list(CORPORA))
def test_second_setup_is_a_hit_with_identical_data_and_reads_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    kind: str,
    level: str,
) -> None:
    corpus = CORPORA[kind](tmp_path)
    spec = TokenizerSpec(level=level, vocab_size=0 if level == "word" else 120)  # type: ignore[arg-type]  # a str from parametrize
    cache_dir = tmp_path / "cache"
    with caplog.at_level(logging.INFO, logger="seq2seq.data.datamodule"):
        cold = prepared(corpus, cache_dir, spec)
    assert "data cache miss: writing" in caplog.text
    [entry] = cache_files(cache_dir)

    caplog.clear()
    forbid_reading(monkeypatch)
    with caplog.at_level(logging.INFO, logger="seq2seq.data.datamodule"):
        warm = prepared(corpus, cache_dir, spec)
    key = entry.removesuffix(".pt").rsplit("-", 1)[1]
    assert f"data cache hit: {key} ({cache_dir / entry})" in caplog.text
    assert_same_data(cold, warm)
    assert cache_files(cache_dir) == [entry]


def test_a_hit_gives_the_same_batches(tmp_path: Path) -> None:
    corpus = tsv_corpus(tmp_path)
    cold = prepared(corpus, tmp_path / "cache")
    warm = prepared(corpus, tmp_path / "cache")
    for cold_batch, warm_batch in zip(
        cold.train_dataloader(), warm.train_dataloader(), strict=True
    ):
        assert torch.equal(cold_batch.src, warm_batch.src)
        assert torch.equal(cold_batch.tgt_out, warm_batch.tgt_out)
        assert cold_batch.src_text == warm_batch.src_text


def test_joint_vocabulary_is_one_tokenizer_after_a_hit(tmp_path: Path) -> None:
    corpus = tsv_corpus(tmp_path)
    prepared(corpus, tmp_path / "cache", joint_vocab=True)
    warm = prepared(corpus, tmp_path / "cache", joint_vocab=True)
    assert warm.src_tokenizer is warm.tgt_tokenizer


# --- Misses -------------------------------------------------------------------------------------


def _flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    position = data.index(b"dog")  # same length, so that only the content differs
    data[position : position + 3] = b"dug"
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("file_name", PARALLEL_FILES)
def test_changing_one_byte_of_any_parallel_file_misses(tmp_path: Path, file_name: str) -> None:
    corpus = parallel_corpus(tmp_path)
    cache_dir = tmp_path / "cache"
    prepared(corpus, cache_dir)
    _flip_one_byte(tmp_path / "parallel" / file_name)
    changed = prepared(corpus, cache_dir)
    assert len(cache_files(cache_dir)) == 2
    fresh = prepared(corpus, None)
    assert_same_data(changed, fresh)  # the new entry holds the changed text, not the old one


def test_changing_one_byte_of_the_tsv_file_misses(tmp_path: Path) -> None:
    corpus = tsv_corpus(tmp_path)
    cache_dir = tmp_path / "cache"
    prepared(corpus, cache_dir)
    _flip_one_byte(Path(corpus.path))
    changed = prepared(corpus, cache_dir)
    assert len(cache_files(cache_dir)) == 2
    assert_same_data(changed, prepared(corpus, None))
    assert any("dug" in ex.src_text for ds in changed.datasets.values() for ex in ds.examples)


@pytest.mark.parametrize(
    ("spec", "joint_vocab"),
    [
        (TokenizerSpec(level="whitespace", vocab_size=0), False),
        (TokenizerSpec(level="word", vocab_size=20), False),
        (TokenizerSpec(level="word", vocab_size=0, min_frequency=2), False),
        (TokenizerSpec(level="word", vocab_size=0, lowercase=True), False),
        (WORD, True),
    ],
)
def test_changing_a_tokenizer_setting_misses(
    tmp_path: Path, spec: TokenizerSpec, joint_vocab: bool
) -> None:
    corpus = tsv_corpus(tmp_path)
    cache_dir = tmp_path / "cache"
    prepared(corpus, cache_dir)
    changed = prepared(corpus, cache_dir, spec, joint_vocab)
    assert len(cache_files(cache_dir)) == 2
    assert_same_data(changed, prepared(corpus, None, spec, joint_vocab))


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 2},
        {"val_size": 12},
        {"test_size": 0.2},
        {"reverse": True},
        {"decode_html": False},
        {"max_src_len": 7},
        {"max_tgt_len": 8},
    ],
)
def test_changing_a_corpus_setting_misses(
    tmp_path: Path, change: dict[str, int | float | bool]
) -> None:
    corpus = tsv_corpus(tmp_path)
    cache_dir = tmp_path / "cache"
    prepared(corpus, cache_dir)
    changed_corpus = dataclasses.replace(corpus, **change)  # type: ignore[arg-type]  # the fields
    changed = prepared(changed_corpus, cache_dir)
    assert len(cache_files(cache_dir)) == 2
    assert_same_data(changed, prepared(changed_corpus, None))


def test_given_tokenizers_are_part_of_the_key(tmp_path: Path) -> None:
    """A resumed model's vocabularies must not be served ids encoded with the cached ones."""
    corpus = tsv_corpus(tmp_path)
    cache_dir = tmp_path / "cache"
    prepared(corpus, cache_dir)
    other_src, other_tgt = train_tokenizers(WORD, ["The dog runs ."], ["Le chien court !"])
    datamodule = Seq2SeqDataModule(
        corpus,
        tokenizer=WORD,
        src_tokenizer=other_src,
        tgt_tokenizer=other_tgt,
        cache_dir=cache_dir,
    )
    datamodule.setup()
    assert len(cache_files(cache_dir)) == 2
    assert datamodule.src_tokenizer is other_src and datamodule.tgt_tokenizer is other_tgt
    train = datamodule.datasets["train"].examples
    assert [ex.src_ids for ex in train] == encode_batch(other_src, [ex.src_text for ex in train])

    again = Seq2SeqDataModule(
        corpus,
        tokenizer=WORD,
        src_tokenizer=other_src,
        tgt_tokenizer=other_tgt,
        cache_dir=cache_dir,
    )
    again.setup()
    assert again.datasets["train"].examples == train
    assert again.src_tokenizer is other_src
    assert len(cache_files(cache_dir)) == 2


# --- Damage and writing -------------------------------------------------------------------------


def _only_entry(cache_dir: Path) -> Path:
    [name] = cache_files(cache_dir)
    return cache_dir / name


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _garbage(path: Path) -> None:
    path.write_bytes(b"not a zip file at all\n" * 100)


def _wrong_structure(path: Path) -> None:
    torch.save({"format": cache.CACHE_FORMAT, "splits": []}, path)


def _ids_out_of_vocabulary(path: Path) -> None:
    payload = torch.load(path, weights_only=True)
    payload["splits"]["train"]["src_ids"][0] = 10**6
    torch.save(payload, path)


def _offsets_past_the_end(path: Path) -> None:
    payload = torch.load(path, weights_only=True)
    payload["splits"]["val"]["tgt_text_offsets"][-1] += 5
    torch.save(payload, path)


@pytest.mark.parametrize(
    "damage",
    [_truncate, _empty, _garbage, _wrong_structure, _ids_out_of_vocabulary, _offsets_past_the_end],
)
def test_a_damaged_entry_is_rebuilt_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], None]
) -> None:
    corpus = tsv_corpus(tmp_path)
    cache_dir = tmp_path / "cache"
    cold = prepared(corpus, cache_dir)
    entry = _only_entry(cache_dir)
    damage(entry)
    with caplog.at_level(logging.WARNING):
        rebuilt = prepared(corpus, cache_dir)
    assert f"data cache file {entry} is unreadable" in caplog.text
    assert_same_data(cold, rebuilt)
    assert cache.load(entry, entry.stem.rsplit("-", 1)[1]) is not None  # overwritten, readable
    assert cache_files(cache_dir) == [entry.name]


def test_a_failed_write_warns_cleans_up_and_keeps_the_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def disk_full(obj: object, file: object) -> None:
        assert hasattr(file, "write")
        file.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    cache_dir = tmp_path / "cache"
    with caplog.at_level(logging.WARNING):
        datamodule = prepared(tsv_corpus(tmp_path), cache_dir)
    assert "cannot write the data cache file" in caplog.text
    assert "No space left on device" in caplog.text
    assert datamodule.datasets["train"]
    assert cache_files(cache_dir) == []  # no temporary file and no half entry


def test_writing_leaves_exactly_one_file_and_no_temporary_ones(tmp_path: Path) -> None:
    corpus = tsv_corpus(tmp_path)
    cache_dir = tmp_path / "cache"
    for _ in range(3):
        prepared(corpus, cache_dir)
    [name] = cache_files(cache_dir)
    assert name.endswith(".pt") and not name.startswith(".")


def test_cache_dir_none_or_empty_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = tsv_corpus(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))

    def fail(*args: object) -> None:
        raise AssertionError("the cache was used although it is off")

    monkeypatch.setattr(cache, "save", fail)
    monkeypatch.setattr(cache, "load", fail)
    for cache_dir in (None, ""):
        datamodule = Seq2SeqDataModule(corpus, tokenizer=WORD, cache_dir=cache_dir)
        datamodule.setup()
        assert datamodule.datasets["train"]
    assert sorted(os.listdir(tmp_path)) == before


def test_a_toy_corpus_is_not_cached(tmp_path: Path) -> None:
    corpus = ToyTranslation(seed=1, train_size=50, val_size=5, test_size=5, test_long_size=5)
    datamodule = prepared(corpus, tmp_path / "cache")
    assert datamodule.alignments["train"][0] is not None
    assert cache_files(tmp_path / "cache") == []


def test_a_missing_file_is_reported_by_the_corpus(tmp_path: Path) -> None:
    corpus = TsvCorpus(path=str(tmp_path / "missing.tsv"))
    with pytest.raises(DataError, match=r"missing\.tsv does not exist"):
        prepared(corpus, tmp_path / "cache")
    assert cache_files(tmp_path / "cache") == []


def test_alignments_round_trip(tmp_path: Path) -> None:
    """No file corpus has alignments yet; the format keeps them anyway, None apart from ()."""
    src, tgt = train_tokenizers(WORD, ["a b c"], ["x y"])
    examples = [EncodedExample([4, 5], [4], "a b", "x"), EncodedExample([], [], "", "")]
    alignments: list[tuple[tuple[int, int], ...] | None] = [((0, 0), (1, 0)), None]
    data = cache.CachedData(src, tgt, {"train": EncodedDataset(examples)}, {"train": alignments})
    path = tmp_path / "entry.pt"
    cache.save(path, "k", data)
    loaded = cache.load(path, "k")
    assert loaded is not None
    assert loaded.alignments == {"train": alignments}
    assert loaded.datasets["train"].examples == examples
    assert cache.load(path, "another key") is None


def test_the_config_passes_cache_dir_and_the_environment_overrides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = tsv_corpus(tmp_path)
    overrides = [f"run_dir={tmp_path}", "data=tsv", f"data.path={corpus.path}"]
    monkeypatch.delenv("SEQ2SEQ_CACHE_DIR", raising=False)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        default = instantiate(compose("config", overrides=overrides).data.module)
        monkeypatch.setenv("SEQ2SEQ_CACHE_DIR", str(tmp_path / "env"))
        from_env = instantiate(compose("config", overrides=overrides).data.module)
        off = instantiate(
            compose("config", overrides=[*overrides, "data.cache_dir=null"]).data.module
        )
    assert default.cache_dir == Path(".cache/seq2seq")
    assert from_env.cache_dir == tmp_path / "env"
    assert off.cache_dir is None
