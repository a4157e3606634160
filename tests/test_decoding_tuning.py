"""Choosing beam size and length penalty on val: every pair scored with sacreBLEU, best first."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import sacrebleu

from seq2seq.analysis.decoding import tune_decoding

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ["a small dog runs on the grass .", "two men play music in the street ."]


class Scripted:
    """Translates perfectly with beam 5 and length penalty 1.0, worse otherwise."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, float]] = []

    def translate(
        self, sentences: Sequence[str], beam_size: int, length_penalty: float, batch_size: int
    ) -> list[str]:
        self.calls.append((beam_size, length_penalty))
        if (beam_size, length_penalty) == (5, 1.0):
            return list(REFERENCES)
        words = 3 if beam_size == 1 else 5
        return [" ".join(reference.split()[:words]) for reference in REFERENCES]


def test_every_pair_is_scored_and_the_best_comes_first() -> None:
    translator = Scripted()
    scores = tune_decoding(translator, ["x", "y"], REFERENCES, [1, 5], [0.0, 1.0])
    assert translator.calls == [(1, 0.0), (5, 0.0), (5, 1.0)]  # greedy once
    assert (scores[0].beam_size, scores[0].length_penalty) == (5, 1.0)
    assert scores[0].bleu == sacrebleu.corpus_bleu(REFERENCES, [REFERENCES]).score
    assert [s.bleu for s in scores] == sorted((s.bleu for s in scores), reverse=True)


def test_the_script_tunes_a_trained_model(tiny_checkpoint: Path, tmp_path: Path) -> None:
    src, ref = tmp_path / "val.src", tmp_path / "val.tgt"
    src.write_text("the dog sees a cat .\nmy friend sings .\n")
    ref.write_text("kodan tula ka moto .\nluno keba .\n")
    completed = subprocess.run(
        [sys.executable, "scripts/tune_decoding.py", "--model", str(tiny_checkpoint),
         "--src", str(src), "--ref", str(ref), "--beam-sizes", "1,2", "--length-penalties", "0,1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert len(completed.stdout.strip().splitlines()) == 3  # greedy, beam 2 twice
    greedy = [line for line in completed.stdout.splitlines() if line.startswith("beam  1")]
    assert len(greedy) == 1 and "length penalty    –" in greedy[0]  # none changes greedy search
    assert "best on these sentences: --beam-size" in completed.stderr


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--length-penalties", "0,nan", "'nan' in '0,nan': must be a number from 0 to 10"),
        ("--length-penalties", "-1", "'-1' in '-1': must be a number from 0 to 10"),
        ("--length-penalties", "0.6,x", "'x' in '0.6,x': not a number: 'x'"),
        ("--beam-sizes", "1,0", "'0' in '1,0': must be at least 1, got 0"),
        ("--beam-sizes", "2.5", "'2.5' in '2.5': not an integer: '2.5'"),
        ("--beam-sizes", ",", "a comma-separated list of numbers, got ','"),
        ("--beam-sizes", "1,,2", "a comma-separated list of numbers, got '1,,2'"),
        ("--length-penalties", "0.6,", "a comma-separated list of numbers, got '0.6,'"),
    ],
)
def test_the_script_refuses_what_translate_and_evaluate_refuse(
    tmp_path: Path, option: str, value: str, expected: str
) -> None:
    """The same bounds as translate's and evaluate's --beam-size and --length-penalty: a value
    tune recommends, they take. Refused by argparse, before any model is read."""
    completed = subprocess.run(
        [sys.executable, "-m", "seq2seq.commands", "tune", "--model", str(tmp_path / "none"),
         "--src", str(tmp_path / "s"), "--ref", str(tmp_path / "r"), option, value],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert completed.returncode == 2
    assert expected in completed.stderr and "Traceback" not in completed.stderr
