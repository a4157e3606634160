"""The bad-input catalogue: every case gets one paragraph naming the file, line or key and the fix,
a non-zero exit and no traceback.

Each case runs a real entry point: ``train.py`` and ``scripts/*.py`` executed as ``__main__``
with their command line in ``sys.argv`` (``run_entry_point``), or, for errors past Hydra's
composition, train.py's body (``train(cfg)`` inside ``exit_on_user_error``, all train.py adds).
A few run as real subprocesses too, to show the wiring end to end; one subprocess per case would
cost seconds of start-up each for nothing these tests do not already see.
"""

from __future__ import annotations

import io
import logging
import os
import runpy
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from seq2seq.cli import exit_on_user_error
from seq2seq.pipeline import train

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SMALL_MODEL = [
    "data.batch_size=32",
    "model.hidden_size=32",
    "model.embedding_size=16",
    "trainer.max_epochs=1",
    "trainer.enable_progress_bar=false",
]
TINY = ["data.train_size=300", "data.val_size=30", "data.test_size=30", *SMALL_MODEL]


def run_command(*args: str | Path) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=ROOT,
        env=ENV,
        input="the dog sees a cat .\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode != 0, completed.stderr[-2000:]
    assert "Traceback" not in completed.stderr, completed.stderr[-3000:]
    return completed


def run_entry_point(
    script: str,
    *args: str | Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    """Run ``script`` (relative to the repository) as ``__main__``; it must exit non-zero without
    a traceback. Returns its stderr."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [script, *map(str, args)])
    stdin = io.TextIOWrapper(io.BytesIO(b"the dog sees a cat .\n"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    capsys.readouterr()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        with pytest.raises(SystemExit) as exit_info:  # anything else escaping is a traceback
            runpy.run_path(str(ROOT / script), run_name="__main__")
    finally:  # Hydra and the scripts set up logging to this test's (soon closed) stderr
        root.handlers[:] = handlers
        root.setLevel(level)
    captured = capsys.readouterr()
    assert exit_info.value.code not in (0, None), captured.err
    assert "Traceback" not in captured.err
    if script != "train.py":  # (Hydra logs train.py's progress to stdout)
        assert captured.out == ""  # no partial output
    return captured.err


def train_in_process(overrides: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What ``python train.py OVERRIDES`` prints on stderr; it must exit with status 2."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        config = compose("config", overrides=overrides)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info, exit_on_user_error():
        train(config)
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith("error: ") and stderr.count("\n") == 1  # one paragraph
    return stderr


# --- config: unknown options and keys, incompatible sizes --------------------------------------


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model=mamba", "Could not find 'model/mamba'"),
        ("model.hiden_size=3", "Key 'hiden_size' is not in struct"),
        ("trainer.max_epoch=3", "Key 'max_epoch' is not in struct"),
        ("model.encoder_layers=0", "model.encoder_layers=0 (it must be a positive integer)"),
        pytest.param(
            "cuda_graphs=true",
            "cuda_graphs=true records CUDA graphs, but training runs on cpu",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="trains on the GPU there"),
        ),
    ],
)
def test_train_py_config_errors(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    override: str,
    expected: str,
) -> None:
    stderr = run_entry_point(
        "train.py",
        *TINY,
        override,
        f"hydra.run.dir={tmp_path}",
        capsys=capsys,
        monkeypatch=monkeypatch,
    )
    assert expected in stderr


def test_train_py_as_a_subprocess(tmp_path: Path) -> None:
    completed = run_command("train.py", "model.encoder_layers=0", f"hydra.run.dir={tmp_path}")
    assert completed.returncode == 2
    assert "error: the model cannot be built with model.encoder_layers=0" in completed.stderr


def test_a_refused_run_leaves_no_run_directory(tmp_path: Path) -> None:
    """Hydra makes the run directory before train.py's checks run; a refused run removes it."""
    completed = run_command("train.py", "trainer.max_time=30", f"hydra.run.dir={tmp_path / 'run'}")
    assert completed.returncode == 2 and "trainer.max_time must be" in completed.stderr
    assert not (tmp_path / "run").exists()


def test_a_run_refused_after_writing_its_vocabularies_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    overrides = [*TINY, "model.num_heads=3", f"hydra.run.dir={run}"]
    stderr = run_entry_point("train.py", *overrides, capsys=capsys, monkeypatch=monkeypatch)
    assert "model.num_heads=3 must be" in stderr
    assert not run.exists()


def test_a_refused_run_takes_nothing_that_was_there_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal in a directory of the user's: their files stay as they were (the run's config
    and vocabularies are written once every check has passed); Hydra's record stays with them
    (the command did not make the folder, so it deletes nothing there)."""
    run = tmp_path / "mine"
    run.mkdir()
    for name in ("config.yaml", "train.log", "notes.txt"):
        (run / name).write_text("mine\n")
    overrides = [*TINY, "model.num_heads=3", f"hydra.run.dir={run}"]
    run_entry_point("train.py", *overrides, capsys=capsys, monkeypatch=monkeypatch)
    assert {path.name for path in run.iterdir()} - {".hydra"} == {
        "config.yaml",
        "notes.txt",
        "train.log",
    }
    assert (run / "config.yaml").read_text() == (run / "notes.txt").read_text() == "mine\n"


def test_a_refused_sweep_leaves_no_sweep_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = tmp_path / "sweeps" / "one"
    overrides = ["-m", "trainer.max_time=30", f"hydra.sweep.dir={sweep}"]
    run_entry_point("train.py", *overrides, capsys=capsys, monkeypatch=monkeypatch)
    assert not (tmp_path / "sweeps").exists()


def test_a_refused_resume_or_new_run_keeps_the_runs_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's .hydra/ says how it was started (the refusal of a changed setting points
    there): a refused resume, or a new run refused over the run, leaves it as it was."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text("- model.hidden_size=32\n")
    for overrides in (
        [f"hydra.run.dir={run}"],  # a new run over it
        [f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", "trainer.max_time=30"],
    ):
        stderr = run_entry_point("train.py", *overrides, capsys=capsys, monkeypatch=monkeypatch)
        assert "already holds a run" in stderr or "trainer.max_time must be" in stderr
        assert (run / ".hydra" / "overrides.yaml").read_text() == "- model.hidden_size=32\n"
        assert (run / "checkpoints" / "last.ckpt").exists()


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.hidden_size=0", "model.hidden_size=0 (it must be a positive integer)"),
        ("model.embedding_size=-4", "model.embedding_size=-4 (it must be a positive integer)"),
        ("model.encoder_hidden_size=0", "model.encoder_hidden_size=0"),
        ("model.hidden_size=2.5", "model.hidden_size=2.5 (it must be a positive integer)"),
        ("model.dropout=1.5", "model.dropout=1.5 (a probability: at least 0, below 1)"),
        (
            "model.fused_rnn=false",
            "model.fused_rnn=false (renamed: the C kernels are now chosen with model.kernels, "
            "auto or off; use model.kernels=off)",
        ),
        ("model.kernels=fast", "model.kernels=fast is not a choice: auto runs the C kernels"),
        ("model.kernels=false", "Write model.kernels=off on the command line, or kernels: 'off'"),
        ("attention.num_hiddens=0", "attention.num_hiddens=0 (it must be a positive integer)"),
        ("data.batch_size=0", "data.batch_size must be a positive integer, got 0"),
        ("data.eval_batch_size=-1", "data.eval_batch_size must be a positive integer, got -1"),
        ("data.max_tokens=0", "data.max_tokens must be a positive integer, got 0"),
        ("checkpoint.every_n_steps=0", "checkpoint.every_n_steps must be a positive integer"),
    ],
)
def test_incompatible_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, expected: str
) -> None:
    stderr = train_in_process([f"run_dir={tmp_path}", *TINY, override], capsys)
    assert expected in stderr


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("+trainer.max_steps=-5", "trainer.max_steps=-5: it must be a whole number of at least 1 "
         "(or -1: no limit), e.g. +trainer.max_steps=2 on the command line."),
        ("+trainer.max_steps=0", "trainer.max_steps=0: it must be a whole number of at least 1"),
        ("+trainer.max_steps=2.5", "trainer.max_steps=2.5: it must be a whole number"),
        ("+trainer.max_steps=true", "trainer.max_steps=True: it must be a whole number"),
        ("trainer.max_epochs=0", "e.g. trainer.max_epochs=2 on the command line."),
        ("trainer.log_every_n_steps=0", "trainer.log_every_n_steps=0: it must be a whole number"),
        ("+trainer.min_steps=-1", "trainer.min_steps=-1: it must be a whole number of at least 0, "
         "e.g. +trainer.min_steps=2"),
        ("+trainer.accumulate_grad_batches=0", "at least 1, e.g. +trainer.accumulate_grad_batches"),
    ],
)  # fmt: skip
def test_trainer_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, expected: str
) -> None:
    stderr = train_in_process([f"run_dir={tmp_path / 'run'}", *TINY, override], capsys)
    assert expected in stderr
    assert not (tmp_path / "run").exists()


def test_the_trainer_counts_hint_matches_the_trainer_config() -> None:
    """The hint adds + to a key exactly where the trainer config lacks it (Hydra's rule)."""
    from seq2seq.pipeline.checks import TRAINER_COUNTS, trainer_config_keys

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        config = compose("config")
    assert {key for key in TRAINER_COUNTS if key in config.trainer} == (
        set(TRAINER_COUNTS) & trainer_config_keys()
    )


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["attention.normalizer=softmx"], "attention.normalizer='softmx' is not a normalizer"),
        (["attention.window=local"], "attention.window='local' is not a window"),
        (
            ["attention.window=local_p", "attention.window_size=0"],
            "attention.window_size=0 must be a whole number >= 1 for attention.window=local_p",
        ),
        (["attention.window_size=3"], "attention.window_size=3 is the half-width of a local"),
        (
            ["attention.normalizer=entmax", "attention.alpha=0.5"],
            "attention.alpha must be a number above 1",
        ),
        (
            ["attention.normalizer=sparsemax", "attention.alpha=1.5"],
            "but attention.normalizer=sparsemax has no α to set",
        ),
        (["attention.key_bias=maybe"], "attention.key_bias must be true or false"),
    ],
)
def test_bad_attention_parts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], expected: str
) -> None:
    stderr = train_in_process([f"run_dir={tmp_path}", *TINY, *overrides], capsys)
    assert expected in stderr


# --- data files: missing, empty, mismatched, invalid UTF-8 --------------------------------------


def write_corpus(root: Path, train_src: bytes, train_tgt: bytes) -> list[str]:
    root.mkdir(exist_ok=True)
    for split in ("val", "test"):
        (root / f"{split}.xx").write_text("a b .\n")
        (root / f"{split}.yy").write_text("c d .\n")
    (root / "train.xx").write_bytes(train_src)
    (root / "train.yy").write_bytes(train_tgt)
    return ["data=parallel", f"data.root={root}", "data.src_lang=xx", "data.tgt_lang=yy"]


@pytest.mark.parametrize(
    ("src", "tgt", "expected"),
    [
        (None, b"c d .\n", "train.xx does not exist"),
        (b"", b"", "no training pairs"),
        (b"a b .\na c .\n", b"c d .\n", "has 2 lines but"),
        (b"a b .\na \xff c .\n", b"c d .\nc e .\n", "train.xx:2: invalid UTF-8"),
    ],
    ids=["missing", "empty", "mismatched", "invalid-utf8"],
)
def test_bad_data_files(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    src: bytes | None,
    tgt: bytes,
    expected: str,
) -> None:
    data = write_corpus(tmp_path / "corpus", src or b"", tgt)
    if src is None:
        (tmp_path / "corpus" / "train.xx").unlink()
    stderr = train_in_process([f"run_dir={tmp_path / 'run'}", *SMALL_MODEL, *data], capsys)
    assert expected in stderr and str(tmp_path / "corpus") in stderr


# --- checkpoints: truncated, corrupt, foreign, another model or version, mismatched tokenizer ---


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("finished")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        train(compose("config", overrides=[f"run_dir={run}", *TINY]))
    return run


def truncated(source: Path, target: Path) -> Path:
    target.write_bytes(source.read_bytes()[:4000])
    return target


def foreign(source: Path, target: Path) -> Path:
    torch.save({"model": {"weight": torch.zeros(3)}, "epoch": 7}, target)
    return target


def other_version(source: Path, target: Path) -> Path:
    checkpoint = torch.load(source, weights_only=True)
    checkpoint["seq2seq"]["format"] = 99
    torch.save(checkpoint, target)
    return target


def corrupt_weights(source: Path, target: Path) -> Path:
    checkpoint = torch.load(source, weights_only=True)
    name = next(key for key in checkpoint["state_dict"] if key.endswith("weight"))
    checkpoint["state_dict"][name] = torch.zeros(1, 1)
    torch.save(checkpoint, target)
    return target


def mismatched_tokenizer(source: Path, target: Path) -> Path:
    checkpoint = torch.load(source, weights_only=True)
    checkpoint["seq2seq"]["src_tokenizer"] = checkpoint["seq2seq"]["tgt_tokenizer"]
    torch.save(checkpoint, target)
    return target


CORRUPTIONS: list[tuple[Callable[[Path, Path], Path], str]] = [
    (truncated, "truncated"),
    (foreign, "not a seq2seq checkpoint"),
    (other_version, "not a seq2seq checkpoint of format 1"),
    (corrupt_weights, "do not fit the model"),
    (mismatched_tokenizer, "does not belong to this model"),
]
CORRUPTION_IDS = [corrupt.__name__ for corrupt, _ in CORRUPTIONS]


@pytest.mark.parametrize(("corrupt", "expected"), CORRUPTIONS, ids=CORRUPTION_IDS)
def test_scripts_refuse_bad_checkpoints(
    finished_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    corrupt: Callable[[Path, Path], Path],
    expected: str,
) -> None:
    bad = corrupt(finished_run / "checkpoints" / "last.ckpt", tmp_path / "bad.ckpt")
    commands = [
        ("scripts/translate.py", "--model", bad),
        ("scripts/export.py", "--checkpoint", bad, "--out", tmp_path / "bundle"),
    ]
    for script, *args in commands:
        stderr = run_entry_point(str(script), *args, capsys=capsys, monkeypatch=monkeypatch)
        assert expected in stderr and str(bad) in stderr


@pytest.mark.parametrize("corrupt", [truncated, foreign])
def test_translate_py_refuses_a_truncated_or_foreign_checkpoint(
    finished_run: Path, tmp_path: Path, corrupt: Callable[[Path, Path], Path]
) -> None:
    """The issue's acceptance check, as a user runs it."""
    bad = corrupt(finished_run / "checkpoints" / "last.ckpt", tmp_path / "bad.ckpt")
    completed = run_command("scripts/translate.py", "--model", bad)
    assert completed.returncode == 2 and completed.stdout == ""
    assert completed.stderr.startswith(f"error: {bad}")


@pytest.mark.parametrize(("corrupt", "expected"), CORRUPTIONS, ids=CORRUPTION_IDS)
def test_resuming_from_a_bad_checkpoint(
    finished_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    corrupt: Callable[[Path, Path], Path],
    expected: str,
) -> None:
    bad = corrupt(finished_run / "checkpoints" / "last.ckpt", tmp_path / "bad.ckpt")
    stderr = train_in_process([*TINY, f"run_dir={tmp_path / 'run'}", f"ckpt_path={bad}"], capsys)
    assert expected in stderr and str(bad) in stderr


def test_resuming_from_a_missing_checkpoint_through_train_py(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "checkpoints" / "last.ckpt"
    stderr = run_entry_point(
        "train.py", *TINY, f"ckpt_path={missing}", capsys=capsys, monkeypatch=monkeypatch
    )
    assert f"ckpt_path={missing} does not exist" in stderr


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.hidden_size=64", "model.hidden_size: 32 in the run, 64 now"),
        ("attention=scaled_dot", "attention._target_"),
        ("data.train_size=500", "data.train_size: 300 in the run, 500 now"),
        ("seed=7", "seed: 1234 in the run, 7 now"),
    ],
)
def test_resuming_with_changed_settings_names_them(
    finished_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    override: str,
    expected: str,
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    last = run / "checkpoints" / "last.ckpt"
    stderr = train_in_process([*TINY, override, f"ckpt_path={last}"], capsys)
    assert expected in stderr and "original overrides" in stderr


def test_a_checkpoint_from_another_model_is_refused_without_the_runs_config(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = tmp_path / "moved.ckpt"  # no config.yaml beside it: the checkpoint itself tells
    shutil.copy(finished_run / "checkpoints" / "last.ckpt", elsewhere)
    stderr = train_in_process(
        [*TINY, "model.hidden_size=64", f"run_dir={tmp_path / 'run'}", f"ckpt_path={elsewhere}"],
        capsys,
    )
    assert "holds a different model than this config builds" in stderr
    assert "model.hidden_size: 32 in the checkpoint, 64 now" in stderr


def test_a_new_run_over_an_existing_one_is_refused(
    finished_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stderr = train_in_process([f"run_dir={finished_run}", *TINY], capsys)
    assert f"{finished_run} already holds a run" in stderr and "ckpt_path=" in stderr


# --- commands and output directories ----------------------------------------------------------


@pytest.mark.parametrize("script", ["scripts/translate.py", "scripts/evaluate.py"])
def test_beam_size_zero(
    finished_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    script: str,
) -> None:
    model = finished_run / "checkpoints" / "best.ckpt"
    files = []
    if "evaluate" in script:
        (tmp_path / "src").write_text("a\n")
        (tmp_path / "ref").write_text("b\n")
        files = ["--src", tmp_path / "src", "--ref", tmp_path / "ref"]
    stderr = run_entry_point(
        script,
        "--model",
        model,
        *files,
        "--beam-size",
        "0",
        capsys=capsys,
        monkeypatch=monkeypatch,
    )
    assert "--beam-size: must be at least 1, got 0" in stderr


def test_unwritable_output_directories(
    finished_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a_file = tmp_path / "a_file"  # a path under a file: unwritable even for root
    a_file.write_text("")
    stderr = train_in_process([f"run_dir={a_file / 'run'}", *TINY], capsys)
    assert f"cannot write to the run directory {a_file / 'run'}" in stderr
    model = finished_run / "checkpoints" / "best.ckpt"
    for script, args, expected in [
        (
            "scripts/translate.py",
            ["--model", model, "--output", "/proc/out.txt"],
            "cannot write the translations to /proc/out.txt",
        ),
        (
            "scripts/export.py",
            ["--checkpoint", model, "--out", a_file / "bundle"],
            f"cannot create the bundle directory {a_file / 'bundle'}",
        ),
    ]:
        stderr = run_entry_point(script, *args, capsys=capsys, monkeypatch=monkeypatch)
        assert expected in stderr
