"""seq2seq.train and seq2seq.explore, as a notebook calls them: two trainings in one process,
each with its own config and summary; the command line's errors; a page with no URL in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import seq2seq
from seq2seq.errors import ConfigError, Seq2SeqError
from seq2seq.explorer.page import read_page
from tests.configs import TINY

ONE_EPOCH = [*TINY, "trainer.max_epochs=1", "logger=csv", "test_after_training=false"]


def test_two_trainings_in_one_process_each_with_its_config_and_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the default run directory: outputs/DATE/TIME under it
    first = seq2seq.train(*ONE_EPOCH, "attention=additive")
    second = seq2seq.train(*ONE_EPOCH, "attention=scaled_dot", f"run_dir={tmp_path / 'b'}")
    assert first.directory.parent.parent == Path("outputs") and first.directory.is_dir()
    assert second.directory == tmp_path / "b"
    assert first.config.attention._target_.endswith("AdditiveAttention")
    assert second.config.attention._target_.endswith("DotProductAttention")
    for run in (first, second):
        rows = run.metrics()
        records = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
        bleus = [
            float(r["val/bleu"]) for r in records if str(r.get("val/bleu", "")) not in ("", "nan")
        ]
        assert run.summary["best_val_bleu"] == pytest.approx(max(bleus), abs=1e-6)
        assert run.best_checkpoint.is_file()
        assert len(run.translator().translate(["w3 w14 w7"])) == 1
    page = seq2seq.explore({"additive": first, "scaled_dot": second.best_checkpoint}, ["w3 w14 w7"])
    html = page._repr_html_()
    assert html.startswith("<iframe srcdoc=") and not re.search(
        r"https?://|//cdn|require\.js", html
    )
    written = read_page(page.save(tmp_path / "page.html").read_text())
    assert [m["name"] for m in written["models"]] == ["additive", "scaled_dot"]


def test_bad_overrides_are_the_command_lines_one_paragraph(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="each a string 'key=value'"):
        seq2seq.train("attention")
    with pytest.raises(Seq2SeqError) as refused:
        seq2seq.train(*ONE_EPOCH, "model.input_feeding=maybe", f"run_dir={tmp_path}")
    assert "model.input_feeding=maybe" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="one to four models"):
        seq2seq.explore({}, ["w1"])
