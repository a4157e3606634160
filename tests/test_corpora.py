"""Corpus reading: normalization, line-exact readers, errors that name file:line, no-leak splits."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest

from seq2seq.data.corpora import (
    DataError,
    Multi30k,
    ParallelCorpus,
    Tatoeba,
    TsvCorpus,
    filter_pairs,
    normalize,
    read_parallel,
    read_tsv,
    split_by_source,
)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def write(path: Path, data: str | bytes) -> Path:
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


# --- normalize ----------------------------------------------------------------------------------


@pytest.mark.parametrize("space", ["\u00a0", "\u202f", "\u2009"])
def test_normalize_turns_odd_spaces_into_plain_spaces(space: str) -> None:
    assert normalize(f"Salut{space}!") == "Salut !"


def test_normalize_removes_zero_width_space() -> None:
    assert normalize("Bon\u200bjour") == "Bonjour"


def test_normalize_composes_to_nfc() -> None:
    decomposed = "e\u0301te\u0301"  # e + combining acute accent
    assert normalize(decomposed) == "\u00e9t\u00e9"


def test_normalize_decodes_html_entities_unless_told_not_to() -> None:
    assert normalize("Tom &amp; Jerry&#39;s &quot;cat&quot;") == 'Tom & Jerry\'s "cat"'
    assert normalize("&#x41;&nbsp;B") == "A B"  # a decoded no-break space is a space too
    assert normalize("Tom &amp; Jerry", decode_html=False) == "Tom &amp; Jerry"


def test_normalize_leaves_text_that_only_looks_like_an_entity() -> None:
    # html.unescape alone would turn "&notice" into "¬ice" (an HTML5 legacy entity).
    assert normalize("AT&T &notice &unknownentity;") == "AT&T &notice &unknownentity;"


def test_normalize_strips_outer_whitespace_but_keeps_inner_runs() -> None:
    assert normalize("  two  spaces\u00a0\t\n") == "two  spaces"


# --- read_parallel ------------------------------------------------------------------------------


def test_read_parallel_keeps_tab_and_unicode_separators_inside_lines(tmp_path: Path) -> None:
    # Each of these would split a line for str.splitlines(); only "\n" ends a line here.
    src = write(tmp_path / "a.de", "eins\tzwei\nline\u2028sep\nnel\x85x\x0by\x0cz\r\nletzte\n")
    tgt = write(tmp_path / "a.en", "one two\nline sep\nnel x y z\nlast\n")
    pairs = read_parallel(src, tgt)
    assert len(pairs) == 4
    assert pairs[0] == ("eins\tzwei", "one two")
    assert pairs[1][0] == "line\u2028sep"
    assert pairs[2][0] == "nel\x85x\x0by\x0cz"  # and the "\r" of the CRLF is gone
    assert pairs[3] == ("letzte", "last")


def test_read_parallel_without_final_newline(tmp_path: Path) -> None:
    src = write(tmp_path / "a.de", "eins\nzwei")
    tgt = write(tmp_path / "a.en", "one\ntwo\n")
    assert read_parallel(src, tgt) == [("eins", "one"), ("zwei", "two")]


def test_read_parallel_mismatched_line_counts_names_both_files_and_counts(tmp_path: Path) -> None:
    src = write(tmp_path / "train.de", "a\nb\nc\n")
    tgt = write(tmp_path / "train.en", "a\nb\n")
    with pytest.raises(DataError) as error:
        read_parallel(src, tgt)
    message = str(error.value)
    assert f"{src} has 3 lines" in message and f"{tgt} has 2" in message
    assert "\n" not in message


def test_invalid_utf8_names_file_line_and_byte_offset(tmp_path: Path) -> None:
    src = write(tmp_path / "train.de", b"gut\nsch\xf6n\n")  # Latin-1 "ö" on line 2
    tgt = write(tmp_path / "train.en", "good\nnice\n")
    with pytest.raises(DataError) as error:
        read_parallel(src, tgt)
    message = str(error.value)
    assert f"{src}:2:" in message
    assert "byte offset 7 of the file" in message  # "gut\n" is 4 bytes, "sch" 3 more
    assert "0xf6" in message and "iconv" in message


def test_missing_file_says_what_was_expected_and_how_to_get_it(tmp_path: Path) -> None:
    write(tmp_path / "train.de", "a\n")
    write(tmp_path / "train.en", "a\n")
    with pytest.raises(DataError) as error:
        Multi30k(root=str(tmp_path)).splits()
    message = str(error.value)
    assert str(tmp_path / "val.de") in message
    assert "the Multi30k validation source file val.de" in message
    assert f"seq2seq download multi30k --root {tmp_path}" in message
    assert "by hand" in message and "\n" not in message


def test_read_parallel_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        read_parallel(tmp_path / "nope.de", tmp_path / "nope.en")


# --- read_tsv -----------------------------------------------------------------------------------


def test_read_tsv_ignores_extra_columns_and_skips_blank_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(
        tmp_path / "fra.txt",
        "Go.\tVa !\tCC-BY 2.0 (France) Attribution: tatoeba.org #2877272\n\n"
        "Hi.\tSalut\u202f!\r\n   \nI &amp; you.\tToi et moi.\n",
    )
    with caplog.at_level(logging.INFO, logger="seq2seq.data.corpora"):
        pairs = read_tsv(path)
    assert pairs == [("Go.", "Va !"), ("Hi.", "Salut !"), ("I & you.", "Toi et moi.")]
    assert "skipped 2 blank lines" in caplog.text


def test_read_tsv_line_without_tab_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "fra.txt", "Go.\tVa !\n\nHi. Salut !\n")
    with pytest.raises(DataError) as error:
        read_tsv(path)
    assert f"{path}:3: no TAB" in str(error.value)
    assert "source<TAB>target" in str(error.value)


# --- filter_pairs -------------------------------------------------------------------------------


def test_filter_pairs_logs_counts_per_reason(caplog: pytest.LogCaptureFixture) -> None:
    pairs = [("a b", "x"), ("", "x"), ("a", ""), ("a", ""), ("a b c d", "x"), ("a", "x y z")]
    with caplog.at_level(logging.INFO, logger="seq2seq.data.corpora"):
        kept = filter_pairs(pairs, 3, 2, strict=False, origin="multi30k train")
    assert kept == [("a b", "x")]
    assert (
        "multi30k train: dropped 1 pair: empty source; 2 pairs: empty target; "
        "1 pair: source longer than 3 tokens; 1 pair: target longer than 2 tokens (kept 1 of 6)"
    ) in caplog.text


def test_filter_pairs_without_limits_keeps_long_pairs_and_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pairs = [("a " * 500, "b " * 500)]
    with caplog.at_level(logging.INFO, logger="seq2seq.data.corpora"):
        assert filter_pairs(pairs, None, None, strict=False, origin="x") == pairs
    assert caplog.text == ""


def test_filter_pairs_strict_raises_at_the_first_offending_pair() -> None:
    pairs = [("a", "x"), ("a b c", "x")]
    with pytest.raises(DataError, match=r"^x, pair 2: source longer than 2 tokens"):
        filter_pairs(pairs, 2, None, strict=True, origin="x")


def test_strict_corpus_names_file_and_line(tmp_path: Path) -> None:
    write(tmp_path / "train.de", "a\n\nc\n")
    write(tmp_path / "train.en", "x\ny\nz\n")
    corpus = ParallelCorpus(str(tmp_path), "de", "en", val="train", test="train", strict=True)
    with pytest.raises(DataError) as error:
        corpus.splits()
    assert f"{tmp_path / 'train.de'}:2 and {tmp_path / 'train.en'}:2: empty source" in str(
        error.value
    )


def test_strict_tsv_corpus_names_the_line_after_the_split(tmp_path: Path) -> None:
    lines = [f"s{i}\tt{i}" for i in range(20)] + ["one two three four\tt"]
    path = write(tmp_path / "pairs.tsv", "\n\n" + "\n".join(lines) + "\n")
    corpus = TsvCorpus(str(path), val_size=0, test_size=0, max_src_len=3, strict=True)
    with pytest.raises(DataError, match=rf"^{path}:23: source longer than 3 tokens"):
        corpus.splits()


def test_empty_training_set_after_filtering_names_the_files(tmp_path: Path) -> None:
    write(tmp_path / "train.de", "ein sehr langer Satz\n\n")
    write(tmp_path / "train.en", "a very long sentence\nx\n")
    corpus = ParallelCorpus(str(tmp_path), "de", "en", val="train", test="train", max_src_len=2)
    with pytest.raises(DataError) as error:
        corpus.splits()
    message = str(error.value)
    assert "no training pairs left" in message
    assert str(tmp_path / "train.de") in message and str(tmp_path / "train.en") in message


def test_empty_tsv_training_set_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "pairs.tsv", "\tx\ny\t\n")
    with pytest.raises(DataError, match=f"no training pairs left from {path}"):
        TsvCorpus(str(path)).splits()


# --- split_by_source ----------------------------------------------------------------------------


def _pairs_with_shared_sources() -> list[tuple[str, str]]:
    """300 sources with 1..4 translations each (like Tatoeba), 750 pairs."""
    return [(f"src {i}", f"tgt {i}.{j}") for i in range(300) for j in range(1 + i % 4)]


def test_split_by_source_keeps_each_source_in_one_split() -> None:
    pairs = _pairs_with_shared_sources()
    splits = split_by_source(pairs, val_size=0.1, test_size=75, seed=3)
    sources = {name: {src for src, _ in split} for name, split in splits.items()}
    assert not sources["train"] & sources["val"]
    assert not sources["train"] & sources["test"]
    assert not sources["val"] & sources["test"]
    # Every pair exactly once.
    assert Counter(p for split in splits.values() for p in split) == Counter(pairs)
    # Roughly as asked: a split overshoots by less than one group (at most 4 pairs).
    assert 75 <= len(splits["val"]) < 75 + 4
    assert 75 <= len(splits["test"]) < 75 + 4


def test_split_by_source_is_deterministic_and_seeded() -> None:
    pairs = _pairs_with_shared_sources()
    first = split_by_source(pairs, 0.1, 0.1, seed=7)
    assert split_by_source(pairs, 0.1, 0.1, seed=7) == first
    assert split_by_source(pairs, 0.1, 0.1, seed=8) != first


def test_split_by_source_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="val_size"):
        split_by_source([("a", "b")], val_size=1.5, test_size=0, seed=1)
    with pytest.raises(ValueError, match="test_size"):
        split_by_source([("a", "b")], val_size=0, test_size=-1, seed=1)


# --- Corpus classes -----------------------------------------------------------------------------


def test_parallel_corpus_reads_the_three_splits(tmp_path: Path) -> None:
    for split, count in (("train", 5), ("dev", 2), ("test_2016_flickr", 3)):
        write(tmp_path / f"{split}.de", "".join(f"{split} satz {i}\n" for i in range(count)))
        write(tmp_path / f"{split}.en", "".join(f"{split} sentence {i}\n" for i in range(count)))
    splits = Multi30k(root=str(tmp_path), val="dev").splits()
    assert {name: len(examples) for name, examples in splits.items()} == {
        "train": 5,
        "val": 2,
        "test": 3,
    }
    first = splits["test"][0]
    assert (first.src, first.tgt, first.alignment) == (
        "test_2016_flickr satz 0",
        "test_2016_flickr sentence 0",
        None,
    )


def test_length_limits_apply_to_training_only(tmp_path: Path) -> None:
    for split in ("train", "val", "test"):
        write(tmp_path / f"{split}.de", "kurz\nein viel zu langer Satz\n")
        write(tmp_path / f"{split}.en", "short\na far too long sentence\n")
    splits = ParallelCorpus(str(tmp_path), "de", "en", max_src_len=3).splits()
    assert [ex.src for ex in splits["train"]] == ["kurz"]
    assert len(splits["val"]) == len(splits["test"]) == 2


def test_tsv_corpus_splits_and_reverses(tmp_path: Path) -> None:
    lines = [f"en {i}\tfr {i}.{j}" for i in range(100) for j in range(2)]
    path = write(tmp_path / "pairs.tsv", "\n".join(lines) + "\n")
    splits = TsvCorpus(str(path), val_size=20, test_size=0.1, seed=2).splits()
    assert sum(len(examples) for examples in splits.values()) == 200
    assert len(splits["val"]) == 20 and len(splits["test"]) == 20
    reverse = TsvCorpus(str(path), val_size=20, test_size=20, seed=2, reverse=True).splits()
    assert reverse["train"][0].src.startswith("fr ") and reverse["train"][0].tgt.startswith("en ")


def test_relative_paths_resolve_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "data").mkdir()
    write(tmp_path / "data" / "pairs.tsv", "".join(f"a{i}\tb{i}\n" for i in range(10)))
    monkeypatch.chdir(tmp_path)
    assert len(TsvCorpus("data/pairs.tsv", val_size=1, test_size=1).splits()["train"]) == 8


def test_tatoeba_missing_file_says_how_to_download(tmp_path: Path) -> None:
    path = tmp_path / "fra.txt"
    with pytest.raises(DataError) as error:
        Tatoeba(path=str(path)).splits()
    assert f"seq2seq download tatoeba --root {tmp_path}" in str(error.value)


# --- The real corpora (../shared/data), when present --------------------------------------------


def _shared(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"{path} is absent: the real-corpus smoke tests need the shared data")
    return path


def test_real_multi30k() -> None:
    root = _shared("multi30k")
    splits = Multi30k(root=str(root)).splits()
    assert [len(splits[name]) for name in ("train", "val", "test")] == [29000, 1014, 1000]
    # train.de line 7366 holds a TAB inside the sentence: it stays one sentence, still paired
    # with its English line (a split on the TAB or a line shift would break this).
    line_7366 = splits["train"][7365]
    assert "\t" in line_7366.src and line_7366.src.endswith('Wasserfontäne."')
    assert line_7366.tgt == "Two males and one female playing in a fountain of water."
    texts = [text for ex in splits["train"] for text in (ex.src, ex.tgt)]
    assert not any("\u00a0" in text for text in texts)
    assert not any("&amp;" in text for text in texts)
    assert any(" & " in ex.tgt for ex in splits["train"])
    assert all(text == text.strip() for text in texts)


def test_real_tatoeba() -> None:
    path = _shared("tatoeba-fra-eng") / "fra.txt"
    assert len(read_tsv(path)) == 167130
    splits = Tatoeba(path=str(path)).splits()
    assert sum(len(examples) for examples in splits.values()) == 167130
    sources = {name: {ex.src for ex in examples} for name, examples in splits.items()}
    assert not sources["train"] & (sources["val"] | sources["test"])
    assert not sources["val"] & sources["test"]
    assert len(set().union(*sources.values())) == 116830  # distinct English sentences
    for examples in splits.values():
        assert not any("\u202f" in ex.tgt or "\u200b" in ex.tgt for ex in examples)


def test_utf8_byte_order_mark_is_not_part_of_the_first_sentence(tmp_path: Path) -> None:
    path = write(tmp_path / "pairs.tsv", b"\xef\xbb\xbfGo.\tVa !\n")
    assert read_tsv(path) == [("Go.", "Va !")]


def test_hydra_instantiates_corpora_and_rejects_unknown_keys(tmp_path: Path) -> None:
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    corpus = instantiate(
        {"_target_": "seq2seq.data.corpora.Multi30k", "root": str(tmp_path), "max_src_len": 50}
    )
    assert corpus == Multi30k(root=str(tmp_path), max_src_len=50)
    with pytest.raises(InstantiationException, match="max_source_len"):
        instantiate({"_target_": "seq2seq.data.corpora.Tatoeba", "max_source_len": 50})


# ---- gold alignments of file corpora (data.align) ---------------------------------------------


def write_aligned(root: Path, align: dict[str, str]) -> None:
    """train/val/test of three pairs each, with the Pharaoh lines of ``align`` (default: one
    link per word)."""
    for split in ("train", "val", "test"):
        (root / f"{split}.xx").write_text("a b c\nd e\nf g h i j k\n", encoding="utf-8")
        (root / f"{split}.yy").write_text("C B A\nE D\nK J I H G F\n", encoding="utf-8")
        lines = align.get(split, "0-2 1-1 2-0\n0-1 1-0\n0-5 5-0\n")
        (root / f"{split}.al").write_text(lines, encoding="utf-8")


def test_alignment_files_give_each_kept_pair_its_links(tmp_path: Path) -> None:
    write_aligned(tmp_path, {})
    corpus = ParallelCorpus(str(tmp_path), "xx", "yy", align="al", max_src_len=5)
    splits = corpus.splits()
    # The third training pair (6 words) is dropped by max_src_len, and its links with it.
    assert [ex.alignment for ex in splits["train"]] == [((0, 2), (1, 1), (2, 0)), ((0, 1), (1, 0))]
    assert splits["test"][2].alignment == ((0, 5), (5, 0))
    assert tmp_path / "train.al" in corpus.source_files()  # the data cache hashes it too
    without = ParallelCorpus(str(tmp_path), "xx", "yy").splits()
    assert all(ex.alignment is None for ex in without["val"])


@pytest.mark.parametrize(
    ("val", "expected"),
    [
        ("0-0\n", r"val\.al has 1 lines but its sentence files have 3"),
        ("0-0\n1-p-1\n\n", r"val\.al:2: .*sure links i-j only"),
        ("0-0\n0-2\n\n", r"val\.al:2: link 0-2 is outside its sentence pair of 2 source and 2"),
        ("0:0\n\n\n", r"val\.al:1: .*'0:0'"),
    ],
)
def test_a_bad_alignment_file_names_its_line(tmp_path: Path, val: str, expected: str) -> None:
    write_aligned(tmp_path, {"val": val})
    with pytest.raises(DataError, match=expected):
        ParallelCorpus(str(tmp_path), "xx", "yy", align="al").splits()
