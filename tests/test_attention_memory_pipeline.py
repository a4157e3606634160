"""Attention with memory from the command line to the files: an input-fed Luong decoder trains,
validates, decodes (greedy, beam 5, n-best 3) and exports a bundle that translates as its
checkpoint does; the switch travels in checkpoints and bundles, a resume that changes it is
refused, and a decoder without an attentional vector to feed says so in one paragraph."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seq2seq import Translator
from seq2seq.errors import ConfigError
from seq2seq.inference.bundle import export_bundle, load
from tests.test_attention_parts_pipeline import (
    SENTENCES,
    assert_bundle_translates_as_checkpoint,
    tiny_run,
)

INPUT_FEEDING = ["model.decoder=luong", "model.input_feeding=true"]


def test_an_input_fed_decoder_trains_decodes_and_exports_a_bundle(tmp_path: Path) -> None:
    result = tiny_run(tmp_path / "run", INPUT_FEEDING)
    checkpoint = Path(result["best_checkpoint"])
    trained = load(checkpoint)
    assert trained.model_config["input_feeding"] is True
    assert trained.model.decoder.cell.input_size == (
        trained.model.decoder.embedding_size + trained.model.decoder.cell.hidden_size
    )
    bundle = export_bundle(trained, tmp_path / "bundle")
    assert json.loads((bundle / "config.json").read_text())["model"]["input_feeding"] is True
    assert_bundle_translates_as_checkpoint(checkpoint, bundle)
    nbest = Translator.load(bundle).translate_detailed(SENTENCES[:4], 5, n_best=3)
    assert all(len(translation.n_best) == 3 for translation in nbest)

    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    with pytest.raises(ConfigError, match=r"model\.input_feeding: True in the run, False now"):
        tiny_run(tmp_path / "run", ["model.decoder=luong", f"ckpt_path={last}"])


def test_the_bahdanau_decoder_refuses_input_feeding_in_one_paragraph(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is for the Luong decoder") as refused:
        tiny_run(tmp_path / "run", ["model.input_feeding=true"])
    assert "\n" not in str(refused.value)
