"""The installed ``seq2seq`` command: one subcommand per job, each the same program as the
checkout's script (train.py, scripts/*.py), and its own errors in one paragraph."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from seq2seq.commands import COMMANDS
from tests.configs import ROOT

SCRIPTS = {  # command -> the checkout's script
    "train": "train.py", "translate": "scripts/translate.py", "evaluate": "scripts/evaluate.py",
    "export": "scripts/export.py", "explore": "scripts/explore.py", "serve": "scripts/serve.py",
    "compare": "scripts/compare_runs.py", "average": "scripts/average_checkpoints.py",
    "download": "scripts/download_data.py", "tune": "scripts/tune_decoding.py",
    "align": "scripts/alignment.py", "toy-data": "scripts/make_toy_data.py",
    "check": "scripts/check_attention.py",
}  # fmt: skip


def command(*arguments: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-m", "seq2seq.commands", *arguments], cwd=cwd, capture_output=True,
        text=True, timeout=300, env=environment,
    )  # fmt: skip


def test_the_command_lists_its_jobs_and_refuses_others_in_one_paragraph(tmp_path: Path) -> None:
    listed = command("--help", cwd=tmp_path)
    assert listed.returncode == 0 and all(name in listed.stdout for name in COMMANDS)
    assert set(COMMANDS) == set(SCRIPTS)
    refused = command("trian", cwd=tmp_path)
    assert refused.returncode == 2 and "no command 'trian'" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert command(cwd=tmp_path).returncode == 2  # no command: the usage, and an error status


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[] if n == "translate" else [pytest.mark.slow])
     for n in SCRIPTS],
)  # fmt: skip
def test_each_command_is_its_script(name: str, tmp_path: Path) -> None:
    """The same --help (but the program's name) from the command, from any directory, as from
    the checkout's script."""
    installed = command(name, "--help", cwd=tmp_path)
    script = subprocess.run(
        [sys.executable, SCRIPTS[name], "--help"], cwd=ROOT, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert installed.returncode == script.returncode == 0, installed.stderr[-2000:]
    program = "train.py" if name == "train" else Path(SCRIPTS[name]).name

    def normalized(text: str) -> str:  # argparse wraps its usage to the program name's width
        return " ".join(text.replace(f"seq2seq {name}", program).split())

    assert normalized(installed.stdout) == normalized(script.stdout)


OTHER_SCRIPTS = sorted(
    path.name for path in (ROOT / "scripts").glob("*.py")
    if path.name not in {Path(script).name for script in SCRIPTS.values()}
)  # fmt: skip


@pytest.mark.slow  # a Python start-up each
@pytest.mark.parametrize("name", OTHER_SCRIPTS)
def test_every_other_script_runs_from_the_checkout_without_pythonpath(name: str) -> None:
    """The benchmarks' and experiments' scripts (load_test.py, compare_backends.py, ...), which
    have no command: --help works from the checkout with no PYTHONPATH set."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    completed = subprocess.run(
        [sys.executable, f"scripts/{name}", "--help"], cwd=ROOT, capture_output=True, text=True,
        timeout=300, env=environment,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.startswith("usage:")
