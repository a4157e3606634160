"""The generated tasks: deterministic, disjoint splits, valid gold alignments, the grammar."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from seq2seq.data.toy import (
    ADJECTIVES,
    ARTICLES,
    CONJUNCTION,
    FILE_SUFFIXES,
    NEGATION,
    NOUNS,
    OBJECT_MARKER,
    PERIOD,
    PLURAL,
    PREPOSITIONS,
    SPLITS,
    VERBS,
    Copy,
    Example,
    Reverse,
    Sort,
    ToyTranslation,
    format_pharaoh,
    parse_pharaoh,
    write_splits,
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "make_toy_data.py"
Task = ToyTranslation | Reverse | Copy | Sort
TASK_TYPES = (ToyTranslation, Reverse, Copy, Sort)

NOUN_FORMS = {n.singular for n in NOUNS} | {n.plural for n in NOUNS}
PLURAL_NOUNS = {n.plural for n in NOUNS}
ADJECTIVE_FORMS = {a.source for a in ADJECTIVES}
PREPOSITION_FORMS = {p.source for p in PREPOSITIONS}
TRANSITIVE_FORMS = {f for v in VERBS if v.objects for f in (v.base, v.third_singular)}
VERB_TARGETS = {v.target for v in VERBS}


def small(task_type: type[Task], seed: int = 1) -> Task:
    """A quick instance: 2000 training pairs, 200 in each other split."""
    return task_type(seed=seed, train_size=2000, val_size=200, test_size=200, test_long_size=200)


@pytest.fixture(scope="module")
def toy() -> dict[str, list[Example]]:
    """The default task at its default sizes (what training uses)."""
    return ToyTranslation().splits()


@pytest.fixture(scope="module", params=TASK_TYPES, ids=lambda t: t.__name__)
def any_splits(request: pytest.FixtureRequest) -> dict[str, list[Example]]:
    task_type: type[Task] = request.param
    return small(task_type).splits()


def links_by_target(example: Example) -> dict[int, list[int]]:
    assert example.alignment is not None
    by_target: dict[int, list[int]] = {}
    for i, j in example.alignment:
        by_target.setdefault(j, []).append(i)
    return by_target


def links_by_source(example: Example) -> dict[int, list[int]]:
    assert example.alignment is not None
    by_source: dict[int, list[int]] = {}
    for i, j in example.alignment:
        by_source.setdefault(i, []).append(j)
    return by_source


# --- Every task -----------------------------------------------------------------------------------


def test_split_names_and_sizes(any_splits: dict[str, list[Example]]) -> None:
    assert tuple(any_splits) == SPLITS
    assert [len(any_splits[s]) for s in SPLITS] == [2000, 200, 200, 200]


@pytest.mark.parametrize("task_type", TASK_TYPES, ids=lambda t: t.__name__)
def test_deterministic_from_seed(task_type: type[Task]) -> None:
    first = small(task_type, seed=7).splits()
    assert first == small(task_type, seed=7).splits()
    other = small(task_type, seed=8).splits()
    for split in SPLITS:
        assert [ex.src for ex in first[split]] != [ex.src for ex in other[split]]


def test_no_source_in_two_splits(any_splits: dict[str, list[Example]]) -> None:
    sources = [ex.src for split in SPLITS for ex in any_splits[split]]
    assert len(set(sources)) == len(sources)


def test_test_long_is_longer_than_train(any_splits: dict[str, list[Example]]) -> None:
    longest_train = max(len(ex.src.split()) for ex in any_splits["train"])
    for split in ("val", "test"):
        assert max(len(ex.src.split()) for ex in any_splits[split]) <= longest_train
    assert all(len(ex.src.split()) > longest_train for ex in any_splits["test_long"])


def test_alignments_are_sorted_and_in_range(any_splits: dict[str, list[Example]]) -> None:
    for examples in any_splits.values():
        for ex in examples:
            assert ex.alignment is not None
            assert list(ex.alignment) == sorted(set(ex.alignment))
            n_src, n_tgt = len(ex.src.split()), len(ex.tgt.split())
            assert all(0 <= i < n_src and 0 <= j < n_tgt for i, j in ex.alignment)


def test_target_is_a_function_of_the_source(any_splits: dict[str, list[Example]]) -> None:
    targets: dict[str, set[str]] = {}
    for examples in any_splits.values():
        for ex in examples:
            targets.setdefault(ex.src, set()).add(ex.tgt)
    assert all(len(t) == 1 for t in targets.values())


def test_too_many_sentences_is_a_clear_error() -> None:
    def tiny(train_size: int) -> Copy:
        # 2 + 4 distinct sequences of length 1..2 over two tokens; 8 of length 3.
        return Copy(
            train_size=train_size,
            val_size=1,
            test_size=1,
            test_long_size=8,
            vocab_size=2,
            min_len=1,
            max_len=2,
            long_min_len=3,
            long_max_len=3,
        )

    exact = tiny(4).splits()
    assert sorted(ex.src for s in ("train", "val", "test") for ex in exact[s]) == sorted(
        ["w0", "w1", "w0 w0", "w0 w1", "w1 w0", "w1 w1"]
    )
    with pytest.raises(ValueError, match="distinct"):
        tiny(5).splits()
    with pytest.raises(ValueError, match="long_min_len"):
        Reverse(max_len=30, long_min_len=30)
    with pytest.raises(ValueError, match="train_size"):
        ToyTranslation(train_size=-1)


# --- The classic tasks ----------------------------------------------------------------------------


@pytest.mark.parametrize("task_type", (Reverse, Copy, Sort), ids=lambda t: t.__name__)
def test_classic_targets_and_alignments(task_type: type[Reverse | Copy | Sort]) -> None:
    for examples in small(task_type, seed=3).splits().values():
        for ex in examples:
            src, tgt = ex.src.split(), ex.tgt.split()
            if task_type is Reverse:
                assert tgt == src[::-1]
            elif task_type is Copy:
                assert tgt == src
            else:  # numeric order: w2 before w10
                assert [int(t[1:]) for t in tgt] == sorted(int(s[1:]) for s in src)
            assert ex.alignment is not None
            assert sorted(i for i, _ in ex.alignment) == list(range(len(src)))
            assert sorted(j for _, j in ex.alignment) == list(range(len(tgt)))
            assert all(src[i] == tgt[j] for i, j in ex.alignment)
            if task_type is Sort:  # stable: equal tokens keep their order
                by_token: dict[str, list[int]] = {}
                for i, j in ex.alignment:
                    by_token.setdefault(src[i], []).append(j)
                assert all(js == sorted(js) for js in by_token.values())
            assert task_type.min_len <= len(src) <= task_type.long_max_len


# --- The toy translation task ---------------------------------------------------------------------


def test_toy_sizes_vocabulary_and_lengths(toy: dict[str, list[Example]]) -> None:
    assert [len(toy[s]) for s in SPLITS] == [20000, 1000, 1000, 1000]
    vocabulary = {w for ex in toy["train"] for w in ex.src.split()}
    assert 100 <= len(vocabulary) <= 300
    lengths = Counter(len(ex.src.split()) for ex in toy["train"])
    assert min(lengths) >= 3 and max(lengths) <= 20
    # Mostly 4..20 tokens, with some of every length in between.
    assert lengths[3] < 0.01 * len(toy["train"])
    assert all(lengths[n] > 100 for n in range(4, 21))


def test_toy_sentences_look_like_sentences(toy: dict[str, list[Example]]) -> None:
    for ex in toy["train"][:2000] + toy["test_long"]:
        assert ex.src == " ".join(ex.src.split()) == ex.src.lower()
        assert ex.src.endswith(" .") and ex.tgt.endswith(" .")
        words = ex.src.split()
        for before, after in itertools.pairwise(words):
            if before == "a":
                assert after[0] not in "aeiou"
            if before == "an":
                assert after[0] in "aeiou"


def test_toy_every_word_but_inserted_ones_is_aligned(toy: dict[str, list[Example]]) -> None:
    dropped: Counter[str] = Counter()
    for ex in toy["train"]:
        src, tgt = ex.src.split(), ex.tgt.split()
        by_target = links_by_target(ex)
        for j, word in enumerate(tgt):
            # The object marker is the only inserted word, and it links to nothing.
            assert (j in by_target) == (word != OBJECT_MARKER)
        by_source = links_by_source(ex)
        for i, word in enumerate(src):
            assert (i in by_source) == (word not in ARTICLES)
            if i not in by_source:
                dropped[word] += 1
    assert set(dropped) == set(ARTICLES)
    assert sum(dropped.values()) > 5000


def test_toy_one_to_two_and_two_to_one(toy: dict[str, list[Example]]) -> None:
    one_to_two = two_to_one = 0
    for ex in toy["train"]:
        src, tgt = ex.src.split(), ex.tgt.split()
        for i, js in links_by_source(ex).items():
            assert len(js) <= 2
            if len(js) == 2:  # a plural noun: the noun, then the plural particle
                one_to_two += 1
                assert src[i] in PLURAL_NOUNS
                assert js[1] == js[0] + 1 and tgt[js[1]] == PLURAL
        for j, links in links_by_target(ex).items():
            assert len(links) <= 2
            if len(links) == 2:  # "does not" / "do not"
                two_to_one += 1
                assert tgt[j] == NEGATION
                assert [src[i] for i in links] in (["does", "not"], ["do", "not"])
    assert one_to_two > 1000 and two_to_one > 1000


def test_toy_is_verb_final(toy: dict[str, list[Example]]) -> None:
    moved = 0
    for ex in toy["train"]:
        src, tgt = ex.src.split(), ex.tgt.split()
        # Each clause ends with its verb: the word before "se" (and) and before ".".
        clause_ends = [j - 1 for j, w in enumerate(tgt) if w in (CONJUNCTION, PERIOD)]
        assert all(tgt[j] in VERB_TARGETS for j in clause_ends)
        (verb,) = links_by_target(ex)[len(tgt) - 2]
        moved += verb != len(src) - 2  # something followed the verb in English
        # The object marker exactly once per transitive verb.
        assert tgt.count(OBJECT_MARKER) == sum(w in TRANSITIVE_FORMS for w in src)
        # Negation comes right before the verb, not before the object.
        for j, word in enumerate(tgt):
            if word == NEGATION:
                assert tgt[j + 1] in VERB_TARGETS
    assert moved > 0.5 * len(toy["train"])


def test_toy_modifiers_follow_and_postpositions(toy: dict[str, list[Example]]) -> None:
    adjectives = postpositions = 0
    for ex in toy["train"][:5000]:
        src = ex.src.split()
        first_target = {i: min(js) for i, js in links_by_source(ex).items()}
        for i, word in enumerate(src):
            if word in ADJECTIVE_FORMS or word in PREPOSITION_FORMS:
                noun = next(k for k in range(i + 1, len(src)) if src[k] in NOUN_FORMS)
                # Adjectives come after their noun; a postposition after its noun phrase.
                assert first_target[noun] < first_target[i]
                adjectives += word in ADJECTIVE_FORMS
                postpositions += word in PREPOSITION_FORMS
    assert adjectives > 1000 and postpositions > 1000


def test_toy_adjectives_are_mirrored() -> None:
    # Found by generation, not written by hand: a noun phrase with two adjectives.
    for ex in small(ToyTranslation).splits()["train"]:
        src = ex.src.split()
        pairs = [
            i
            for i in range(len(src) - 2)
            if src[i] in ADJECTIVE_FORMS
            and src[i + 1] in ADJECTIVE_FORMS
            and src[i + 2] in NOUN_FORMS
        ]
        if pairs:
            i = pairs[0]
            targets = links_by_source(ex)
            assert targets[i + 2][-1] < targets[i + 1][0] < targets[i][0]
            return
    pytest.fail("no noun phrase with two adjectives in 2000 sentences")


# --- Files and the script -------------------------------------------------------------------------


def read_tree(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_pharaoh_round_trip() -> None:
    alignment = ((0, 1), (1, 0), (1, 2), (12, 3))
    assert format_pharaoh(alignment) == "0-1 1-0 1-2 12-3"
    assert format_pharaoh(((1, 0), (0, 1))) == "0-1 1-0"
    assert parse_pharaoh("0-1 1-0 1-2 12-3\n") == alignment
    assert format_pharaoh(None) == "" and parse_pharaoh("") == ()
    with pytest.raises(ValueError, match="Pharaoh"):
        parse_pharaoh("0-1 2:3")


def test_write_splits(tmp_path: Path) -> None:
    splits = ToyTranslation(seed=2, train_size=300, val_size=30, test_size=30).splits()
    splits["val"][0] = Example("a b", "c", None)
    write_splits(splits, tmp_path / "a")
    write_splits(splits, tmp_path / "b")
    files = read_tree(tmp_path / "a")
    assert files == read_tree(tmp_path / "b")
    assert sorted(files) == sorted(f"{s}.{x}" for s in SPLITS for x in FILE_SUFFIXES)
    for split, examples in splits.items():
        columns = [files[f"{split}.{x}"].decode("utf-8") for x in FILE_SUFFIXES]
        assert all(c.endswith("\n") and "\r" not in c for c in columns)
        src, tgt, align = (c.split("\n")[:-1] for c in columns)
        assert src == [ex.src for ex in examples] and tgt == [ex.tgt for ex in examples]
        assert [parse_pharaoh(line) for line in align] == [ex.alignment or () for ex in examples]
    assert files["val.align"].startswith(b"\n")  # no gold alignment: an empty line


def run_script(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, check=False
    )


@pytest.mark.parametrize("task", ["toy", "sort"])
def test_script_is_reproducible(tmp_path: Path, task: str) -> None:
    args = ["--task", task, "--seed", "5", "--train-size", "500"]
    for name in ("a", "b"):
        done = run_script(["--out", str(tmp_path / name), *args])
        assert done.returncode == 0, done.stderr
        assert len(done.stderr.splitlines()) == len(SPLITS) * len(FILE_SUFFIXES)
    files = read_tree(tmp_path / "a")
    assert files == read_tree(tmp_path / "b")
    task_type = {"toy": ToyTranslation, "sort": Sort}[task]
    write_splits(task_type(seed=5, train_size=500).splits(), tmp_path / "library")
    assert files == read_tree(tmp_path / "library")


def test_script_errors(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = run_script(["--out", str(blocker / "data"), "--train-size", "10"])
    assert done.returncode == 2
    assert str(blocker / "data") in done.stderr and "Traceback" not in done.stderr
    for bad in (["--task", "nope"], ["--train-size", "0"], ["--seed", "x"], []):
        done = run_script(["--out", str(tmp_path / "x"), *bad] if bad else bad)
        assert done.returncode == 2 and "usage:" in done.stderr
