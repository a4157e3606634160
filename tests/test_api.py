"""seq2seq.train and seq2seq.explore, as a notebook calls them: two trainings in one process,
each with its own config and summary; the command line's errors; a page with no URL in it; a
scoring function defined in the notebook itself, trained, exported and loaded with trust."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor

import seq2seq
from seq2seq import Translator
from seq2seq.attention import Attention
from seq2seq.errors import ConfigError, Seq2SeqError
from seq2seq.explorer.page import read_page
from seq2seq.pipeline.building import PART_KEYS
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
    with pytest.raises(ConfigError, match=r"do not compose: Could not override 'trainer\.nope'"):
        seq2seq.train("trainer.nope=1", f"run_dir={tmp_path}")
    with pytest.raises(ConfigError, match="do not compose"):
        seq2seq.train("attention=nonexistent", f"run_dir={tmp_path}")
    with pytest.raises(ConfigError, match="one to four models"):
        seq2seq.explore({}, ["w1"])
    with pytest.raises(ConfigError, match="a dict of name -> model"):
        seq2seq.explore([tmp_path], ["w1"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="a list of sentences"):
        seq2seq.explore({"a": tmp_path}, "w1 w2")
    with pytest.raises(ConfigError, match="holds no run"):
        seq2seq.compare(tmp_path)
    with pytest.raises(ConfigError, match=r"trainer\.max_epochs='one': it must be a whole"):
        seq2seq.train(*ONE_EPOCH, "trainer.max_epochs=one", f"run_dir={tmp_path / 'one'}")
    with pytest.raises(ConfigError, match="several overrides in one string"):
        seq2seq.train("attention=dot data.train_size=300")
    with pytest.raises(ConfigError, match=r"a class, passed as a keyword"):
        seq2seq.train("attention=MyAttention", f"run_dir={tmp_path}")
    with pytest.raises(ValueError, match="a list of sentences"):
        seq2seq.Translator.translate_detailed(None, "w1 w2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="length_penalty must be a finite number"):
        seq2seq.Translator.translate_detailed(None, ["w1"], length_penalty=float("nan"))  # type: ignore[arg-type]
    for keywords in [{"beam_size": 2.5}, {"beam_size": True}, {"beam_size": 2, "n_best": 3}]:
        with pytest.raises(ValueError, match=r"(beam_size|n_best) must be an integer"):
            seq2seq.Translator.translate_detailed(None, ["w1"], **keywords)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"batch_size must be an integer >= 1, got 2\.5"):
        seq2seq.Translator.translate_detailed(None, ["w1"], batch_size=2.5)  # type: ignore[arg-type]
    # A class refusing its arguments: one paragraph, and no half-made run directory left.
    for override in ["+trainer.max_epoch=1", "data.train_size=abc"]:
        with pytest.raises(ConfigError, match="the config could not be built") as refused:
            seq2seq.train(*ONE_EPOCH, override, f"run_dir={tmp_path / 'half'}")
        assert "\n" not in str(refused.value) and not (tmp_path / "half").exists()


def test_runs_are_named_by_the_options_chosen_and_compare_takes_a_directory(
    tmp_path: Path,
) -> None:
    """As on the command line: the summary names the chosen options (scaled_dot, not the class
    DotProductAttention); metrics are numbers without pandas; compare reads a directory of runs;
    tab completion offers the API."""
    run = seq2seq.train(*ONE_EPOCH, "attention=scaled_dot", f"run_dir={tmp_path / 'runs' / 'a'}")
    assert run.summary["name"] == "scaled_dot-gru-toy" and run.summary["attention"] == "scaled_dot"
    assert {"train", "compare", "explore", "Translator"} <= set(dir(seq2seq))
    compared = seq2seq.compare(tmp_path / "runs")._repr_markdown_()
    assert "| scaled_dot |" in compared
    overrides = (run.directory / ".hydra" / "overrides.yaml").read_text()
    assert "attention=scaled_dot" in overrides and "run_dir" not in overrides


class NegativeDistance(Attention):
    """score(q, k) = -‖q - k‖² / √d: a scoring function "defined in a notebook" (its module is
    set to __main__ below, as a class from a notebook cell's has)."""

    needs_equal_sizes = True

    def __init__(self, dropout: float = 0.0, *, query_size: int, key_size: int) -> None:
        super().__init__(dropout)

    def score(self, queries: Tensor, projected_keys: Tensor) -> Tensor:
        # (B, Tq, Tk): ‖q‖² - 2 q·k + ‖k‖² from (B,Tq,D) and (B,Tk,D)
        squared = torch.cdist(queries, projected_keys) ** 2
        return -squared / queries.shape[-1] ** 0.5


def test_a_class_from_main_trains_translates_exports_and_loads_with_trust(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = sys.modules["__main__"]
    monkeypatch.setattr(NegativeDistance, "__module__", "__main__")
    monkeypatch.setattr(main, "NegativeDistance", NegativeDistance, raising=False)
    run = seq2seq.train(*ONE_EPOCH, "attention=dot", "attention.dropout=0.1",
                        f"run_dir={tmp_path / 'run'}", attention=NegativeDistance)  # fmt: skip
    assert dict(run.config.attention) == {
        **{key: run.config.attention[key] for key in PART_KEYS},
        "_target_": "__main__.NegativeDistance", "_partial_": True, "dropout": 0.1,
        "num_heads": None,
    }  # fmt: skip
    assert "__main__" in run.trusted
    translator = run.translator()  # trusts what training trusted
    assert isinstance(translator.model.decoder.attention, NegativeDistance)
    bundle = run.export(tmp_path / "bundle")
    with pytest.raises(Seq2SeqError, match=r"trust_modules=\[.__main__.\]"):
        Translator.load(bundle)
    loaded = Translator.load(bundle, trust_modules=["__main__"])
    sentence = ["w3 w14 w7"]
    assert loaded.translate(sentence) == translator.translate(sentence)
    monkeypatch.delattr(main, "NegativeDistance")  # another process, without the class
    only_python = r"defines no NegativeDistance in its __main__\. .*--trust-module FILE\.py"
    with pytest.raises(Seq2SeqError, match=only_python) as gone:
        Translator.load(bundle, trust_modules=["__main__"])
    assert "\n" not in str(gone.value)


def test_a_scoring_class_is_refused_in_one_paragraph_when_it_cannot_be_used(
    tmp_path: Path,
) -> None:
    class Local(Attention):  # inside a function: no import path a checkpoint could name
        pass

    with pytest.raises(ConfigError, match="takes a scoring function's class"):
        seq2seq.train(*ONE_EPOCH, f"run_dir={tmp_path}", attention="additive")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="defined inside a function"):
        seq2seq.train(*ONE_EPOCH, f"run_dir={tmp_path}", attention=Local)
    with pytest.raises(ConfigError, match=r"attention\.temperature=\.\.\. sets an argument"):
        seq2seq.train(*ONE_EPOCH, "attention=dot", "attention.temperature=2",
                      f"run_dir={tmp_path}", attention=NegativeDistance)  # fmt: skip


@pytest.mark.slow  # builds a wheel and a virtual environment
def test_an_installed_wheel_trains_translates_and_explores_outside_the_checkout(
    tmp_path: Path,
) -> None:
    """pip install of a built wheel (not editable) in a fresh venv, used from another directory:
    its configs travel inside it. The venv sees this environment's packages for torch and the
    rest (a .pth file: CI's environment is itself a venv, whose packages --system-site-packages
    would not show); its own seq2seq, from the wheel, comes first."""
    import subprocess
    import sys
    import sysconfig

    root = Path(__file__).resolve().parents[1]
    wheels, venv, elsewhere = tmp_path / "wheels", tmp_path / "venv", tmp_path / "elsewhere"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(wheels), str(root)], check=True, timeout=600)  # fmt: skip
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    inner = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    outer = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (Path(inner) / "outer_environment.pth").write_text("\n".join(sorted(outer)) + "\n")
    [wheel] = wheels.glob("seq2seq-*.whl")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)
    elsewhere.mkdir()
    script = (
        "import seq2seq\n"
        "assert 'venv' in seq2seq.__file__, seq2seq.__file__  # the wheel's, not the checkout's\n"
        "run = seq2seq.train('data.train_size=200', 'data.val_size=10', 'data.test_size=10',\n"
        "                    'trainer.max_epochs=1', 'logger=csv', 'test_after_training=false',\n"
        "                    'trainer.enable_progress_bar=false')\n"
        "print(len(run.translator().translate(['the dog sees a cat .'])))\n"
        "print(seq2seq.explore({'toy': run}, ['the dog sees a cat .']).save('page.html'))\n"
    )
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    completed = subprocess.run([python, "-c", script], cwd=elsewhere, capture_output=True,
                               text=True, timeout=900, env=environment)  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.split()[-2:] == ["1", "page.html"]  # after Lightning's tables
    assert list(elsewhere.glob("outputs/*/*/checkpoints/best.ckpt"))
    # The installed command: train, export, translate, explore.
    seq2seq_command = str(venv / "bin" / "seq2seq")
    for arguments, stdin in [
        (["train", "data.train_size=200", "data.val_size=10", "data.test_size=10",
          "trainer.max_epochs=1", "logger=csv", "test_after_training=false",
          "trainer.enable_progress_bar=false", "hydra.run.dir=run"], None),
        (["export", "--checkpoint", "run/checkpoints/best.ckpt", "--out", "bundle"], None),
        (["translate", "--model", "bundle"], "the dog sees a cat .\n"),
        (["explore", "--model", "toy=bundle", "--sentence", "a cat .", "--out", "p.html"], None),
    ]:  # fmt: skip
        completed = subprocess.run(
            [seq2seq_command, *arguments], cwd=elsewhere, input=stdin, capture_output=True,
            text=True, timeout=900, env=environment,
        )  # fmt: skip
        assert completed.returncode == 0, (arguments[0], completed.stderr[-3000:])
    assert (elsewhere / "bundle" / "model.safetensors").is_file()
    assert (elsewhere / "p.html").is_file()
