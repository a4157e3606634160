"""scripts/translate.py, evaluate.py and export.py as a user runs them."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu

from seq2seq.commands.evaluate import bleu_metric_for, tokenized_input_hint
from seq2seq.data.toy import ToyTranslation

ROOT = Path(__file__).resolve().parents[1]


def run_script(script: str, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, f"scripts/{script}", *map(str, args)],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def bundle(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "bundle"
    completed = run_script("export.py", "--checkpoint", tiny_checkpoint, "--out", out)
    assert completed.returncode == 0, completed.stderr.decode()
    return out


def test_translate_keeps_one_line_per_input_line_in_order(bundle: Path) -> None:
    overlong = " ".join(["the dog sees a cat and"] * 4) + " ."  # > 8 tokens, the model's maximum
    lines = [
        b"the dog sees a cat .",
        b"",
        b"   \t ",
        "the caf\u00e9 \u2028 \u00fcber dog .".encode(),  # unicode, incl. a line separator
        overlong.encode(),
        b"the dog \xff\xfe sees .",  # invalid UTF-8
        b"the dog\x00 sees .",  # NUL byte
        b"a cat sleeps .",
        overlong.encode(),
    ]
    completed = run_script("translate.py", "--model", bundle, stdin=b"\n".join(lines) + b"\n")
    assert completed.returncode == 0, completed.stderr.decode()
    output = completed.stdout.decode().split("\n")
    assert output[-1] == "" and len(output) - 1 == len(lines)
    assert output[1] == output[2] == output[5] == output[6] == ""
    assert output[0] and output[7] and output[4]
    assert output[4] == output[8]  # same input, same output, wherever it stands
    stderr = completed.stderr.decode()
    assert "line 6: invalid UTF-8" in stderr and "line 7: NUL byte" in stderr
    assert stderr.count("were cut") == 1 and "2 line(s)" in stderr
    assert "Traceback" not in stderr


def test_translate_matches_the_library_and_reads_files(
    bundle: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    from seq2seq import Translator

    sentences = [example.src for example in ToyTranslation(train_size=10).splits()["test"][:40]]
    source = tmp_path / "input.txt"
    source.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    outputs = {}
    for model in (bundle, tiny_checkpoint):
        out = tmp_path / f"{Path(model).name}.out"
        completed = run_script(
            "translate.py",
            "--model",
            model,
            "--input",
            source,
            "--output",
            out,
            "--batch-size",
            "7",
        )
        assert completed.returncode == 0, completed.stderr.decode()
        assert completed.stdout == b""
        outputs[model] = out.read_text(encoding="utf-8").splitlines()
    assert outputs[bundle] == outputs[tiny_checkpoint]
    assert outputs[bundle] == Translator.load(bundle).translate(sentences)


def test_translate_applies_the_coverage_penalty_as_the_library(bundle: Path) -> None:
    from seq2seq import Translator

    sentences = [example.src for example in ToyTranslation(train_size=10).splits()["test"][:20]]
    completed = run_script(
        "translate.py", "--model", bundle, "--beam-size", "4", "--coverage-penalty", "2.5",
        stdin="".join(f"{line}\n" for line in sentences).encode(),
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr.decode()
    expected = Translator.load(bundle).translate(sentences, beam_size=4, coverage_penalty=2.5)
    assert completed.stdout.decode().splitlines() == expected


def test_attention_plot_is_written(bundle: Path, tmp_path: Path) -> None:
    plot = tmp_path / "attention.png"
    completed = run_script(
        "translate.py", "--model", bundle, "--attention-plot", plot, stdin=b"the dog sees a cat .\n"
    )
    assert completed.returncode == 0, completed.stderr.decode()
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(completed.stdout.decode().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--beam-size", "0"], "--beam-size: must be at least 1, got 0"),
        (["--model", "/nonexistent/model.ckpt"], "does not exist"),
        (["--output", "/nonexistent/dir/out.txt"], "directory /nonexistent/dir does not exist"),
        (["--coverage-penalty", "-0.5"], "--coverage-penalty: must be a number from 0 to 10"),
        (["--coverage-penalty", "nan"], "--coverage-penalty: must be a number from 0 to 10"),
        (["--coverage-penalty", "11"], "(the server's bound too), got 11"),
        (["--length-penalty", "nan"], "--length-penalty: must be a number from 0 to 10"),
        (["--length-penalty", "-1"], "--length-penalty: must be a number from 0 to 10"),
        (["--length-penalty", "1e9"], "(the server's bound too), got 1e9"),
    ],
)
def test_translate_bad_input_gets_one_clean_message(
    bundle: Path, args: list[str], message: str
) -> None:
    model_args = [] if "--model" in args else ["--model", str(bundle)]
    completed = run_script("translate.py", *model_args, *args, stdin=b"a dog .\n")
    assert completed.returncode == 2
    stderr = completed.stderr.decode()
    assert message in stderr and "Traceback" not in stderr
    assert completed.stdout == b""


def test_evaluate_bleu_equals_the_sacrebleu_cli(bundle: Path, tmp_path: Path) -> None:
    test = ToyTranslation(train_size=10).splits()["test"][:60]
    src, ref, hyp = tmp_path / "test.src", tmp_path / "test.ref", tmp_path / "hyp.txt"
    src.write_text("".join(f"{example.src}\n" for example in test), encoding="utf-8")
    ref.write_text("".join(f"{example.tgt}\n" for example in test), encoding="utf-8")
    completed = run_script(
        "evaluate.py",
        "--model",
        bundle,
        "--src",
        src,
        "--ref",
        ref,
        "--beam-size",
        "1",
        "--hyp-out",
        hyp,
        "--json",
    )
    assert completed.returncode == 0, completed.stderr.decode()
    result = json.loads(completed.stdout)
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 60
    cli = subprocess.run(
        [sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp), "-m", "bleu", "-w", "6"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result["score"] == pytest.approx(json.loads(cli.stdout)["score"], abs=1e-6)
    assert result["signature"] == json.loads(cli.stdout)["signature"]
    chrf = sacrebleu.corpus_chrf(
        hyp.read_text(encoding="utf-8").splitlines(), [[example.tgt for example in test]]
    )
    assert result["chrf"] == pytest.approx(chrf.score)


@pytest.mark.parametrize(("tokenize", "warns"), [("none", False), ("13a", True)])
def test_evaluate_with_tokenize_none_does_not_warn_about_tokenized_text(
    tokenize: str, warns: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The toy task's text is tokenized on purpose: with --tokenize none sacreBLEU is told so
    (its force) and does not warn at 100 lines ending in " ."; with 13a it still warns."""
    lines = [f"the dog sees cat {i} ." for i in range(120)]
    metric = bleu_metric_for(tokenize)
    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        score = metric.corpus_score(lines, [lines])
    assert ("detokenize" in caplog.text) == warns
    assert score.score == pytest.approx(100.0)


def test_the_tokenized_text_warning_names_this_commands_option(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """sacreBLEU's hint ("use the `force` parameter") names no flag of evaluate: said as its
    --tokenize none instead, once however often sacreBLEU says it."""
    lines = [f"the dog sees cat {i} ." for i in range(120)]
    with caplog.at_level(logging.WARNING, logger="sacrebleu"), tokenized_input_hint("13a"):
        bleu_metric_for("13a").corpus_score(lines, [lines])
        logging.getLogger("sacrebleu").warning("It looks like you forgot to detokenize, again")
    assert "pass --tokenize none" in caplog.text and "force" not in caplog.text
    assert caplog.text.count("pass --tokenize none") == 1


def test_an_unknown_tokenizer_is_refused_before_translating(bundle: Path, tmp_path: Path) -> None:
    src = tmp_path / "src.txt"
    src.write_text("the dog sees a cat .\n")
    completed = run_script(
        "evaluate.py", "--model", bundle, "--src", src, "--ref", src, "--tokenize", "nonee"
    )
    stderr = completed.stderr.decode()
    assert completed.returncode == 2 and "--tokenize nonee: not one of" in stderr, stderr
    assert "Traceback" not in stderr


def test_translate_reports_unknown_source_words_once(bundle: Path) -> None:
    """Words the model's vocabulary lacks are read as <unk>: translate still translates every
    line, and says once, on stderr, how many words and which."""
    lines = b"the zebra sees a cat .\nthe dog xylophones a zebra .\nthe dog sees a cat .\n"
    completed = run_script("translate.py", "--model", bundle, stdin=lines)
    assert completed.returncode == 0, completed.stderr.decode()
    assert len(completed.stdout.decode().splitlines()) == 3
    stderr = completed.stderr.decode()
    assert stderr.count("not in the model's vocabulary") == 1, stderr
    assert "zebra (×2)" in stderr and "xylophones" in stderr
    assert "case-sensitive" not in stderr  # no unknown word is known in lowercase


def test_an_unknown_cased_word_known_in_lowercase_is_said(bundle: Path) -> None:
    """The toy vocabulary is lowercase: 'The' is unknown, 'the' is not, and the warning says so."""
    completed = run_script("translate.py", "--model", bundle, stdin=b"The dog sees a cat .\n")
    assert completed.returncode == 0, completed.stderr.decode()
    stderr = completed.stderr.decode()
    assert "read as <unk>: The." in stderr, stderr
    assert "case-sensitive and has 'the' in lowercase" in stderr, stderr


def test_evaluate_refuses_files_that_are_not_parallel(bundle: Path, tmp_path: Path) -> None:
    src, ref = tmp_path / "a.src", tmp_path / "a.ref"
    src.write_text("a dog .\na cat .\n", encoding="utf-8")
    ref.write_bytes(b"kodan .\n\xff\n")
    completed = run_script("evaluate.py", "--model", bundle, "--src", src, "--ref", ref)
    assert completed.returncode == 2
    assert f"{ref}:2: invalid UTF-8" in completed.stderr.decode()
    assert "at byte offset 8 of the file" in completed.stderr.decode()
    ref.write_text("kodan .\n", encoding="utf-8")
    completed = run_script("evaluate.py", "--model", bundle, "--src", src, "--ref", ref)
    assert completed.returncode == 2
    assert "has 2 lines but" in completed.stderr.decode()
    assert "Traceback" not in completed.stderr.decode()


def test_translate_writes_n_best_lists_and_scores_as_the_translator_gives_them(
    bundle: Path,
) -> None:
    """--n-best N: N lines per input line, 'LINE ||| TRANSLATION ||| SCORE' (LINE from 0), best
    first, the translator's own beam; a blank line one empty hypothesis. --scores: the 1-best
    and its score. More than the beam holds is refused."""
    from seq2seq import Translator

    sentences = ["the dog sees a cat .", "", "a cat runs ."]
    stdin = "".join(f"{line}\n" for line in sentences).encode()
    completed = run_script(
        "translate.py", "--model", bundle, "--beam-size", "3", "--n-best", "2", stdin=stdin
    )
    assert completed.returncode == 0, completed.stderr.decode()
    rows = [line.split(" ||| ") for line in completed.stdout.decode().splitlines()]
    expected = Translator.load(bundle).translate_detailed(
        sentences, beam_size=3, n_best=2, with_scores=True
    )
    wanted = [
        (str(index), text, score)
        for index, translation in enumerate(expected)
        for text, score in (translation.n_best or [("", 0.0)])
    ]
    assert [(index, text) for index, text, _ in rows] == [(i, t) for i, t, _ in wanted]
    assert [float(score) for *_, score in rows] == pytest.approx([s for *_, s in wanted], abs=1e-5)
    assert [index for index, *_ in rows] == ["0", "0", "1", "2", "2"]

    scored = run_script("translate.py", "--model", bundle, "--scores", stdin=stdin)
    assert scored.returncode == 0, scored.stderr.decode()
    best = Translator.load(bundle).translate_detailed(sentences, with_scores=True)
    lines = [line.split(" ||| ") for line in scored.stdout.decode().splitlines()]
    assert [text for text, _ in lines] == [t.text for t in best]
    assert [float(s) for _, s in lines] == pytest.approx([t.score or 0.0 for t in best], abs=1e-5)

    refused = run_script("translate.py", "--model", bundle, "--n-best", "3", stdin=stdin)
    stderr = refused.stderr.decode()
    assert refused.returncode == 2 and "--n-best 3 needs --beam-size 3" in stderr, stderr


def test_translate_alignment_gives_each_hypothesis_the_links_of_its_attention(
    bundle: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """--n-best 2 --alignment hard: 'LINE ||| TEXT ||| LINKS ||| SCORE' (Marian's order), the
    links the argmax of
    the attention the translator returns with that hypothesis (a word-level model: its tokens are
    the words); the first is the 1-best's. Checkpoint, bundle and ONNX graphs write the same."""
    pytest.importorskip("onnxruntime")
    from seq2seq import Translator
    from seq2seq.analysis.alignment import argmax_links
    from seq2seq.analysis.word_alignment import pharaoh

    sentences = ["the dog sees a cat .", "", "a cat runs ."]
    stdin = "".join(f"{line}\n" for line in sentences).encode()
    options = ["--beam-size", "3", "--n-best", "2", "--alignment", "hard"]
    onnx = tmp_path / "onnx"
    exported = run_script("export.py", "--checkpoint", tiny_checkpoint, "--out", onnx, "--onnx")
    assert exported.returncode == 0, exported.stderr.decode()
    outputs = {}
    for model, backend in [(bundle, "torch"), (tiny_checkpoint, "torch"), (onnx, "onnx")]:
        completed = run_script(
            "translate.py", "--model", model, "--backend", backend, *options, stdin=stdin
        )
        assert completed.returncode == 0, completed.stderr.decode()
        outputs[backend, model] = [
            line.split(" ||| ") for line in completed.stdout.decode().splitlines()
        ]
    rows = outputs["torch", bundle]
    expected = Translator.load(bundle).translate_detailed(
        sentences, beam_size=3, n_best=2, with_attention=True, with_scores=True
    )
    wanted = []
    for index, (source, translation) in enumerate(zip(sentences, expected, strict=True)):
        if not source:
            wanted.append((str(index), "", ""))
            continue
        assert translation.hypotheses is not None
        best = translation.hypotheses[0]
        assert (best.text, best.score) == (translation.text, translation.score)
        for hypothesis in translation.hypotheses:
            assert hypothesis.attention is not None
            words = len(source.split()), len(hypothesis.text.split())
            links = pharaoh(argmax_links(hypothesis.attention, *words))
            wanted.append((str(index), hypothesis.text, links))
    assert [(index, text, links) for index, text, links, _ in rows] == wanted
    assert all(links for index, text, links, _ in rows if text)
    for key, other in outputs.items():
        assert [row[:3] for row in other] == [row[:3] for row in rows], key
        assert [float(row[3]) for row in other] == pytest.approx(
            [float(row[3]) for row in rows], abs=1e-4
        )
    # --alignment 1 is hard links (Marian's meaning: no weight is above 1).
    one = run_script("translate.py", "--model", bundle, "--alignment", "1", stdin=stdin)
    hard = run_script("translate.py", "--model", bundle, "--alignment", "hard", stdin=stdin)
    assert one.returncode == 0 and one.stdout == hard.stdout, one.stderr.decode()


def test_translate_soft_alignment_writes_each_target_words_weights(bundle: Path) -> None:
    stdin = b"the dog sees a cat .\n"
    completed = run_script("translate.py", "--model", bundle, "--alignment", "soft", stdin=stdin)
    assert completed.returncode == 0, completed.stderr.decode()
    text, weights = completed.stdout.decode().rstrip("\n").split(" ||| ")
    rows = [[float(value) for value in row.split(",")] for row in weights.split(" ")]
    assert len(rows) == len(text.split()) and {len(row) for row in rows} == {6}
    assert [sum(row) for row in rows] == pytest.approx([1.0] * len(rows), abs=1e-3)

    refused = run_script("translate.py", "--model", bundle, "--alignment", "1.5", stdin=stdin)
    assert refused.returncode == 2 and b"'hard', 'soft' or a threshold" in refused.stderr


def test_evaluate_says_how_many_translations_are_empty(caplog: pytest.LogCaptureFixture) -> None:
    """An empty translation scores 0 without a word from sacreBLEU: evaluate counts them."""
    from seq2seq.commands.evaluate import warn_empty

    with caplog.at_level(logging.WARNING):
        warn_empty(["a dog .", "", "  "])
    assert "2 of 3 translations are empty" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        warn_empty(["a dog ."])
    assert "empty" not in caplog.text
