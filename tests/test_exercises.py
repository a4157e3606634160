"""notebooks/exercises/: each master notebook through otter-grader's own commands, as a teacher
runs them (``otter assign``, then ``otter run`` with the autograder it made): the solution
scores every point, the student's skeleton none (every graded check fails, so that an exercise
cannot pass empty)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = sorted((ROOT / "notebooks" / "exercises").glob("*.py"))
OTTER = shutil.which("otter", path=str(Path(sys.executable).parent)) or shutil.which("otter")
# The last cell of each trains on the toy task; grading skips it (as the notebooks say).
ENVIRONMENT = {**os.environ, "SEQ2SEQ_EXERCISE_TRAINING": "0", "PYTHONPATH": str(ROOT)}

needs_otter = pytest.mark.skipif(OTTER is None, reason="otter-grader is not installed")


def otter(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert OTTER is not None
    return subprocess.run(
        [OTTER, *arguments], cwd=cwd, env=ENVIRONMENT, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


def graded(results: Path) -> list[dict[str, float]]:
    """The graded questions of otter's results.json (its public summary has no score)."""
    return [test for test in json.loads(results.read_text())["tests"] if "score" in test]


@needs_otter
@pytest.mark.slow  # otter assign and two otter runs: ~30 s an exercise; CI runs the slow set
@pytest.mark.parametrize("master", EXERCISES, ids=lambda path: path.stem)
def test_the_solution_scores_every_point_and_the_skeleton_none(
    master: Path, tmp_path: Path
) -> None:
    notebook = tmp_path / f"{master.stem}.ipynb"
    subprocess.run(
        [sys.executable, "-m", "jupytext", "--to", "ipynb", "-o", str(notebook), str(master)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    assigned = otter("assign", notebook.name, "dist", cwd=tmp_path)  # runs the solution's tests
    assert assigned.returncode == 0, assigned.stderr[-3000:]
    [autograder] = (tmp_path / "dist" / "autograder").glob("*.zip")
    for side, full in (("autograder", True), ("student", False)):
        out = tmp_path / f"{side}-results"
        out.mkdir()
        graded_run = otter(
            "run", "--no-logo", "-a", str(autograder), "-o", str(out),
            str(tmp_path / "dist" / side / notebook.name), cwd=tmp_path,
        )  # fmt: skip
        assert graded_run.returncode == 0, graded_run.stderr[-3000:]
        questions = graded(out / "results.json")
        assert questions, out.joinpath("results.json").read_text()
        for question in questions:
            expected = question["max_score"] if full else 0
            assert question["score"] == expected, (side, question)
