"""AER against hand-computed values, Pharaoh parsing, argmax links and scripts/alignment.py
(seq2seq align): its written links, their AER, symmetrization of two models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seq2seq.analysis.alignment import (
    AlignmentCounts,
    AlignmentFormatError,
    GoldAlignment,
    argmax_links,
    check_in_range,
    corpus_aer,
    count_links,
    parse_pharaoh,
    read_pharaoh,
)

ROOT = Path(__file__).resolve().parents[1]


def test_pharaoh_reads_sure_and_both_spellings_of_possible_links() -> None:
    gold = parse_pharaoh("0-0 1-p-2 3p4 2-1")
    assert gold.sure == {(0, 0), (2, 1)}
    assert gold.possible == {(0, 0), (2, 1), (1, 2), (3, 4)}  # sure links are possible too
    assert parse_pharaoh("") == GoldAlignment(frozenset())


@pytest.mark.parametrize("token", ["0_1", "a-b", "1-", "-2", "1-x-2", "1--2"])
def test_pharaoh_rejects_a_bad_link_naming_it_and_the_line(token: str) -> None:
    with pytest.raises(AlignmentFormatError, match=rf"f.align:7: '{token}'.*0-based"):
        parse_pharaoh(f"0-0 {token}", "f.align:7")


def test_aer_equals_the_hand_computed_value() -> None:
    # S = {0-0, 1-1}, P = S + {2-1}; A = {0-0, 2-1, 2-2}.
    # |A∩S| = 1, |A∩P| = 2, |A| = 3, |S| = 2: AER = 1 - (1 + 2) / (3 + 2) = 0.4.
    gold = parse_pharaoh("0-0 1-1 2-p-1")
    counts = count_links([(0, 0), (2, 1), (2, 2)], gold)
    assert counts == AlignmentCounts(hits_sure=1, hits_possible=2, predicted=3, sure=2)
    assert counts.aer == pytest.approx(0.4)
    assert count_links([(0, 0), (1, 1)], gold).aer == 0.0  # exactly the sure links
    assert count_links([(2, 2)], gold).aer == 1.0  # nothing right


def test_corpus_aer_sums_counts_before_dividing() -> None:
    gold = [parse_pharaoh("0-0"), parse_pharaoh("0-0 1-1 2-2 3-3")]
    predicted = [[(0, 1)], [(0, 0), (1, 1), (2, 2), (3, 3)]]
    # Sentence AERs are 1 and 0 (mean 0.5); corpus: 1 - (0 + 4 + 0 + 4) / (5 + 5) = 0.2.
    assert corpus_aer(predicted, gold) == pytest.approx(0.2)


def test_argmax_links_align_each_target_word_to_its_most_attended_source_word() -> None:
    weights = torch.tensor(
        [[0.1, 0.7, 0.2, 0.0], [0.6, 0.3, 0.1, 0.0], [0.2, 0.2, 0.6, 0.0], [0.0, 0.0, 1.0, 0.0]]
    )  # 3 words + EOS over 3 source words + 1 padding position
    assert argmax_links(weights, src_len=3, tgt_len=3) == [(1, 0), (0, 1), (2, 2)]
    assert argmax_links(weights, src_len=3, tgt_len=0) == []


def test_a_link_outside_the_sentence_names_the_line() -> None:
    with pytest.raises(AlignmentFormatError, match=r"a\.align:3: link 5-0 is outside"):
        check_in_range(parse_pharaoh("0-0 5-0"), 3, 2, "a.align:3")


def run_script(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/alignment.py", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_script_aer_equals_the_aer_of_its_own_argmax_alignments(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """The script's number is recomputed here from the model's forced-decoding attention."""
    from seq2seq import Translator

    sources = ["the dog sees a cat .", "a red fox sleeps ."]
    targets = ["kodan tula ka moto .", "nafo resi sulo ."]
    gold_lines = ["1-0 3-1 4-3 2-2 5-4 2p3", "2-0 1-1 3-2 4-3"]
    for name, lines in [("s", sources), ("t", targets), ("a", gold_lines)]:
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    completed = run_script(
        "--model", tiny_checkpoint, "--src", tmp_path / "s", "--tgt", tmp_path / "t",
        "--align", tmp_path / "a",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    forced = Translator.load(tiny_checkpoint).force_decode(sources, targets)
    predicted = [
        argmax_links(pair.attention, len(s.split()), len(t.split()))
        for pair, s, t in zip(forced, sources, targets, strict=True)
        if pair.attention is not None
    ]
    expected = corpus_aer(predicted, [parse_pharaoh(line) for line in gold_lines])
    assert completed.stdout.startswith(f"AER: {expected:.4f}  precision: ")


def test_script_refuses_files_that_are_not_parallel(tiny_checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "s").write_text("a b\nc d\n")
    (tmp_path / "t").write_text("x y\n")
    (tmp_path / "a").write_text("0-0\n0-0\n")
    completed = run_script(
        "--model", tiny_checkpoint, "--src", tmp_path / "s", "--tgt", tmp_path / "t",
        "--align", tmp_path / "a",
    )  # fmt: skip
    assert completed.returncode == 2
    assert (
        "line-parallel" in completed.stderr and f"{tmp_path / 't'} has 1 lines" in completed.stderr
    )
    assert "Traceback" not in completed.stderr


def parallel_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    sources = ["the dog sees a cat .", "a red fox sleeps .", "the cat ."]
    targets = ["kodan tula ka moto .", "nafo resi sulo .", "moto ."]
    gold_lines = ["1-0 3-1 4-3 2-2 5-4 2p3", "2-0 1-1 3-2 4-3", "1-0 2-1"]
    paths = []
    for name, lines in [("s", sources), ("t", targets), ("a", gold_lines)]:
        (tmp_path / name).write_text("\n".join(lines) + "\n")
        paths.append(tmp_path / name)
    return paths[0], paths[1], paths[2]


def test_written_links_are_the_argmax_and_give_the_printed_aer(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    from seq2seq import Translator

    src, tgt, gold = parallel_files(tmp_path)
    written = tmp_path / "links"
    completed = run_script(
        "--model", tiny_checkpoint, "--src", src, "--tgt", tgt, "--align", gold,
        "--write", written, "--json",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    printed = json.loads(completed.stdout)
    links = [sorted(alignment.sure) for alignment in read_pharaoh(written)]
    references = read_pharaoh(gold)
    assert printed["aer"] == pytest.approx(corpus_aer(links, references))
    counts = sum(
        (count_links(a, g) for a, g in zip(links, references, strict=True)), AlignmentCounts()
    )
    assert printed["precision"] == pytest.approx(counts.hits_possible / counts.predicted)
    assert printed["recall"] == pytest.approx(counts.hits_sure / counts.sure)
    sources, targets = src.read_text().splitlines(), tgt.read_text().splitlines()
    forced = Translator.load(tiny_checkpoint).force_decode(sources, targets)
    for pair, source, target, predicted in zip(forced, sources, targets, links, strict=True):
        assert pair.attention is not None
        words = len(source.split()), len(target.split())
        assert predicted == sorted(argmax_links(pair.attention, *words))

    # Without gold: the same links, nothing printed.
    alone = run_script(
        "--model", tiny_checkpoint, "--src", src, "--tgt", tgt, "--write", tmp_path / "alone"
    )
    assert alone.returncode == 0 and alone.stdout == "", alone.stderr
    assert (tmp_path / "alone").read_text() == written.read_text()


@pytest.mark.parametrize("method", ["intersection", "union", "grow-diag-final-and"])
def test_symmetrized_links_join_the_two_directions_files(
    tiny_checkpoint: Path, tmp_path: Path, method: str
) -> None:
    """--reverse-model R: R aligns target->source (its links turned around), and the written file
    is the symmetrization of the two one-way files, scored as alignment.py scores it."""
    from seq2seq.analysis.word_alignment import symmetrize, transpose

    src, tgt, gold = parallel_files(tmp_path)
    model = ["--model", tiny_checkpoint]
    forward = run_script(*model, "--src", src, "--tgt", tgt, "--write", tmp_path / "fwd")
    backward = run_script(*model, "--src", tgt, "--tgt", src, "--write", tmp_path / "rev")
    both = run_script(
        *model, "--reverse-model", tiny_checkpoint, "--symmetrize", method, "--src", src,
        "--tgt", tgt, "--align", gold, "--write", tmp_path / "sym", "--json",
    )  # fmt: skip
    for completed in (forward, backward, both):
        assert completed.returncode == 0, completed.stderr
    one_way = [sorted(a.sure) for a in read_pharaoh(tmp_path / "fwd")]
    other_way = [transpose(a.sure) for a in read_pharaoh(tmp_path / "rev")]
    expected = [symmetrize(a, b, method) for a, b in zip(one_way, other_way, strict=True)]  # type: ignore[arg-type]
    written = [sorted(a.sure) for a in read_pharaoh(tmp_path / "sym")]
    assert written == expected
    assert json.loads(both.stdout)["aer"] == pytest.approx(corpus_aer(written, read_pharaoh(gold)))


def test_align_refuses_what_it_cannot_do(tiny_checkpoint: Path, tmp_path: Path) -> None:
    src, tgt, gold = parallel_files(tmp_path)
    files = ["--model", tiny_checkpoint, "--src", src, "--tgt", tgt]
    nothing = run_script(*files)
    assert nothing.returncode == 2 and "--write FILE" in nothing.stderr
    layer = run_script(*files, "--align", gold, "--layer", "1")
    assert layer.returncode == 2 and "one attention map" in layer.stderr, layer.stderr
    threshold = run_script(*files, "--align", gold, "--alignment", "soft")
    assert threshold.returncode == 2 and "give 'hard' or a threshold" in threshold.stderr
    alone = run_script(*files, "--align", gold, "--symmetrize", "union")
    assert alone.returncode == 2 and "give --reverse-model" in alone.stderr
    none = run_script(*files, "--align", gold, "--symmetrize", "none")
    assert none.returncode == 2 and "eflomal's source->target links: give --eflomal" in none.stderr
    missing = run_script(*files, "--align", tmp_path / "nope")
    assert missing.returncode == 2 and "the gold links (--align)" in missing.stderr
    for completed in (nothing, layer, threshold, alone, none, missing):
        assert "Traceback" not in completed.stderr


def test_align_says_what_it_cannot_link(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """Unknown words (most of them: a model of other languages, or a reverse model of the wrong
    direction) and pairs with one side blank are said; --json without gold says what it wrote."""
    (tmp_path / "s").write_text("zzz qqq xxx .\n\nthe cat .\n")
    (tmp_path / "t").write_text("moto .\nmoto .\nmoto .\n")
    completed = run_script(
        "--model", tiny_checkpoint, "--src", tmp_path / "s", "--tgt", tmp_path / "t",
        "--write", tmp_path / "w", "--json",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert "reads 3 source word(s) as <unk> (e.g. zzz" in completed.stderr
    assert "1 sentence pair(s) have one side blank (lines 2): they get no links" in completed.stderr
    assert json.loads(completed.stdout) == {
        "sentences": 3, "links": len((tmp_path / "w").read_text().split()),
        "write": str(tmp_path / "w"),
    }  # fmt: skip
    reversed_model = run_script(
        "--model", tiny_checkpoint, "--src", tmp_path / "t", "--tgt", tmp_path / "s",
        "--write", tmp_path / "r",
    )  # fmt: skip
    assert "reads most target words as <unk>" in reversed_model.stderr
