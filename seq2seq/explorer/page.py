"""The explorer's HTML page: one file with its data, styles and script inside, nothing fetched."""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path
from typing import Any

from seq2seq.atomic import write_atomic


def asset(name: str) -> str:
    return resources.files("seq2seq.explorer").joinpath("assets", name).read_text("utf-8")


def page(data: dict[str, Any]) -> str:
    """The page for ``data`` (``explorer_data``'s). The JSON sits in a script element of its own
    type, ``</`` escaped so that no string in it can end the element."""
    payload = json.dumps(data, ensure_ascii=False, allow_nan=False).replace("</", "<\\/")
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
        "gold links (solid sure, dashed possible). Hatched cells: weight exactly 0 (a sparse "
        "normalizer's or a window's), not merely small. Magenta edges: a local window.</p>\n"
        "</main>\n"
        f'<script type="application/json" id="data">{payload}</script>\n'
        f"<script>\n{asset('explorer.js')}</script>\n</body>\n</html>\n"
    )


def write_page(data: dict[str, Any], path: str | Path) -> Path:
    """Write the page to ``path`` (atomically: a reader never sees half a page)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = page(data)
    write_atomic(path, lambda temporary: temporary.write_text(text, encoding="utf-8"))
    return path
