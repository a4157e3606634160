"""CTranslate2 export (seq2seq/inference/ctranslate2_export.py): a Transformer with dot-product
scoring translates in CTranslate2 as in PyTorch (float32: greedy identical, beam identical with
α = 0, attention alike), int8 and int16 run, and what CTranslate2 cannot compute is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seq2seq import Translator
from seq2seq.errors import ConfigError, ModelFileError
from seq2seq.inference.bundle import export_bundle, load
from seq2seq.inference.ctranslate2_export import export_ctranslate2
from seq2seq.pipeline import train
from seq2seq.search import max_output_lengths
from tests.configs import ROOT, TINY_TRANSFORMER, compose_config, script_output

pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed")

SENTENCES = [
    "the dog sees a cat .",
    "a small bird sings .",
    "the old man walks to the big house with the dog .",
    "cat",
    "",
    "the child eats .",
]
DATA = ["data.train_size=600", "data.val_size=20", "data.test_size=20", "data.batch_size=32"]


def trained_transformer(run_dir: Path, attention: str) -> Path:
    """A bundle of a two-layer Transformer after one epoch of the toy task (its outputs are
    words, not noise), with ``attention`` in every head."""
    overrides = [
        *DATA, *TINY_TRANSFORMER, "model.encoder_layers=2", "model.decoder_layers=2",
        f"attention={attention}", "trainer.max_epochs=1", "logger=csv",
        "trainer.enable_progress_bar=false", "test_after_training=false", f"run_dir={run_dir}",
    ]  # fmt: skip
    result = train(compose_config(overrides))
    return export_bundle(load(result["best_checkpoint"]), run_dir / "bundle")


@pytest.fixture(scope="module", params=["scaled_dot", "dot", "general"])
def bundle(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    bundle = trained_transformer(tmp_path_factory.mktemp(request.param), request.param)
    export_ctranslate2(load(bundle), bundle, "float32")
    return bundle


def test_float32_greedy_and_beam_translate_as_pytorch(bundle: Path) -> None:
    pytorch, ct2 = Translator.load(bundle), Translator.load(bundle, backend="ctranslate2")
    assert ct2.backend == "ctranslate2"
    for beam_size in [1, 4]:
        expected = pytorch.translate(SENTENCES, beam_size=beam_size, length_penalty=0.0)
        assert ct2.translate(SENTENCES, beam_size=beam_size, length_penalty=0.0) == expected


def test_attention_and_n_best_are_pytorchs(bundle: Path) -> None:
    options = {"beam_size": 4, "length_penalty": 0.0, "n_best": 3, "with_attention": True}
    expected = Translator.load(bundle).translate_detailed(SENTENCES, **options)
    got = Translator.load(bundle, backend="ctranslate2").translate_detailed(SENTENCES, **options)
    for ours, theirs in zip(got, expected, strict=True):
        assert ours.tgt_tokens == theirs.tgt_tokens
        if theirs.attention is not None:
            assert ours.attention is not None
            assert torch.allclose(ours.attention, theirs.attention, atol=1e-5)
        assert [text for text, _ in ours.n_best or []] == [text for text, _ in theirs.n_best or []]
        # Each hypothesis with its own tokens and attention (what translate --alignment reads).
        for mine, reference in zip(ours.hypotheses or [], theirs.hypotheses or [], strict=True):
            assert (mine.text, mine.tgt_tokens) == (reference.text, reference.tgt_tokens)
            assert mine.attention is not None and reference.attention is not None
            assert torch.allclose(mine.attention, reference.attention, atol=1e-5)
        assert len(ours.hypotheses or []) == len(theirs.hypotheses or [])
        assert theirs.attention is None or len(theirs.hypotheses or []) == 3  # blank: none
        # CTranslate2's scores leave out the end token's log-probability (docs/serving.md):
        # close, for a model that is sure of its EOS, and never above ours by more than that.
        for (_, score), (_, reference) in zip(ours.n_best or [], theirs.n_best or [], strict=True):
            assert score == pytest.approx(reference, abs=0.5)


def test_a_coverage_penalty_is_refused_with_the_reason(bundle: Path, tmp_path: Path) -> None:
    ct2 = Translator.load(bundle, backend="ctranslate2")
    with pytest.raises(ValueError, match="the CTranslate2 backend cannot apply it"):
        ct2.translate(SENTENCES, beam_size=4, coverage_penalty=0.5)
    # The scripts refuse it in one paragraph, before loading the model.
    for script in ("scripts/translate.py", "scripts/evaluate.py"):
        (tmp_path / "s.txt").write_text("w1\n")
        files = ["--src", str(tmp_path / "s.txt"), "--ref", str(tmp_path / "s.txt")]
        extra = files if script.endswith("evaluate.py") else []
        completed = subprocess.run(
            [sys.executable, script, "--model", str(bundle), "--backend", "ctranslate2",
             "--beam-size", "3", "--coverage-penalty", "0.2", *extra],
            cwd=ROOT, capture_output=True, text=True, timeout=300, input="w1\n",
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert completed.returncode == 2 and "Traceback" not in completed.stderr, script
        assert "--coverage-penalty 0.2 with --backend ctranslate2" in completed.stderr


@pytest.mark.parametrize("quantization", ["int8", "int16"])
def test_quantized_models_translate(bundle: Path, tmp_path: Path, quantization: str) -> None:
    quantized = export_bundle(load(bundle), tmp_path / quantization)
    export_ctranslate2(load(bundle), quantized, quantization)
    outputs = Translator.load(quantized, backend="ctranslate2").translate(SENTENCES)
    assert len(outputs) == len(SENTENCES) and outputs[4] == ""
    assert all(outputs[i] for i in (0, 1, 2, 3, 5))


def test_additive_scoring_and_rnn_models_are_refused_with_the_reason(
    tmp_path: Path, tiny_checkpoint: Path
) -> None:
    additive = trained_transformer(tmp_path / "additive", "additive")
    with pytest.raises(ConfigError, match=r"only dot-product attention.*AdditiveAttention.*--onnx"):
        export_ctranslate2(load(additive), tmp_path / "out")
    with pytest.raises(ConfigError, match=r"CTranslate2 runs Transformers.*--onnx"):
        export_ctranslate2(load(tiny_checkpoint), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    completed = subprocess.run(
        [sys.executable, "scripts/export.py", "--checkpoint", str(tiny_checkpoint),
         "--out", str(tmp_path / "cli"), "--format", "ctranslate2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert completed.returncode == 2 and "Traceback" not in completed.stderr
    assert "CTranslate2 runs Transformers" in completed.stderr
    assert not (tmp_path / "cli").exists()  # refused before anything is written


def test_the_backend_needs_the_exported_model(bundle: Path, tmp_path: Path) -> None:
    plain = export_bundle(load(bundle), tmp_path / "plain")
    with pytest.raises(ModelFileError, match="--format ctranslate2"):
        Translator.load(plain, backend="ctranslate2")


@pytest.mark.slow  # the scripts end to end; the Translator's backend is tested by default
def test_export_py_and_the_scripts_take_the_ctranslate2_backend(tmp_path: Path) -> None:
    bundle = trained_transformer(tmp_path / "run", "scaled_dot")
    export_ctranslate2(load(bundle), bundle, "float32")
    source = tmp_path / "source.txt"
    source.write_text("\n".join(SENTENCES) + "\n")

    translate = ["scripts/translate.py", "--model", str(bundle), "--input", str(source)]
    assert script_output(*translate, "--backend", "ctranslate2") == script_output(*translate)
    out = tmp_path / "exported"
    script_output("scripts/export.py", "--checkpoint", str(bundle), "--out", str(out),
           "--format", "ctranslate2", "--quantization", "int8")  # fmt: skip
    assert json.loads((out / "ctranslate2" / "seq2seq.json").read_text())["quantization"] == "int8"
    lines = script_output("scripts/translate.py", "--model", str(out), "--input", str(source),
                   "--backend", "ctranslate2").splitlines()  # fmt: skip
    assert len(lines) == len(SENTENCES) and lines[4] == ""


def test_outputs_stop_at_our_length_limit(bundle: Path) -> None:
    """Outputs cut by a·S + b (EOS included) are cut alike: greedy takes a batch at its largest
    limit and cuts each output to its own, beam search runs one call per limit."""
    pytorch, ct2 = Translator.load(bundle), Translator.load(bundle, backend="ctranslate2")
    for translator in (pytorch, ct2):
        translator.max_len_a, translator.max_len_b = 0.5, 1  # S/2 + 1 tokens at most
    for beam_size in [1, 3]:
        expected = pytorch.translate(SENTENCES, beam_size=beam_size, length_penalty=0.0)
        assert ct2.translate(SENTENCES, beam_size=beam_size, length_penalty=0.0) == expected
    outputs = [len(text.split()) for text in pytorch.translate(SENTENCES)]
    sources = torch.tensor([len(sentence.split()) or 1 for sentence in SENTENCES])
    limits = max_output_lengths(sources, 0.5, 1).tolist()
    assert all(n <= limit for n, limit in zip(outputs, limits, strict=True))
    assert any(n == limit for n, limit in zip(outputs, limits, strict=True))  # the limits cut
