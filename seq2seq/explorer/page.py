"""The explorer's HTML page: one file with its data, styles and script inside, nothing fetched."""

from __future__ import annotations

import html
import json
import logging
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from seq2seq.atomic import write_atomic

log = logging.getLogger("seq2seq.explorer")


def asset(name: str) -> str:
    return resources.files("seq2seq.explorer").joinpath("assets", name).read_text("utf-8")


# Models one page holds (a sweep of 4 settings × 4 seeds): the checkboxes choose which of them
# are drawn, SIDE_BY_SIDE at most (the same constant in assets/explorer.js).
MAX_MODELS = 16
SIDE_BY_SIDE = 4

# Weights travel in the page as integers in units of 1e-4 (their 4 decimals, nothing lost):
# "1234" for 0.1234 and "0" for 0.0 make a Transformer's training page about a third lighter.
QUANTUM = 10_000
QUANTIZED = ("weights", "coverage")


def quantized(value: Any) -> Any:
    """``value`` with every map's ``weights`` and ``coverage`` (lists of rows) as integers in
    units of 1/QUANTUM; the page's script divides them back before drawing."""
    if isinstance(value, dict):
        return {
            key: [[round(w * QUANTUM) for w in row] for row in item]
            if key in QUANTIZED and isinstance(item, list)
            else quantized(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [quantized(item) for item in value]
    return value


def unquantized(value: Any, quantum: int) -> Any:
    if isinstance(value, dict):
        return {
            key: [[w / quantum for w in row] for row in item]
            if key in QUANTIZED and isinstance(item, list)
            else unquantized(item, quantum)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [unquantized(item, quantum) for item in value]
    return value


def read_page(text: str) -> dict[str, Any]:
    """The data a page holds (``page``'s inverse, weights back to their 4 decimals)."""
    embedded = text.split('<script type="application/json" id="data">', 1)[1].split("</script>")[0]
    data = json.loads(embedded)
    quantum = data.pop("quantum", 1)
    return data if quantum == 1 else unquantized(data, quantum)


def page(data: dict[str, Any]) -> str:
    """The page for ``data`` (``explorer_data``'s). The JSON sits in a script element of its own
    type, ``</`` escaped so that no string in it can end the element; weights quantized."""
    compact = {**quantized(data), "quantum": QUANTUM}
    payload = json.dumps(compact, ensure_ascii=False, allow_nan=False).replace("</", "<\\/")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(str(data.get('title', 'Attention explorer')))}</title>\n"
        f"<style>\n{asset('explorer.css')}</style>\n</head>\n<body>\n"
        # The hatching of exact zeros, defined once for every map (an id is page-wide).
        '<svg width="0" height="0" style="position:absolute"><defs>'
        '<pattern id="exact-zero" width="4" height="4" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="4" height="4" fill="#fff"/>'
        '<line x1="0" y1="0" x2="0" y2="4" stroke="#c8c8c8" stroke-width="1.5"/></pattern>'
        "</defs></svg>\n"
        '<header id="controls"></header>\n<main>\n'
        '<div id="source"></div>\n<div id="panels"></div>\n'
        '<p id="note">Hover a token, a cell or a word of the text under a map (or focus a map '
        "and use the arrow keys): the same row and column light up in every panel whose tokens "
        "are the same, and the weight reads at the top. Bars beside a map: the entropy of each "
        "row's weights (full: uniform over what the row may read). Bars under it: each source "
        "word's coverage, the weight it received up to the hovered row (dashed: 1). Boxes or dots: "
        "gold links (solid sure, dashed possible); orange crosses: another aligner's links "
        "(explore --links). Hatched cells: weight exactly 0 (a sparse "
        "normalizer's or a window's), not merely small. Magenta edges: a local window.</p>\n"
        "</main>\n"
        f'<script type="application/json" id="data">{payload}</script>\n'
        f"<script>\n{asset('explorer.js')}</script>\n</body>\n</html>\n"
    )


@dataclass(frozen=True)
class InlinePage:
    """A page shown in a Jupyter notebook's output: the same page in a sandboxed iframe's
    ``srcdoc`` (its scripts run inside it; no CDN, no require.js, nothing fetched). Make one with
    ``inline(data)`` as the last expression of a cell, or ``display(inline(data))``."""

    data: dict[str, Any]
    height: int = 760

    def __repr__(self) -> str:  # the text a notebook shows where it cannot show HTML
        models = ", ".join(str(model["name"]) for model in self.data.get("models", []))
        return f"<attention explorer: {len(self.data.get('sentences', []))} sentences, {models}>"

    def _repr_html_(self) -> str:
        return (
            f'<iframe srcdoc="{html.escape(page(self.data), quote=True)}" '
            f'style="width: 100%; height: {self.height}px; border: 1px solid #ccc" '
            'sandbox="allow-scripts allow-downloads" title="attention explorer"></iframe>'
        )

    def save(self, path: str | Path) -> Path:
        """The page as a file of its own (``write_page``)."""
        return write_page(self.data, path)


def inline(data: dict[str, Any], height: int = 760) -> InlinePage:
    """``data`` (``explorer_data``'s) as a page a notebook shows in its output."""
    return InlinePage(data, height)


# Past this size a page is slow to open and heavy to share: say so, and how to make it lighter.
LARGE_PAGE = 20_000_000


def write_page(data: dict[str, Any], path: str | Path) -> Path:
    """Write the page to ``path`` (atomically: a reader never sees half a page)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = page(data)
    write_atomic(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))
    size = path.stat().st_size
    if size > LARGE_PAGE:
        log.warning(
            "%s is %.0f MB: a Transformer's every layer and head of long sentences add up. "
            "Show fewer or shorter sentences (explore.py --lines, or fewer input lines to "
            "translate.py --attention-html).",
            path,
            size / 1e6,
        )
    return path
