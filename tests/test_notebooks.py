"""The notebooks under notebooks/, executed as a reader would run them (nbclient, a fresh
kernel): every cell of every notebook runs; the explorer's (on a tiny model) shows the page inline
in its output, an iframe that fetches nothing and draws its maps in Chromium. Each notebook is
committed with its outputs and in step with its jupytext script (``make notebooks``)."""

from __future__ import annotations

import html
import os
import re
from pathlib import Path
from typing import Any

import pytest

from seq2seq.inference.bundle import export_bundle, load
from seq2seq.pipeline import train
from tests.configs import ROOT, TINY, compose_config
from tests.explorer_pages import chromium, needs_chromium

__all__ = ["chromium"]  # the fixture, imported for the browser test

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install .[dev])")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install .[dev])")


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    run = tmp_path_factory.mktemp("run")
    result = train(compose_config([*TINY, "trainer.max_epochs=1", "logger=csv",
                                   "test_after_training=false", f"run_dir={run}"]))  # fmt: skip
    bundle = export_bundle(load(result["best_checkpoint"]), run / "bundle")
    notebook = nbformat.read(ROOT / "notebooks" / "explorer.ipynb", as_version=4)
    environment = {**os.environ, "SEQ2SEQ_MODEL": str(bundle), "PYTHONPATH": str(ROOT)}
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "notebooks")}},
    )  # fmt: skip
    client.execute(env=environment)  # the kernel's environment: the model to load
    return notebook


NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


# Notebooks that train take minutes: the slow set (which CI runs too) executes them.
TRAINING = {"train_and_compare.ipynb", "inside_a_transformer.ipynb", "your_own_attention.ipynb"}


def cells(notebook: Any) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source) for cell in notebook.cells]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_is_its_script_executed(path: Path) -> None:
    """The .py script (jupytext's percent format, what a diff shows) and the .ipynb (what a
    student opens) hold the same cells, and the .ipynb was run: every code cell has its outputs
    and none is an error."""
    jupytext = pytest.importorskip("jupytext", reason="pip install .[dev] installs jupytext")
    script = path.with_suffix(".py")
    assert script.is_file(), f"{path.name} has no {script.name}: run make notebooks"
    committed = nbformat.read(path, as_version=4)
    assert cells(jupytext.read(script)) == cells(committed), f"{path.name}: run make notebooks"
    code = [cell for cell in committed.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in code), f"{path.name} was not run"
    assert not [o for cell in code for o in cell.outputs if o.output_type == "error"]


def test_every_script_has_its_notebook() -> None:
    scripts = {p.stem for p in (ROOT / "notebooks").glob("*.py")}
    assert scripts == {p.stem for p in NOTEBOOKS}


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=[pytest.mark.slow] if p.name in TRAINING else [])
        for p in NOTEBOOKS
        if p.name != "explorer.ipynb"
    ],
    ids=lambda p: p.name,
)
def test_every_notebook_runs_top_to_bottom(path: Path, tmp_path: Path) -> None:
    """Each notebook as committed (the explorer's, which needs a model, has its own test), run
    in a directory of its own: what it writes (runs/) stays out of the checkout."""
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )  # fmt: skip
    client.execute()  # a cell that raises fails here, with the cell and its traceback
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]


def test_the_explorer_notebook_runs_and_shows_the_page_inline(executed: Any) -> None:
    outputs = [o for cell in executed.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    [shown] = [o.data["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert shown.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts' in shown
    inner = html.unescape(re.search(r'srcdoc="([^"]*)"', shown).group(1))
    assert "require.js" not in shown and "http://" not in inner and "https://" not in inner
    assert "the dog sees a cat ." in inner


@needs_chromium
def test_the_inline_page_draws_in_a_browser(executed: Any, chromium: Any, tmp_path: Path) -> None:
    outputs = [o for cell in executed.cells if cell.cell_type == "code" for o in cell.outputs]
    [shown] = [o.data["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    path = tmp_path / "output.html"
    path.write_text(f"<!DOCTYPE html><html><body>{shown}</body></html>")
    tab = chromium.new_page()
    refused: list[str] = []
    tab.route("**/*", lambda route: route.continue_() if route.request.url == path.as_uri()
              else (refused.append(route.request.url), route.abort()))  # fmt: skip
    tab.goto(path.as_uri())
    frame = tab.frame_locator("iframe")
    frame.locator("#panels .panel").first.wait_for()
    # One model, its panel and the colour bar drawn (a barely trained model may translate a
    # sentence as nothing: its panel then says so instead of a map).
    assert frame.locator("#panels .panel").count() == 1
    assert frame.locator("header svg.colourbar").count() == 1
    tab.close()
    assert refused == []
