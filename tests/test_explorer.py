"""The attention explorer: its data against the Translator and alignment.py's AER, a page that
fetches nothing, scripts/explore.py's checks, and (where Chromium is installed) the page itself
in a real browser with every network request blocked."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from seq2seq import Translator
from seq2seq.analysis.alignment import (
    GoldAlignment,
    argmax_links,
    count_links,
    parse_pharaoh,
    read_pharaoh,
)
from seq2seq.data.tokenization import encode_batch
from seq2seq.explorer import ExplorerModel, explorer_data, write_page
from seq2seq.explorer.data import SPREAD, attention_map, model_label, score_spread, scoring_name
from seq2seq.explorer.page import page, read_page
from seq2seq.inference.bundle import TrainedModel, build_model, export_bundle, load
from seq2seq.models.transformer import TransformerEncoder, embed
from seq2seq.pipeline import train
from tests.configs import ROOT, TINY, TINY_TRANSFORMER, compose_config, write_toy_files
from tests.explorer_pages import browser_tab, chromium, needs_chromium

__all__ = ["chromium"]  # the fixture, imported for the browser tests

DATA = ["data.train_size=600", "data.val_size=20", "data.test_size=20", "data.batch_size=32"]


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_toy_files(tmp_path_factory.mktemp("toy"), train=600, val=20, test=20)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A GRU with additive attention and a Transformer with two decoder layers, one epoch of the
    toy task."""
    made = {}
    for name, overrides in [
        ("additive", TINY),
        ("transformer", [*DATA, *TINY_TRANSFORMER, "model.decoder_layers=2"]),
    ]:
        run_dir = tmp_path_factory.mktemp(name)
        common = ["logger=csv", "test_after_training=false", "trainer.enable_progress_bar=false"]
        common += ["trainer.max_epochs=1", f"run_dir={run_dir}"]
        result = train(compose_config([*overrides, *common]))
        made[name] = export_bundle(load(result["best_checkpoint"]), run_dir / "bundle")
    return made


@pytest.fixture(scope="module")
def data(bundles: dict[str, Path], toy: Path) -> dict[str, Any]:
    models = [ExplorerModel(name, Translator.load(path)) for name, path in bundles.items()]
    sources = (toy / "test.src").read_text().splitlines()[:6]
    references = (toy / "test.tgt").read_text().splitlines()[:6]
    gold = read_pharaoh(toy / "test.align")[:6]
    return explorer_data(models, sources, references, gold, beam_size=3, n_best=2)


def test_the_maps_are_the_translators_and_their_aer_alignment_pys(
    data: dict[str, Any], bundles: dict[str, Path], toy: Path
) -> None:
    sources = (toy / "test.src").read_text().splitlines()[:6]
    references = (toy / "test.tgt").read_text().splitlines()[:6]
    gold = read_pharaoh(toy / "test.align")[:6]
    for name, path in bundles.items():
        translator = Translator.load(path)
        forced = translator.force_decode(sources, references)
        decoded = translator.translate_detailed(sources, beam_size=3, with_attention=True, n_best=2)
        for sentence, pair, translation, links in zip(
            data["sentences"], forced, decoded, gold, strict=True
        ):
            view = sentence["models"][name]
            assert view["forced_on"] == "reference"
            assert view["tgt_tokens"] == pair.tgt_tokens and view["src_tokens"] == pair.src_tokens
            assert pair.attention is not None
            weights = torch.tensor(view["forced"]["weights"])
            assert torch.allclose(weights, pair.attention, atol=1e-4)
            words = len(pair.src_tokens or []), len(pair.tgt_tokens or [])
            expected = count_links(argmax_links(pair.attention, *words), links).aer
            assert view["forced"]["aer"] == pytest.approx(expected, abs=1e-4)
            rows = pair.attention.clamp_min(1e-12)
            entropy = -(pair.attention * rows.log()).sum(-1)
            assert view["forced"]["entropy"] == pytest.approx(entropy.tolist(), abs=1e-3)
            assert view["hypothesis"] == translation.text
            assert [entry["text"] for entry in view["n_best"]] == [
                t for t, _ in translation.n_best or []
            ]
            assert sentence["gold"]["sure"] == sorted([i, j] for i, j in links.sure)
    transformer = data["sentences"][0]["models"]["transformer"]
    heads = Translator.load(bundles["transformer"]).attention_heads(
        data["sentences"][0]["src"], transformer["tgt_tokens"]
    )
    assert heads is not None and len(transformer["heads"]) == heads.shape[0] == 2
    for layer, expected_layer in zip(transformer["heads"], heads, strict=True):
        for head, expected_head in zip(layer, expected_layer, strict=True):
            assert torch.allclose(torch.tensor(head["weights"]), expected_head, atol=1e-4)
    assert [m["layers"] for m in data["models"]] == [None, 2]
    # Encoder self-attention: what the encoder's own layers return, layer by layer.
    translator = Translator.load(bundles["transformer"])
    encoder = translator.model.encoder
    assert isinstance(encoder, TransformerEncoder)
    [src_ids] = encode_batch(translator.src_tokenizer, [data["sentences"][0]["src"]])
    src, src_lens = torch.tensor([src_ids]), torch.tensor([len(src_ids)])
    with torch.no_grad():
        x = embed(encoder.embedding, src, 0, encoder.dropout)
        for layer, shown in zip(encoder.layers, transformer["encoder_self"], strict=True):
            x, weights = layer(x, src_lens)  # (1, h, S, S)
            for head, expected_head in zip(shown, weights[0], strict=True):
                assert torch.allclose(torch.tensor(head["weights"]), expected_head, atol=1e-4)
    # Decoder self-attention: causal, one row per target token over <bos> t1 .. t(T-1).
    steps = len(transformer["tgt_tokens"])
    assert transformer["decoder_inputs"] == ["<bos>", *transformer["tgt_tokens"][: steps - 1]]
    for layer in transformer["decoder_self"]:
        for head in layer:
            weights = torch.tensor(head["weights"])
            assert weights.shape == (steps, steps)
            assert torch.allclose(weights.sum(-1), torch.ones(steps), atol=1e-3)
            assert not weights.triu(diagonal=1).any()  # nothing read from the future
    assert "encoder_self" not in data["sentences"][0]["models"]["additive"]


def test_a_models_maps_carry_their_coverage_the_running_sum_of_their_weights(
    data: dict[str, Any],
) -> None:
    """Row t is what steps 0..t gave each source word, summed before rounding: the last row is
    the total that over- and under-translation are read from."""
    torch.manual_seed(0)
    weights = torch.rand(5, 4).softmax(-1)  # (T, S)
    coverage = attention_map(weights, None, coverage=True)["coverage"]
    for t in range(5):
        expected = weights[: t + 1].double().sum(0)
        assert coverage[t] == pytest.approx(expected.tolist(), abs=1e-4)
    assert attention_map(torch.zeros(0, 3), None, coverage=True)["coverage"] == []
    view = data["sentences"][0]["models"]["transformer"]
    for shown in (view["forced"], view["hyp_attention"]):
        summed = torch.tensor(shown["weights"]).double().cumsum(0)
        assert torch.allclose(torch.tensor(shown["coverage"]).double(), summed, atol=1e-3)
    assert "coverage" not in view["heads"][0][0] and "coverage" not in view["encoder_self"][0][0]


def test_the_score_spread_is_the_scores_minus_their_row_means() -> None:
    """Softmax forgets each row's mean score; the page's histogram recovers the rest exactly."""
    scores = torch.tensor([[0.0, 1.0, 3.0, -2.5], [4.0, 4.0, 4.0, 4.0], [-9.5, 2.0, 0.5, 1.0]])
    spread = score_spread(torch.softmax(scores, dim=-1))
    centered = (scores - scores.mean(dim=-1, keepdim=True)).flatten()
    expected = torch.bincount(centered.floor().long() + SPREAD, minlength=2 * SPREAD)
    assert spread["counts"] == expected.tolist() and spread["low"] == -SPREAD
    assert spread["std"] == pytest.approx(float(centered.std()), abs=1e-3)
    # Causal: the masked future is no score; each row's mean is over what it reads.
    causal = torch.ones(3, 3, dtype=torch.bool).tril()
    masked = torch.softmax(scores[:, :3].masked_fill(~causal, float("-inf")), dim=-1)
    spread = score_spread(masked, causal)
    rows = [scores[t, : t + 1] - scores[t, : t + 1].mean() for t in range(3)]
    expected = torch.bincount(torch.cat(rows).floor().long() + SPREAD, minlength=2 * SPREAD)
    assert spread["counts"] == expected.tolist()


def test_the_page_holds_its_data_and_fetches_nothing(data: dict[str, Any], tmp_path: Path) -> None:
    hostile = {**data, "title": "</script><script>alert(1)</script>"}
    text = write_page(hostile, tmp_path / "page.html").read_text()
    assert "http://" not in text and "https://" not in text and "//cdn" not in text
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", text)
    # url(#id) names a pattern in the page itself (the hatching of exact zeros): nothing fetched.
    assert "@import" not in text and not re.search(r"url\((?!#)", text)
    embedded = text.split('<script type="application/json" id="data">')[1].split("</script>")[0]
    # Weights travel as integers in units of 1e-4, and read back exactly; "</" escaped, not lost.
    forced = json.loads(embedded)["sentences"][0]["models"]["additive"]["forced"]
    assert all(isinstance(w, int) for row in forced["weights"] for w in row)
    assert read_page(text) == json.loads(json.dumps(hostile))
    assert text.count("</script>") == 2  # the data's and the code's: nothing else ends them
    assert page(data).startswith("<!DOCTYPE html>")


def test_explore_py_writes_the_page_and_refuses_bad_input(
    bundles: dict[str, Path], toy: Path, tmp_path: Path
) -> None:
    def explore(*arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "scripts/explore.py", *arguments], cwd=ROOT, capture_output=True,
            text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip

    files = ["--src", str(toy / "test.src"), "--ref", str(toy / "test.tgt")]
    out = tmp_path / "explore.html"
    both = ["--model", f"a={bundles['additive']}", "--model", f"t={bundles['transformer']}"]
    align = ["--align", str(toy / "test.align"), "--lines", "2-4,7"]
    completed = explore(*both, *files, *align, "--out", str(out))
    assert completed.returncode == 0, completed.stderr[-3000:]
    written = read_page(out.read_text())
    assert [s["src"] for s in written["sentences"]] == [
        (toy / "test.src").read_text().splitlines()[i] for i in (1, 2, 3, 6)
    ]
    short = tmp_path / "short.tgt"
    short.write_text("one line\n")
    for arguments, message in [
        (["--lines", "0-3", *files], "--lines '0-3': 0-3 is not within lines 1 to 20"),
        (["--lines", "a", *files], "want numbers from 1"),
        (["--lines", "5-3", *files], "5-3 runs backwards; write 3-5"),
        ([], "no sentences: give them with --src FILE"),
        (["--src", str(toy / "test.src"), "--sentence", "w1"], "not both"),
        (["--src", str(toy / "test.src"), "--ref", str(short)], "must be line-parallel"),
        (["--src", str(toy / "test.src"), "--align", str(toy / "test.align")], "give --ref too"),
        (["--sentence", "w1", "--model", f"text={toy / 'test.src'}"], "not a readable checkpoint"),
        (
            ["--sentence", "w1", "--beam-size", "2", "--n-best", "3"],
            "--n-best 3 needs --beam-size 3",
        ),
        (
            ["--sentence", "w1", *[f"--model=m{i}={bundles['additive']}" for i in range(16)]],
            "a page holds at most 16 models (4 side by side, chosen by its checkboxes), got 17",
        ),
    ]:
        completed = explore("--model", str(bundles["additive"]), *arguments, "--out", str(out))
        assert completed.returncode == 2, (arguments, completed.stderr[-2000:])
        assert message in completed.stderr and "Traceback" not in completed.stderr


@needs_chromium
def test_the_page_in_a_browser_links_hover_across_panels_and_switches_heads(
    chromium: Any, data: dict[str, Any], tmp_path: Path
) -> None:
    with browser_tab(chromium, data, tmp_path / "page.html", width=1280, height=720) as tab:
        panels = tab.locator("#panels .panel")
        # Two models and their difference (both teacher-forced on the same reference tokens).
        assert panels.count() == 3
        # Hover the second target token of the first panel: row 1 lights up in every map.
        tab.locator('.panel[data-model="additive"] text.token.row[data-row="1"]').hover()
        assert tab.evaluate("document.body.dataset.row") == "1"
        # In each model's map, the source token that target token reads most is marked.
        for name in ["additive", "transformer"]:
            view = data["sentences"][0]["models"][name]
            heaviest = max(
                range(len(view["src_tokens"])), key=view["forced"]["weights"][1].__getitem__
            )
            read = tab.locator(f'.panel[data-model="{name}"] text.token.col.read')
            assert read.count() >= 1
            assert str(heaviest) in [
                read.nth(i).get_attribute("data-col") for i in range(read.count())
            ]
        for name in ["additive", "transformer", "difference"]:
            band = tab.locator(f'.panel[data-model="{name}"] rect[data-band="row"]')
            assert float(band.get_attribute("height") or 0) > 0, name
        # A source token: its column in every panel.
        tab.locator('.panel[data-model="transformer"] text.token.col[data-col="0"]').hover()
        assert tab.evaluate("document.body.dataset.col") == "0"
        # The Transformer's thumbnails: click layer 1, head 2; the selectors follow.
        tab.locator(
            '.panel[data-model="transformer"] .thumb[data-layer="0"][data-head="1"]'
        ).click()
        assert (
            tab.locator("#layer").input_value() == "0" and tab.locator("#head").input_value() == "1"
        )
        # The encoder's self-attention (source tokens both ways) and the score spread; its one
        # layer, then a second it does not have.
        tab.select_option("#map", "encoder")
        tab.select_option("#layer", "0")
        encoder_map = tab.locator('.panel[data-model="transformer"] svg.map')
        assert (
            encoder_map.locator("text.token.row").count()
            == encoder_map.locator("text.token.col").count()
        )
        assert tab.locator('.panel[data-model="transformer"] figure.spread').count() == 1
        tab.select_option("#layer", "1")
        assert (
            "no layer 2 in this model"
            in tab.locator('.panel[data-model="transformer"]').inner_text()
        )
        tab.select_option("#map", "forced")
        # Another sentence, the decoding map, the gold links off: still drawn, no error.
        tab.select_option("#sentence", "3")
        tab.select_option("#map", "decoding")
        tab.locator("#gold").uncheck()
        # (A barely trained model may say nothing for a sentence: its panel says so instead.)
        assert tab.locator("#panels .panel").count() >= 2
        assert tab.locator("#panels svg.map").count() >= 1
        with tab.expect_download() as svg_download:
            tab.locator("#download-svg").click()
        assert svg_download.value.suggested_filename == "attention-4.svg"
        svg_text = Path(svg_download.value.path()).read_text()
        assert svg_text.startswith("<svg") and "<rect" in svg_text
        with tab.expect_download() as png_download:
            tab.locator("#download-png").click()
        assert png_download.value.suggested_filename == "attention-4.png"
        assert Path(png_download.value.path()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_translate_py_writes_the_page_for_its_input(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "attention.html"
    completed = subprocess.run(
        [sys.executable, "scripts/translate.py", "--model", str(bundles["transformer"]),
         "--attention-html", str(out)],
        input="the dog sees a cat .\n\na small bird sings .\n", cwd=ROOT, capture_output=True,
        text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.count("\n") == 3  # the translations still go to stdout, blank kept
    written = read_page(out.read_text())
    assert [s["src"] for s in written["sentences"]] == [
        "the dog sees a cat .",
        "a small bird sings .",
    ]
    # Named after the run that holds the bundle, not "bundle" nor an absolute path.
    name = bundles["transformer"].parent.name
    assert written["title"] == f"Attention: {name}" and written["models"][0]["name"] == name
    view = written["sentences"][0]["models"][name]
    [expected] = Translator.load(bundles["transformer"]).translate_detailed(
        ["the dog sees a cat ."], with_attention=True
    )
    assert expected.attention is not None and view["hypothesis"] == expected.text
    assert torch.allclose(
        torch.tensor(view["hyp_attention"]["weights"]), expected.attention, atol=1e-4
    )
    assert view["forced_on"] == "hypothesis" and "heads" in view


def test_training_writes_the_page_at_every_validation_with_a_checkpoint_slider(
    tmp_path: Path,
) -> None:
    overrides = [*TINY, "trainer.max_epochs=2", "logger=csv", "examples.num_samples=3"]
    train(compose_config([*overrides, "test_after_training=false", f"run_dir={tmp_path}"]))
    page = (tmp_path / "attention" / "explorer.html").read_text()
    assert "http://" not in page and "https://" not in page
    data = read_page(page)
    assert len(data["sentences"]) == 3 and len(data["checkpoints"]) == 1  # the first validation
    assert data["checkpoint"].startswith("step 38,")
    assert data["checkpoints"][0]["checkpoint"].startswith("step 19,")
    # The latest snapshot is the model of last.ckpt (written after that validation), on the
    # validation sentences teacher-forced on their references, with the toy task's gold links.
    translator = Translator.load(tmp_path / "checkpoints" / "last.ckpt")
    sentences = data["sentences"]
    forced = translator.force_decode([s["src"] for s in sentences], [s["ref"] for s in sentences])
    [name] = sentences[0]["models"]
    for sentence, pair in zip(sentences, forced, strict=True):
        assert pair.attention is not None and sentence["gold"]["sure"]
        weights = torch.tensor(sentence["models"][name]["forced"]["weights"])
        assert torch.allclose(weights, pair.attention, atol=1e-4)
        assert sentence["models"][name]["forced"]["aer"] is not None
    assert len(list((tmp_path / "attention").glob("explorer-step-*.json"))) == 2


@needs_chromium
def test_the_live_page_translates_what_is_typed(
    chromium: Any, bundles: dict[str, Path], tmp_path: Path
) -> None:
    """serve.py's page at /: a typed sentence comes back under both models; the page asks its
    own server and nothing else."""
    from tests.test_server import start_server, stop

    models = [f"--model={name}={path}" for name, path in bundles.items()]
    server = start_server(models, tmp_path / "log")
    origin = f"http://127.0.0.1:{server.port}/"
    elsewhere: list[str] = []
    errors: list[str] = []
    try:
        with contextlib.closing(chromium.new_page()) as tab:

            def only_the_server(route: Any) -> None:
                if route.request.url.startswith(origin):
                    route.continue_()
                else:
                    elsewhere.append(route.request.url)
                    route.abort()

            tab.route("**/*", only_the_server)
            tab.on("pageerror", lambda error: errors.append(str(error)))
            tab.goto(origin)
            tab.fill("#live-src", "the dog sees a cat .")
            tab.click("#live-go")
            tab.wait_for_selector('.panel[data-model="transformer"] svg.map')
            # Two models; no difference map: each is teacher-forced on its own translation.
            assert tab.locator("#panels .panel").count() == 2
            expected = Translator.load(bundles["additive"]).translate(["the dog sees a cat ."])[0]
            hypothesis = tab.locator('.panel[data-model="additive"] .hyp').inner_text()
            assert hypothesis == f"→ {expected}"
    finally:
        assert stop(server) == 0
    assert errors == [] and elsewhere == []


@needs_chromium
def test_a_100_by_100_map_stays_usable(chromium: Any, tmp_path: Path) -> None:
    """A sentence of 100 tokens each side, one panel across the window: cells of at least 4 px,
    labels (every k-th when cells are small) 10 px apart or more, the hovered cell's tokens and
    weight in the readout, hover still linked."""
    size = 100
    weights = torch.softmax(torch.randn(size, size), dim=-1)
    view = {
        "hypothesis": " ".join(f"t{i}" for i in range(size)),
        "hyp_tokens": [f"t{i}" for i in range(size)],
        "hyp_attention": None,
        "score": None,
        "n_best": [],
        "src_tokens": [f"s{i}" for i in range(size)],
        "tgt_tokens": [f"t{i}" for i in range(size)],
        "forced_on": "hypothesis",
        "forced": attention_map(weights, None),
    }
    model = {"name": "m", "architecture": "Seq2Seq", "scoring": "DotProductAttention",
             "scaled": True, "layers": None, "heads": None, "backend": "torch"}  # fmt: skip
    data = {"title": "long", "models": [model], "beam_size": 1, "checkpoints": [], "version": 1,
            "sentences": [{"src": view["hypothesis"], "ref": None, "gold": None,
                           "models": {"m": view}}]}  # fmt: skip
    with browser_tab(chromium, data, tmp_path / "long.html", width=1280, height=720) as tab:
        cell = tab.locator('rect.cell[data-row="50"][data-col="50"]')
        size = int(cell.get_attribute("width") or 0)
        assert 4 <= size <= 14
        labels = tab.locator("svg.map text.token.row")
        assert labels.count() == (100 if size >= 11 else len(range(0, 100, -(-11 // size))))
        cell.hover()
        assert tab.locator("#readout").inner_text().startswith("m: t50 ← s50 = ")
        assert tab.evaluate("[document.body.dataset.row, document.body.dataset.col]") == [
            "50",
            "50",
        ]


@pytest.mark.parametrize("window", ["local_m", "local_p"])
def test_a_windowed_maps_window_is_where_its_weights_are_not_zero(
    bundles: dict[str, Path], window: str
) -> None:
    """The window the page draws, [round(p_t) - D, round(p_t) + D], is the model's: outside it
    every weight is exactly 0; local-m's centres are t (clipped to the sentence)."""
    trained = load(bundles["additive"])
    parts = {"_target_": "seq2seq.attention.AttentionParts", "window": window, "window_size": 1}
    config = {**trained.model_config, "attention_parts": parts}
    torch.manual_seed(0)
    windowed = TrainedModel(build_model(config).eval(), trained.src_tokenizer,
                            trained.tgt_tokenizer, config)  # fmt: skip
    model = ExplorerModel("windowed", Translator(windowed))
    data = explorer_data([model], ["w3 w14 w7 w2 w9"], ["w8 w1 w5 w6 w4 w11 w12"])
    forced = data["sentences"][0]["models"]["windowed"]["forced"]
    assert forced["window"]["size"] == 1 and data["models"][0]["window"] == window
    centres, weights = forced["window"]["centres"], torch.tensor(forced["weights"])
    rows, cols = weights.shape
    assert len(centres) == rows
    if window == "local_m":
        assert centres == [min(t, cols - 1) for t in range(rows)]
    for t, centre in enumerate(centres):
        outside = [s for s in range(cols) if abs(s - round(centre)) > 1]
        assert set(outside) <= set(forced["zeros"][t])
        assert (weights[t, [s for s in range(cols) if s not in outside]] > 0).all()


def test_models_are_named_as_the_config_and_the_files_name_them(tmp_path: Path) -> None:
    dot = {"_target_": "seq2seq.attention.DotProductAttention"}
    assert scoring_name({**dot, "scaled": True}) == "scaled_dot"
    assert scoring_name({**dot, "scaled": False}) == "dot"
    assert scoring_name({"_target_": "seq2seq.attention.AdditiveAttention"}) == "additive"
    assert scoring_name({"_target_": "mine.Bilinear"}) == "mine.Bilinear"
    run = tmp_path / "rnn_deen"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "best.ckpt").write_text("")
    (run / "bundle").mkdir()
    assert model_label(run / "bundle") == "rnn_deen"
    assert model_label(run / "checkpoints" / "best.ckpt") == "rnn_deen/best"
    assert model_label(run) == "rnn_deen"


def test_a_layers_average_is_its_heads_mean_with_its_own_aer(data: dict[str, Any]) -> None:
    view = data["sentences"][0]["models"]["transformer"]
    gold = data["sentences"][0]["gold"]
    links = GoldAlignment(frozenset(map(tuple, gold["sure"])),
                          frozenset(map(tuple, gold["sure"] + gold["possible"])))  # fmt: skip
    for layer, mean in zip(view["heads"], view["layer_means"], strict=True):
        expected = torch.tensor([head["weights"] for head in layer]).mean(0)
        assert torch.allclose(torch.tensor(mean["weights"]), expected, atol=2e-4)
        rows, cols = expected.shape
        aer = count_links(argmax_links(torch.tensor(mean["weights"]), cols, rows), links).aer
        assert mean["aer"] == pytest.approx(aer, abs=1e-4)
    assert torch.allclose(
        torch.tensor(view["layer_means"][-1]["weights"]),
        torch.tensor(view["forced"]["weights"]),
        atol=2e-4,
    )
    assert [m["attention"] for m in data["models"]] == ["additive", "scaled_dot"]


def test_explore_draws_another_aligners_links_with_their_aer(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """--links NAME=FILE: the page holds each chosen line's links and their AER against the
    gold; a link outside its sentence names the file and line, and --links needs --ref."""
    sources = ["the dog sees a cat .", "a red fox sleeps ."]
    references = ["kodan tula ka moto .", "nafo resi sulo ."]
    for name, lines in [
        ("s", sources), ("r", references), ("a", ["1-0 3-1 4-3", "2-0 1-1"]),
        ("l", ["1-0 2-2", "0-0 1-1 2-2"]),
    ]:  # fmt: skip
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    files = ["--src", tmp_path / "s", "--ref", tmp_path / "r", "--align", tmp_path / "a"]
    out = tmp_path / "page.html"
    completed = run_explore(
        "--model", tiny_checkpoint, *files, "--links", f"eflomal={tmp_path / 'l'}",
        "--lines", "2", "--out", out,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    data = read_page(out.read_text())
    assert data["links_name"] == "eflomal"
    [sentence] = data["sentences"]
    assert sentence["links"] == [[0, 0], [1, 1], [2, 2]]
    expected = count_links([(0, 0), (1, 1), (2, 2)], parse_pharaoh("2-0 1-1")).aer
    assert sentence["links_aer"] == pytest.approx(expected, abs=1e-3)
    (tmp_path / "bad").write_text("1-0\n9-9\n")
    bad = run_explore(
        "--model", tiny_checkpoint, *files, "--links", f"x={tmp_path / 'bad'}", "--out", out
    )
    assert bad.returncode == 2 and f"{tmp_path / 'bad'}:2: link 9-9 is outside" in bad.stderr
    no_ref = run_explore(
        "--model", tiny_checkpoint, "--src", tmp_path / "s", "--links", f"x={tmp_path / 'l'}",
        "--out", out,
    )  # fmt: skip
    assert no_ref.returncode == 2 and "--links links source words" in no_ref.stderr
    fresh = tmp_path / "refused.html"
    twice = run_explore(
        "--model", tiny_checkpoint, *files, "--links", f"a={tmp_path / 'l'}",
        "--links", f"b={tmp_path / 'l'}", "--out", fresh,
    )  # fmt: skip
    assert twice.returncode == 2 and "--links given 2 times" in twice.stderr
    beyond = run_explore(
        "--model", tiny_checkpoint, *files, "--links", f"x={tmp_path / 'bad'}", "--out", fresh
    )
    assert beyond.returncode == 2 and not fresh.exists()  # refused: no empty page left behind


def run_explore(*arguments: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/explore.py", *map(str, arguments)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
