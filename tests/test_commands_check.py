"""seq2seq check: a user's file or module named on the command line, a table or JSON, exit
status 1 on a failed property, and every bad target in one paragraph."""

from __future__ import annotations

import json
from pathlib import Path

from tests.configs import ROOT
from tests.test_commands import command

BROKEN = """
import torch


def masked_softmax(logits, mask):
    return torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
"""


def test_a_users_scoring_function_passes() -> None:
    example = ROOT / "examples" / "cosine_attention" / "cosine_attention.py"
    done = command("check", f"{example}:CosineAttention")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "every property holds" in done.stdout


def test_a_broken_normalizer_is_named_and_fails_the_exit_status(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(BROKEN)
    done = command("check", "mine.py:masked_softmax", cwd=tmp_path)
    assert done.returncode == 1
    assert "-inf fill" in done.stdout
    as_json = command("check", "mine.py:masked_softmax", "--json", cwd=tmp_path)
    findings = json.loads(as_json.stdout)
    assert findings["passed"] is False and findings["kind"] == "normalizer"


def test_a_built_in_class_takes_its_other_arguments() -> None:
    done = command("check", "seq2seq.attention:AdditiveAttention", "--init", "num_hiddens=16")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]


def test_bad_targets_are_one_paragraph(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(BROKEN)
    for arguments, message in [
        (["mine.py"], "names no object"),
        (["mine.py:nothing"], "defines no 'nothing'; it defines masked_softmax."),
        (["mine.py:maskd_softmax"], "Did you mean 'masked_softmax'?"),
        (["nowhere.py:x"], "there is no file nowhere.py"),
        (["mines.py:x"], "Did you mean mine.py?"),
        (["not_a_module_anywhere:x"], "cannot be imported"),
        (["mine.py:torch"], "is not something `check` can check"),
        (["seq2seq.attention:AdditiveAttention"], "functools.partial"),
        (["mine.py:masked_softmax", "--init", "x=1"], "--init is for a class"),
        (
            ["seq2seq.attention:AdditiveAttention", "--init", "query_size=8", "--init", "x=1"],
            "--init query_size: the check builds",
        ),
    ]:
        done = command("check", *arguments, cwd=tmp_path)
        assert done.returncode == 2, (arguments, done.stdout, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_users_file_imports_as_python_runs_it_and_its_errors_are_one_paragraph(
    tmp_path: Path,
) -> None:
    """A file that imports the file beside it works; a syntax error or an exception at import
    names the file and line, exit status 2 (not 1: no property failed)."""
    (tmp_path / "helpers.py").write_text(BROKEN)
    (tmp_path / "mine.py").write_text("from helpers import masked_softmax\n")
    done = command("check", "mine.py:masked_softmax", cwd=tmp_path)
    assert done.returncode == 1 and "-inf fill" in done.stdout, done.stderr
    (tmp_path / "syntax.py").write_text("def f(:\n    pass\n")
    (tmp_path / "boom.py").write_text("raise RuntimeError('not ready')\n")
    for spec, message in [
        ("syntax.py:f", "line 1"),
        ("boom.py:f", "raised RuntimeError: not ready"),
    ]:
        done = command("check", spec, cwd=tmp_path)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_json_output_stays_json_when_the_target_is_bad(tmp_path: Path) -> None:
    """--json: a bad target is a JSON object with the error on stdout (the paragraph on stderr),
    exit status 2, so that a program reading the output does not get plain text."""
    done = command("check", "nowhere.py:x", "--json", cwd=tmp_path)
    assert done.returncode == 2
    answer = json.loads(done.stdout)
    assert answer["target"] == "nowhere.py:x" and "there is no file" in answer["error"]
    assert "there is no file" in done.stderr and "Traceback" not in done.stderr
