"""Explorer pages made of random attention, shaped as ``explorer_data`` shapes them, for the
browser tests: RNN and Transformer models, gold links, windows, earlier snapshots, long
sentences, without training anything. And a Chromium tab that may fetch nothing but the page."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from seq2seq.explorer.data import attention_map
from seq2seq.explorer.page import read_page, write_page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)"
)


def weights(rows: int, cols: int, generator: torch.Generator, sharp: float = 3.0) -> torch.Tensor:
    """Random attention (rows, cols), each row a softmax of Gaussian scores times ``sharp``."""
    return torch.softmax(sharp * torch.randn(rows, cols, generator=generator), dim=-1)


def model(name: str, layers: int | None = None, heads: int | None = None, **parts: Any) -> dict:
    return {
        "name": name,
        "architecture": "Transformer" if layers else "Seq2Seq",
        "scoring": "DotProductAttention",
        "attention": parts.pop("attention", "scaled_dot"),
        "scaled": True,
        "normalizer": parts.pop("normalizer", "softmax"),
        "alpha": None,
        "window": parts.pop("window", "global"),
        "window_size": parts.pop("window_size", None),
        "key_bias": False,
        "coverage": parts.pop("coverage", False),
        "input_feeding": False,
        "layers": layers,
        "heads": heads,
        "backend": "torch",
    }


def view(
    src: list[str],
    tgt: list[str],
    hyp: list[str],
    generator: torch.Generator,
    layers: int | None = None,
    heads: int | None = None,
    gold: Any = None,
) -> dict[str, Any]:
    """One model's view of one sentence, teacher-forced on ``tgt``, decoding ``hyp``."""
    forced = weights(len(tgt), len(src), generator)
    out: dict[str, Any] = {
        "hypothesis": " ".join(hyp),
        "hyp_tokens": hyp,
        "hyp_attention": attention_map(weights(len(hyp), len(src), generator), None, coverage=True),
        "score": None,
        "n_best": [],
        "src_tokens": src,
        "tgt_tokens": tgt,
        "forced_on": "reference",
    }
    if layers and heads:
        cross = torch.stack(
            [torch.stack([weights(len(tgt), len(src), generator) for _ in range(heads)])
             for _ in range(layers)]
        )  # fmt: skip
        forced = cross[-1].mean(0)
        out["heads"] = [[attention_map(h, gold) for h in layer] for layer in cross]
        out["layer_means"] = [attention_map(layer.mean(0), gold) for layer in cross]
        out["decoder_inputs"] = ["<bos>", *tgt[:-1]]
        out["encoder_self"] = [
            [attention_map(weights(len(src), len(src), generator), None)
             for _ in range(heads)] for _ in range(layers)
        ]  # fmt: skip
        causal = torch.ones(len(tgt), len(tgt), dtype=torch.bool).tril()
        out["decoder_self"] = [
            [attention_map(
                torch.softmax(torch.randn(len(tgt), len(tgt), generator=generator)
                              .masked_fill(~causal, float("-inf")), -1), None, causal)
             for _ in range(heads)] for _ in range(layers)
        ]  # fmt: skip
    out["forced"] = attention_map(forced, gold, coverage=True)
    return out


def page_data(
    models: list[dict[str, Any]],
    sentences: int = 3,
    length: int = 6,
    seed: int = 0,
    snapshots: int = 0,
    hyp_differs: bool = False,
) -> dict[str, Any]:
    """A page of ``models`` on ``sentences`` sentences of ``length`` tokens (the i-th source
    token s_i aligned to target token t_i: a diagonal of sure links, every third possible too),
    with ``snapshots`` earlier validations stripped as training strips them."""
    from seq2seq.analysis.alignment import GoldAlignment
    from seq2seq.training.callbacks import without_heads

    generator = torch.Generator().manual_seed(seed)

    def snapshot(label: str | None, latest: bool = True) -> dict[str, Any]:
        items = []
        for index in range(sentences):
            n = length + index % 4
            src = [f"s{i}" for i in range(n)]
            tgt = [f"t{i}" for i in range(n)]
            sure = {(i, i) for i in range(n)}
            gold = GoldAlignment(
                frozenset(sure), frozenset(sure | {(i, i + 1) for i in range(0, n - 1, 3)})
            )
            views = {}
            for number, m in enumerate(models):
                hyp = [f"{'xyzw'[number]}{i}" for i in range(n)] if hyp_differs else tgt
                # An earlier snapshot is stripped of its heads: not worth computing them.
                layers, heads = (m["layers"], m["heads"]) if latest else (None, None)
                views[m["name"]] = view(src, tgt, hyp, generator, layers, heads, gold)
            items.append({
                "src": " ".join(src), "ref": " ".join(tgt),
                "gold": {"sure": sorted([i, j] for i, j in gold.sure),
                         "possible": sorted([i, j] for i, j in gold.possible - gold.sure)},
                "models": views,
            })  # fmt: skip
        data = {"title": "test page", "models": models, "beam_size": 1, "sentences": items,
                "checkpoints": [], "version": 1}  # fmt: skip
        if label is not None:
            data["checkpoint"] = label
        return data

    data = snapshot(f"step {snapshots}" if snapshots else None)
    data["checkpoints"] = [without_heads(snapshot(f"step {i}", False)) for i in range(snapshots)]
    return data


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One Chromium for a test module (a tab per test)."""
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@contextlib.contextmanager
def browser_tab(
    browser: Any, data: dict[str, Any], path: Path, width: int = 1400, height: int = 900
) -> Iterator[Any]:
    """A tab of ``browser`` showing ``data``'s page from ``path`` (file://): every other request
    is refused, and any script error or request fails the test when the tab closes."""
    write_page(data, path)
    requests: list[str] = []
    errors: list[str] = []
    context = browser.new_context(
        viewport={"width": width, "height": height}, accept_downloads=True
    )

    def only_the_page(route: Any) -> None:
        if route.request.url == path.as_uri():
            route.continue_()
        else:
            requests.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_page)
    tab = context.new_page()
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.goto(path.as_uri())
    try:
        yield tab
    finally:
        context.close()
    assert errors == [] and requests == []


def screenshot(page: Path, out: Path, hover: str | None = None) -> None:
    """``page`` (an explorer page) as the browser tests see it, 1400 × 900, with ``hover`` (a
    selector) hovered: the README's picture (``make screenshot``)."""
    from playwright.sync_api import sync_playwright

    data = read_page(page.read_text(encoding="utf-8"))
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        with browser_tab(browser, data, out.with_suffix(".html")) as tab:
            if hover:
                tab.locator(hover).first.hover()
            tab.screenshot(path=str(out))
        browser.close()
    out.with_suffix(".html").unlink()


if __name__ == "__main__":
    import sys

    screenshot(
        Path(sys.argv[1]), Path(sys.argv[2]).resolve(), sys.argv[3] if len(sys.argv) > 3 else None
    )
