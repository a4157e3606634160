"""The explorer page in Chromium (network blocked, from file://), used as a student would: each
test reproduces one way the page was hard to read or easy to break (issue 58) and checks that it
no longer is, then the views added for it (colour bar, text view, keyboard cursor, windows,
coverage, zoom), an accessibility check and the size budget of the pages that training writes."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from seq2seq.explorer.data import attention_map
from seq2seq.explorer.page import page
from seq2seq.training.callbacks import without_heads
from tests.explorer_pages import browser_tab, chromium, model, needs_chromium, page_data

__all__ = ["chromium"]  # the fixture, imported for the tests below

pytestmark = needs_chromium

TWO = [model("additive", attention="additive"), model("scaled_dot")]
TRANSFORMERS = [model("big", layers=3, heads=4), model("small", layers=2, heads=4)]


def rgb(fill: str) -> tuple[int, ...]:
    match = re.fullmatch(r"rgb\((\d+),(\d+),(\d+)\)", fill.replace(" ", ""))
    assert match, fill
    return tuple(int(x) for x in match.groups())


def fill_of(tab: Any, selector: str) -> str:
    return str(tab.locator(selector).first.get_attribute("fill"))


def cell(name: str, row: int, col: int) -> str:
    return f'.panel[data-model="{name}"] rect.cell[data-row="{row}"][data-col="{col}"]'


def box(tab: Any, selector: str) -> dict[str, float]:
    found = tab.locator(selector).first.bounding_box()
    assert found is not None, selector
    return found


def with_weights(data: dict[str, Any], name: str, weights: torch.Tensor) -> dict[str, Any]:
    """``data`` with the first sentence's teacher-forced map of ``name`` replaced by ``weights``."""
    view = data["sentences"][0]["models"][name]
    view["forced"] = attention_map(weights, None)
    return data


# ---- 1. the colour scale, a colour bar and the weight in numbers -----------------------------


def test_small_weights_are_visible_and_exact_zeros_distinct(chromium: Any, tmp_path: Path) -> None:
    weights = torch.tensor([[0.0, 0.011, 0.029, 0.96], [0.25, 0.25, 0.25, 0.25]])
    data = page_data(TWO, sentences=1, length=4)
    data = with_weights(data, "additive", weights)
    with browser_tab(chromium, data, tmp_path / "p.html") as tab:
        zero, small = cell("additive", 0, 0), cell("additive", 0, 1)
        assert fill_of(tab, zero) == "url(#exact-zero)"  # hatched, not a colour
        # The smallest weight is far from white (the old scale drew 0.011 as (252,253,253)).
        assert sum(255 - c for c in rgb(fill_of(tab, small))) > 150
        assert rgb(fill_of(tab, small)) != rgb(fill_of(tab, cell("additive", 0, 2)))
        # A colour bar with its numbers, in the header (on screen without scrolling).
        bar = tab.locator("header svg.colourbar")
        text = bar.text_content() or ""
        assert bar.count() == 1 and "0.5" in text and "exactly 0" in text
        # The hovered cell's weight, as a number on screen.
        tab.locator(small).hover()
        assert tab.locator("#readout").inner_text() == "additive: t0 ← s1 = 0.0110"
        tab.locator(zero).hover()
        assert tab.locator("#readout").inner_text().endswith("exactly 0")
        # √w spreads a near-uniform map's small weights: 0.011 moves a tenth of the way along.
        linear = rgb(fill_of(tab, small))
        tab.select_option("#scale", "sqrt")
        root = rgb(fill_of(tab, small))
        assert sum(abs(a - b) for a, b in zip(linear, root, strict=True)) > 60


# ---- 2 and 3. side by side; legends that fit ----------------------------------------------


def test_two_models_and_their_difference_share_a_row_at_1400_px(
    chromium: Any, tmp_path: Path
) -> None:
    with browser_tab(chromium, page_data(TWO), tmp_path / "p.html", width=1400) as tab:
        boxes = [
            box(tab, f'.panel[data-model="{n}"]') for n in ("additive", "scaled_dot", "difference")
        ]
        assert len({round(b["y"]) for b in boxes}) == 1  # one row
        assert all(b["x"] + b["width"] <= 1400 for b in boxes)
        # The histogram is under its map, not beside it.
        chart, heat = (
            box(tab, ".panel[data-model=additive] figure.spread"),
            box(tab, ".panel[data-model=additive] svg.map"),
        )
        assert chart["y"] >= heat["y"] + heat["height"]


def test_four_models_make_a_grid_and_a_narrow_window_stacks(chromium: Any, tmp_path: Path) -> None:
    four = [model(name) for name in ("a", "b", "c", "d")]
    with browser_tab(chromium, page_data(four), tmp_path / "p.html", width=1400) as tab:
        first, difference = (
            box(tab, '.panel[data-model="a"]'),
            box(tab, '.panel[data-model="difference"]'),
        )
        # The difference is in the second row of the grid, not ~1,800 px below the first map.
        assert difference["y"] < first["y"] + 2 * first["height"] + 40
        assert len({round(box(tab, f'.panel[data-model="{n}"]')["y"]) for n in "abc"}) == 1
    with browser_tab(chromium, page_data(TWO), tmp_path / "n.html", width=800) as tab:
        a, b = (
            box(tab, '.panel[data-model="additive"]'),
            box(tab, '.panel[data-model="scaled_dot"]'),
        )
        assert a["x"] == b["x"] and b["y"] >= a["y"] + a["height"]
        assert tab.evaluate("document.documentElement.scrollWidth") <= 800  # no sideways scroll


def test_the_histogram_caption_is_whole_and_captions_say_entropy(
    chromium: Any, tmp_path: Path
) -> None:
    with browser_tab(chromium, page_data(TRANSFORMERS), tmp_path / "p.html") as tab:
        caption = tab.locator('.panel[data-model="big"] figure.spread figcaption').inner_text()
        assert re.search(r"std \d+\.\d\d$", caption) and "logits" in caption, caption
        # Every number under the histogram inside its SVG (none cut at the edge).
        assert tab.evaluate(
            """() => [...document.querySelectorAll('figure.spread svg')].every((svg) =>
                 [...svg.querySelectorAll('text')].every((t) => { const b = t.getBBox();
                   return b.x >= 0 && b.x + b.width <= svg.width.baseVal.value; }))"""
        )
        thumbs = tab.locator('.panel[data-model="big"] .thumb').all_inner_texts()
        assert thumbs and all("ent " in t and "H=" not in t for t in thumbs)


# ---- 4. names from the config --------------------------------------------------------------


def test_panels_say_dot_or_scaled_dot_and_the_attention_parts(
    chromium: Any, tmp_path: Path
) -> None:
    models = [
        model("one", attention="dot"),
        model(
            "two", attention="scaled_dot", normalizer="sparsemax", window="local_p", window_size=3
        ),
    ]
    with browser_tab(chromium, page_data(models), tmp_path / "p.html") as tab:
        assert "dot" in tab.locator('.panel[data-model="one"] .kind').inner_text().split(" · ")
        kind = tab.locator('.panel[data-model="two"] .kind').inner_text().split(" · ")
        assert "scaled_dot" in kind and "sparsemax" in kind and "local_p D = 3" in kind


# ---- 5. long sentences -------------------------------------------------------------------


def test_an_80_by_35_map_keeps_readable_labels_and_small_gold_marks(
    chromium: Any, tmp_path: Path
) -> None:
    data = page_data([model("m")], sentences=1, length=35)
    view = data["sentences"][0]["models"]["m"]
    view["hyp_tokens"] = [f"h{i}" for i in range(80)]
    view["hyp_attention"] = attention_map(torch.softmax(torch.randn(80, 35), -1), None)
    with browser_tab(chromium, data, tmp_path / "p.html") as tab:
        tab.select_option("#map", "decoding")
        rows = tab.locator("svg.map text.token.row")
        assert rows.count() >= 20  # thinned, not gone
        ys = sorted(float(rows.nth(i).get_attribute("y") or 0) for i in range(rows.count()))
        assert min(b - a for a, b in itertools.pairwise(ys)) >= 10  # no two labels overlap
        assert tab.locator("svg.map text.token.col").count() == 35
    long = page_data(TWO, sentences=1, length=107)  # two models and a difference: ~5 px cells
    with browser_tab(chromium, long, tmp_path / "l.html") as tab:
        size = float(tab.locator("svg.map rect.cell").first.get_attribute("width") or 0)
        dots = tab.locator('.panel[data-model="additive"] svg.map circle.sure')
        assert size < 10 and dots.count() == 107 and tab.locator("svg.map rect.sure").count() == 0
        assert float(dots.first.get_attribute("r") or 0) <= size * 0.25


def test_zoom_and_the_text_view_read_a_long_sentence(chromium: Any, tmp_path: Path) -> None:
    data = page_data([model("m")], sentences=1, length=60)
    with browser_tab(chromium, data, tmp_path / "p.html") as tab:
        before = float(tab.locator("svg.map rect.cell").first.get_attribute("width") or 0)
        tab.focus("#zoom")
        tab.select_option("#zoom", "4")
        assert (
            float(tab.locator("svg.map rect.cell").first.get_attribute("width") or 0) == 4 * before
        )
        assert tab.evaluate("document.activeElement.id") == "zoom"
        # The text view: hover target word 7, each source word shaded by its weight in row 7.
        tab.locator('.textview span.word.row[data-index="7"]').hover()
        weights = data["sentences"][0]["models"]["m"]["forced"]["weights"][7]
        shaded = tab.locator(".textview span.word.col")
        assert shaded.count() == 60
        heaviest = max(range(60), key=weights.__getitem__)
        assert "read" in (shaded.nth(heaviest).get_attribute("class") or "")
        assert shaded.nth(heaviest).get_attribute("title") == f"{weights[heaviest]:.4f}"
        assert tab.evaluate("document.body.dataset.row") == "7"


# ---- 6 and 7. controls that keep working -------------------------------------------------


def test_every_control_keeps_the_keyboard_focus(chromium: Any, tmp_path: Path) -> None:
    with browser_tab(chromium, page_data(TRANSFORMERS, sentences=4), tmp_path / "p.html") as tab:
        tab.focus("#sentence")
        for expected in ("1", "2", "3"):
            tab.keyboard.press("ArrowDown")
            assert tab.locator("#sentence").input_value() == expected
            assert tab.evaluate("document.activeElement.id") == "sentence"
        tab.focus("#gold")
        for expected in (False, True, False):
            tab.keyboard.press("Space")
            assert tab.locator("#gold").is_checked() is expected
            assert tab.evaluate("document.activeElement.id") == "gold"
        for control in ("#map", "#layer", "#head", "#scale"):
            tab.focus(control)
            tab.keyboard.press("ArrowDown")
            tab.keyboard.press("ArrowDown")
            assert tab.evaluate("document.activeElement.id") == control[1:]


def test_the_checkpoint_slider_drags(chromium: Any, tmp_path: Path) -> None:
    data = page_data([model("m")], sentences=2, snapshots=40)
    with browser_tab(chromium, data, tmp_path / "p.html") as tab:
        slider = box(tab, "#checkpoint")
        y = slider["y"] + slider["height"] / 2
        tab.mouse.move(slider["x"] + slider["width"] - 4, y)
        tab.mouse.down()
        seen = []
        for fraction in (0.8, 0.6, 0.4, 0.2, 0.0):
            tab.mouse.move(slider["x"] + 4 + fraction * (slider["width"] - 8), y, steps=3)
            seen.append(int(tab.locator("#checkpoint").input_value()))
        tab.mouse.up()
        # The value follows the pointer during the drag, and the panels show that snapshot.
        assert seen == sorted(seen, reverse=True) and seen[0] < 40 and seen[-1] == 0
        assert tab.locator("#checkpoint-name").inner_text().strip() == "step 0"


# ---- 8 to 10. hover ------------------------------------------------------------------------


def test_the_highlight_clears_when_the_pointer_leaves(chromium: Any, tmp_path: Path) -> None:
    with browser_tab(chromium, page_data(TWO), tmp_path / "p.html") as tab:
        tab.locator(cell("additive", 2, 3)).hover()
        assert (
            float(
                tab.locator('.panel[data-model="scaled_dot"] rect[data-band="row"]').get_attribute(
                    "height"
                )
                or 0
            )
            > 0
        )
        tab.mouse.move(5, 880)
        assert tab.evaluate(
            """() => [...document.querySelectorAll('rect.band')]
                 .every((r) => r.getAttribute('width') === '0')
               && [...document.querySelectorAll('text.token')]
                 .every((t) => !t.style.fillOpacity && !t.classList.contains('lit'))"""
        )
        assert tab.evaluate("document.body.dataset.row") == ""


def test_a_hovered_cells_own_labels_are_lit_not_faded(chromium: Any, tmp_path: Path) -> None:
    with browser_tab(chromium, page_data(TWO), tmp_path / "p.html") as tab:
        tab.locator(cell("additive", 2, 3)).hover()
        for selector in ('text.token.col[data-col="3"]', 'text.token.row[data-row="2"]'):
            label = tab.locator(f'.panel[data-model="additive"] {selector}')
            assert "lit" in (label.get_attribute("class") or "")
            assert label.evaluate("(t) => [t.style.fillOpacity, getComputedStyle(t).fill]") == [
                "",
                "rgb(176, 0, 0)",
            ]


def test_panels_with_different_tokens_are_not_linked_by_position(
    chromium: Any, tmp_path: Path
) -> None:
    data = page_data(TWO, hyp_differs=True)
    with browser_tab(chromium, data, tmp_path / "p.html") as tab:
        tab.select_option("#map", "decoding")
        tab.locator('.panel[data-model="additive"] text.token.row[data-row="1"]').hover()
        other = '.panel[data-model="scaled_dot"]'
        assert tab.locator(f'{other} rect[data-band="row"]').get_attribute("height") == "0"
        assert tab.locator(f"{other} text.token.lit").count() == 0
        # Their source tokens are the same: a source column is linked.
        tab.locator('.panel[data-model="additive"] text.token.col[data-col="2"]').hover()
        assert float(tab.locator(f'{other} rect[data-band="col"]').get_attribute("width") or 0) > 0


# ---- 11. exports -----------------------------------------------------------------------------


def test_exports_carry_no_hover_state_and_keep_dashed_possible_links(
    chromium: Any, tmp_path: Path
) -> None:
    with browser_tab(chromium, page_data(TWO), tmp_path / "p.html") as tab:
        tab.locator(cell("additive", 2, 3)).hover()
        with tab.expect_download() as download:
            tab.locator("#download-svg").click()
        text = Path(download.value.path()).read_text()
        assert "data-band" not in text and 'class="cursor"' not in text
        assert "fill-opacity" not in text and 'class="token' not in text
        assert re.search(r"rect\.possible[^{]*\{[^}]*stroke-dasharray", text)
        assert text.count('class="possible"') > 0 and 'id="exact-zero"' in text
        assert "colourbar" in text
        with tab.expect_download() as png:
            tab.locator("#download-png").click()
        assert Path(png.value.path()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- 12 to 15. Transformer views that say what they show -------------------------------------


def test_the_head_menu_is_honoured_on_the_last_layer(chromium: Any, tmp_path: Path) -> None:
    data = page_data(TRANSFORMERS, sentences=1)
    with browser_tab(chromium, data, tmp_path / "p.html") as tab:
        tab.select_option("#head", "1")
        view = data["sentences"][0]["models"]["big"]
        expected = view["heads"][-1][1]["weights"]
        drawn = tab.locator(cell("big", 2, 4)).get_attribute("data-w")
        assert float(drawn or 0) == expected[2][4]
        assert "last layer (3), head 2" in tab.locator('.panel[data-model="big"] .aer').inner_text()


def test_a_layers_average_keeps_its_aer_and_histogram(chromium: Any, tmp_path: Path) -> None:
    data = page_data(TRANSFORMERS, sentences=1)
    with browser_tab(chromium, data, tmp_path / "p.html") as tab:
        tab.select_option("#layer", "0")
        meta = tab.locator('.panel[data-model="big"] .aer').inner_text()
        expected = data["sentences"][0]["models"]["big"]["layer_means"][0]["aer"]
        assert f"AER {expected:.3f}" in meta and "layer 1, heads averaged" in meta
        assert tab.locator('.panel[data-model="big"] figure.spread').count() == 1


def test_an_earlier_checkpoint_says_which_map_it_shows(chromium: Any, tmp_path: Path) -> None:
    data = page_data(TRANSFORMERS, sentences=1, snapshots=2)
    with browser_tab(chromium, data, tmp_path / "p.html") as tab:
        tab.select_option("#layer", "0")
        tab.select_option("#head", "2")
        tab.locator("#checkpoint").fill("0")
        meta = tab.locator('.panel[data-model="big"] .aer').inner_text()
        assert "last layer, heads averaged" in meta and "latest validation only" in meta
        assert "latest validation only" in tab.locator('.panel[data-model="big"]').inner_text()
        assert tab.locator("#layer").input_value() == "0"  # the menus are left as chosen
        tab.select_option("#map", "encoder")
        assert (
            "latest validation only"
            in tab.locator('.panel[data-model="big"] .missing').inner_text()
        )


def test_causal_entropy_bars_are_scaled_to_what_each_row_may_read(
    chromium: Any, tmp_path: Path
) -> None:
    data = page_data([model("m", layers=1, heads=1)], sentences=1, length=6)
    uniform = torch.ones(6, 6).tril()
    uniform = uniform / uniform.sum(-1, keepdim=True)  # row t: 1/(t+1) on positions 0..t
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    data["sentences"][0]["models"]["m"]["decoder_self"] = [[attention_map(uniform, None, causal)]]
    with browser_tab(chromium, data, tmp_path / "p.html") as tab:
        tab.select_option("#map", "decoder")
        widths = [float(w) for w in tab.locator("svg.map rect.entropy").evaluate_all(
            "(bars) => bars.map((b) => b.getAttribute('width'))")]  # fmt: skip
        assert widths[0] == 0 and all(w == pytest.approx(40, abs=0.05) for w in widths[1:])


# ---- 16. light pages ---------------------------------------------------------------------


def test_training_pages_keep_self_attention_for_the_latest_snapshot_only() -> None:
    """40 snapshots of 8 sentences of a 6 × 8 Transformer stay under 5 MB; four RNN models on
    20 sentences under 1 MB (the budgets of docs/explorer.md)."""
    transformer = page_data([model("t", layers=6, heads=8)], sentences=8, length=10, snapshots=40)
    # What training keeps of an earlier validation: the model's own maps, not the per-head ones.
    stripped = without_heads(json.loads(json.dumps(transformer)))["sentences"][0]["models"]["t"]
    assert {"forced", "hyp_attention"} <= set(stripped)
    assert not {"heads", "layer_means", "encoder_self", "decoder_self"} & set(stripped)
    assert len(page(transformer).encode()) < 5_000_000
    four = page_data([model(n) for n in "abcd"], sentences=20, length=12)
    assert len(page(four).encode()) < 1_000_000


# ---- the new views -------------------------------------------------------------------------


def test_arrow_keys_move_a_cursor_linked_like_hover(chromium: Any, tmp_path: Path) -> None:
    data = page_data(TWO, sentences=1)
    with browser_tab(chromium, data, tmp_path / "p.html") as tab:
        tab.focus('.panel[data-model="additive"] svg.map')
        # The first press puts the cursor on the first cell; the others move it.
        for key in (
            "ArrowDown",
            "ArrowDown",
            "ArrowDown",
            "ArrowRight",
            "ArrowRight",
            "ArrowRight",
        ):
            tab.keyboard.press(key)
        assert tab.evaluate("[document.body.dataset.row, document.body.dataset.col]") == ["2", "3"]
        weight = data["sentences"][0]["models"]["additive"]["forced"]["weights"][2][3]
        assert tab.locator("#readout").inner_text() == f"additive: t2 ← s3 = {weight:.4f}"
        cursor = tab.locator('.panel[data-model="additive"] rect.cursor')
        assert float(cursor.get_attribute("width") or 0) > 0
        band = tab.locator('.panel[data-model="scaled_dot"] rect[data-band="row"]')
        assert float(band.get_attribute("height") or 0) > 0
        tab.keyboard.press("Escape")
        assert tab.evaluate("document.body.dataset.row") == ""


def test_a_local_window_and_the_coverage_are_drawn(chromium: Any, tmp_path: Path) -> None:
    data = page_data([model("m", window="local_p", window_size=1)], sentences=1, length=6)
    forced = data["sentences"][0]["models"]["m"]["forced"]
    forced["window"] = {"centres": [0.2, 1.4, 2.6, 3.0, 4.4, 5.0], "size": 1}
    with browser_tab(chromium, data, tmp_path / "p.html") as tab:
        edges = tab.locator("svg.map g.window line:not(.centre)")
        assert edges.count() == 12  # two edges a row
        cell_size = float(tab.locator("svg.map rect.cell").first.get_attribute("width") or 0)
        left = float(tab.locator(cell("m", 0, 0)).get_attribute("x") or 0)
        # Row 2: round(2.6) = 3, the window is columns 2..4.
        xs = sorted(float(edges.nth(i).get_attribute("x1") or 0) for i in (4, 5))
        assert xs == [left + 2 * cell_size, left + 5 * cell_size]
        # Coverage under the map: after row 3 (hovered), each column's running sum.
        tab.locator(cell("m", 3, 0)).hover()
        titles = tab.locator("svg.map rect.coverage-bar title").all_text_contents()
        expected = forced["coverage"][3]
        assert [float(t.split("coverage ")[1].split(" ")[0]) for t in titles] == pytest.approx(
            expected, abs=1e-3
        )
        assert all("after step 4" in t for t in titles)


def test_the_page_passes_an_accessibility_check(chromium: Any, tmp_path: Path) -> None:
    """axe-core (vendored by axe-playwright-python, run inside the page) finds nothing serious
    or critical on an RNN page and a Transformer page with a checkpoint slider."""
    axe = pytest.importorskip(
        "axe_playwright_python.sync_playwright", reason="axe-playwright-python is not installed"
    )
    for name, data in [
        ("rnn", page_data(TWO)),
        ("transformer", page_data(TRANSFORMERS, snapshots=2)),
    ]:
        with browser_tab(chromium, data, tmp_path / f"{name}.html") as tab:
            results = axe.Axe().run(tab)
            serious = [
                (v["id"], v["help"], [n["target"] for n in v["nodes"]][:3])
                for v in results.response["violations"]
                if v["impact"] in ("serious", "critical")
            ]
            assert serious == [], json.dumps(serious, indent=1)


def test_the_hovered_rows_weights_light_the_other_side(chromium: Any, tmp_path: Path) -> None:
    """Shading follows the weights: the heaviest source token of the hovered row is bold."""
    data = page_data(TWO, sentences=1)
    with browser_tab(chromium, data, tmp_path / "p.html") as tab:
        tab.locator('.panel[data-model="scaled_dot"] text.token.row[data-row="3"]').hover()
        weights = data["sentences"][0]["models"]["scaled_dot"]["forced"]["weights"][3]
        heaviest = max(range(len(weights)), key=weights.__getitem__)
        read = tab.locator('.panel[data-model="scaled_dot"] text.token.col.read')
        assert read.first.get_attribute("data-col") == str(heaviest)
        opacity = tab.locator(
            f'.panel[data-model="scaled_dot"] text.token.col[data-col="{heaviest}"]'
        )
        assert float(opacity.evaluate("(t) => t.style.fillOpacity")) == pytest.approx(1.0)
        assert not math.isnan(weights[heaviest])


# ---- what a newcomer's review found (issue 58) -------------------------------------------


def test_a_hovered_cells_word_keeps_its_shade_in_the_text_view(
    chromium: Any, tmp_path: Path
) -> None:
    data = page_data(TWO, sentences=1)
    with browser_tab(chromium, data, tmp_path / "p.html") as tab:
        tab.locator(cell("additive", 2, 3)).hover()
        word = tab.locator('.panel[data-model="additive"] .textview span.word.col[data-index="3"]')
        assert "lit" in (word.get_attribute("class") or "")
        weight = data["sentences"][0]["models"]["additive"]["forced"]["weights"][2][3]
        assert word.get_attribute("title") == f"{weight:.4f}" and word.evaluate(
            "(w) => w.style.background"
        )


def test_the_difference_bar_labels_zero_and_is_symmetric(chromium: Any, tmp_path: Path) -> None:
    with browser_tab(chromium, page_data(TWO), tmp_path / "p.html") as tab:
        for scale in ("linear", "sqrt"):
            tab.select_option("#scale", scale)
            numbers = tab.locator('.panel[data-model="difference"] svg.colourbar text')
            labels = [float(t) for t in numbers.all_text_contents()]
            assert 0 in labels and sorted(labels) == sorted(-x for x in labels)


def test_two_models_without_a_difference_share_the_width(chromium: Any, tmp_path: Path) -> None:
    data = page_data(TWO, hyp_differs=True)
    with browser_tab(chromium, data, tmp_path / "p.html") as tab:
        tab.select_option("#map", "decoding")  # different translations: no difference map
        assert tab.locator('.panel[data-model="difference"]').count() == 0
        a, b = (
            box(tab, '.panel[data-model="additive"]'),
            box(tab, '.panel[data-model="scaled_dot"]'),
        )
        assert a["y"] == b["y"] and a["width"] > 600 and b["x"] + b["width"] > 1300


def test_the_keyboard_cursor_starts_at_the_first_cell_and_stays_in_sight(
    chromium: Any, tmp_path: Path
) -> None:
    data = page_data([model("m")], sentences=1, length=80)
    with browser_tab(chromium, data, tmp_path / "p.html") as tab:
        tab.focus("#zoom")
        tab.select_option("#zoom", "4")
        tab.focus("svg.map")
        tab.keyboard.press("ArrowRight")
        assert tab.evaluate("[document.body.dataset.row, document.body.dataset.col]") == ["0", "0"]
        for _ in range(70):
            tab.keyboard.press("ArrowRight")
        assert tab.evaluate("document.body.dataset.col") == "70"
        cursor, scroller = box(tab, "rect.cursor"), box(tab, ".scroller")
        assert scroller["x"] <= cursor["x"] <= scroller["x"] + scroller["width"]


def test_an_export_names_the_difference_and_draws_its_key(chromium: Any, tmp_path: Path) -> None:
    with browser_tab(chromium, page_data(TWO), tmp_path / "p.html") as tab:
        with tab.expect_download() as download:
            tab.locator("#download-svg").click()
        text = Path(download.value.path()).read_text()
        assert "additive − scaled_dot (red: more in additive)" in text
        assert text.count('class="colourbar"') == 2  # weights, and differences


def test_a_page_with_no_model_ticked_says_so(chromium: Any, tmp_path: Path) -> None:
    with browser_tab(chromium, page_data(TWO), tmp_path / "p.html") as tab:
        for name in ("additive", "scaled_dot"):
            tab.locator(f'input[data-show="{name}"]').uncheck()
        assert "No model is shown" in tab.locator("#panels").inner_text()


def test_nine_models_show_four_side_by_side_and_the_boxes_choose(
    chromium: Any, tmp_path: Path
) -> None:
    """A comparison's page of 9 runs: the first four drawn, the count said, the other boxes
    waiting until one is unticked, then the one ticked drawn."""
    nine = [model(f"m{index}") for index in range(9)]
    with browser_tab(chromium, page_data(nine, sentences=1), tmp_path / "p.html") as tab:

        def drawn() -> list[str]:
            return tab.eval_on_selector_all(
                ".panel[data-model]:not([data-model=difference])",
                "nodes => nodes.map(n => n.dataset.model)",
            )

        assert drawn() == ["m0", "m1", "m2", "m3"]
        assert "4 of 9 shown" in tab.locator("#shown-count").inner_text()
        assert tab.locator('input[data-show="m5"]').is_disabled()
        tab.locator('input[data-show="m1"]').uncheck()
        assert (
            drawn() == ["m0", "m2", "m3"] and not tab.locator('input[data-show="m5"]').is_disabled()
        )
        tab.locator('input[data-show="m5"]').check()
        assert drawn() == ["m0", "m2", "m3", "m5"]
        assert tab.locator('input[data-show="m1"]').is_disabled()


def test_another_aligners_links_are_crosses_beside_the_gold_with_their_aer(
    chromium: Any, tmp_path: Path
) -> None:
    """explore --links: each link a cross in its cell, told apart from the gold's boxes, listed
    with its AER above the panels, hidden by its checkbox, and kept in the SVG export."""
    data = page_data(TWO, sentences=1, length=6)
    data["links_name"] = "eflomal"
    data["sentences"][0].update({"links": [[0, 0], [2, 1], [5, 5]], "links_aer": 0.4})
    with browser_tab(chromium, data, tmp_path / "p.html") as tab:
        crosses = tab.locator('.panel[data-model="additive"] svg.map g.other')
        assert crosses.count() == 3 and tab.locator("svg.map rect.sure").count() > 0
        # Link 2-1 (source 2, target 1) sits on row 1, column 2, as link 0-0 on row 0, column 0.
        for index, (row, col) in enumerate([(0, 0), (1, 2)]):
            found = box(tab, f'.panel[data-model="additive"] svg.map g.other >> nth={index}')
            under = box(tab, cell("additive", row, col))
            assert found["x"] + found["width"] / 2 == pytest.approx(
                under["x"] + under["width"] / 2, abs=0.5
            )
            assert found["y"] + found["height"] / 2 == pytest.approx(
                under["y"] + under["height"] / 2, abs=0.5
            )
        text = tab.locator("#source .links").inner_text()
        assert "eflomal links (×): 0-0 2-1 5-5 · AER 0.400" in text
        tab.locator("#links").uncheck()
        assert tab.locator("svg.map g.other").count() == 0
        tab.locator("#links").check()
        with tab.expect_download() as download:
            tab.locator("#download-svg").click()
        exported = Path(download.value.path()).read_text()
        assert exported.count('class="other"') == 6  # three crosses in each of two maps
