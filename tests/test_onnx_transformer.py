"""The Transformer in ONNX (seq2seq/inference/onnx_transformer.py): for every scoring function,
ONNX Runtime's encoder and decoder steps give PyTorch's numbers, and our greedy and beam search
over them give PyTorch's tokens, scores and attention; the Translator's onnx backend and the
scripts take the exported bundle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seq2seq import Translator
from seq2seq.data.batching import pad
from seq2seq.data.tokenization import BOS_ID, EOS_ID, PAD_ID, encode_batch
from seq2seq.errors import ModelFileError
from seq2seq.inference.bundle import export_bundle, load
from seq2seq.inference.onnx_export import export_onnx
from seq2seq.inference.onnx_transformer import OnnxTransformer
from seq2seq.pipeline import train
from seq2seq.search import beam_search, greedy_search
from tests.configs import TINY_TRANSFORMER, compose_config, script_output
from tests.scoring import SCORING_FUNCTIONS

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
pytest.importorskip("onnxscript", reason="torch's ONNX exporter needs onnxscript (onnx extra)")

# Shapes unlike the export's example: one sentence, a padded batch, a longer one.
SENTENCES = [
    "the dog sees a cat .",
    "a small bird sings .",
    "the old man walks to the big house with the dog .",
    "cat",
    "the child eats .",
]


# Additive scoring (which only this backend can serve) runs in the default suite; each export
# takes some 15 s, so the others run with the slow tests.
@pytest.fixture(
    scope="module",
    params=[
        pytest.param(name, marks=[] if name == "additive" else [pytest.mark.slow])
        for name in SCORING_FUNCTIONS
    ],
)
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle of a Transformer with two layers on each side (one epoch of the toy task, so its
    outputs are words, not noise) and its ONNX graphs."""
    run_dir = tmp_path_factory.mktemp(f"transformer_{request.param}")
    overrides = [
        "data.train_size=600", "data.val_size=20", "data.test_size=20", "data.batch_size=32",
        "trainer.enable_progress_bar=false", *TINY_TRANSFORMER,
        "model.encoder_layers=2", "model.decoder_layers=2",
        f"attention={request.param}", "trainer.max_epochs=1", "logger=csv",
        "test_after_training=false", f"run_dir={run_dir}",
    ]  # fmt: skip
    result = train(compose_config(overrides))
    trained = load(result["best_checkpoint"])
    bundle = export_bundle(trained, run_dir / "bundle")
    export_onnx(trained.model, bundle)
    return bundle


def batch(translator: Translator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = encode_batch(translator.src_tokenizer, SENTENCES)
    return pad(ids), torch.tensor([len(sentence) for sentence in ids])


def test_every_step_gives_pytorchs_logits_weights_and_cache(exported: Path) -> None:
    translator = Translator.load(exported)
    model = translator.model
    onnx = OnnxTransformer(exported, translator.max_len_a, translator.max_len_b)
    src, src_lens = batch(translator)
    with torch.no_grad():
        source, state = model.encode(src, src_lens)
        onnx_source, onnx_state = onnx.encode(src, src_lens)
        assert torch.allclose(onnx_source.memory, source.memory, atol=1e-5)
        for ours, theirs in zip(onnx_source.cross_keys, source.cross_keys, strict=True):
            assert torch.allclose(ours, theirs, atol=1e-5)
        tokens = torch.full((len(SENTENCES),), BOS_ID)
        for step in range(8):  # teacher-forced on PyTorch's own choices
            logits, state, weights = model.decode_step(tokens, state, source)
            onnx_logits, onnx_state, onnx_weights = onnx.decode_step(
                tokens, onnx_state, onnx_source
            )
            assert (onnx_logits - logits).abs().max() < 1e-4, step
            assert (onnx_weights - weights).abs().max() < 1e-5, step
            # The static cache holds the growing cache in its first step + 1 slots, zeros after.
            # PyTorch's state is (keys, values) layer by layer; the graph's all keys, all values.
            layers = len(state) // 2
            static_cache = onnx_state[1:]
            reordered = [static_cache[i // 2 + (i % 2) * layers] for i in range(2 * layers)]
            for grown, static in zip(state, reordered, strict=True):
                assert torch.allclose(static[:, :, : step + 1], grown, atol=1e-5)
                assert not static[:, :, step + 1 :].any()
            tokens = logits.argmax(-1)


def test_greedy_and_beam_search_give_pytorchs_tokens_scores_and_attention(exported: Path) -> None:
    translator = Translator.load(exported)
    onnx = OnnxTransformer(exported, translator.max_len_a, translator.max_len_b)
    src, src_lens = batch(translator)
    ids = (BOS_ID, EOS_ID, PAD_ID)
    with torch.no_grad():
        ours, theirs = (
            greedy_search(onnx, src, src_lens, *ids),
            greedy_search(translator.model, src, src_lens, *ids),
        )
        assert torch.equal(ours.tokens, theirs.tokens)
        assert torch.allclose(ours.attention, theirs.attention, atol=1e-5)
        for alpha in [0.0, 0.6]:
            ours_beam = beam_search(
                onnx, src, src_lens, *ids, beam_size=4, length_penalty=alpha, n_best=3
            )
            theirs_beam = beam_search(
                translator.model, src, src_lens, *ids, beam_size=4, length_penalty=alpha, n_best=3
            )
            assert torch.equal(ours_beam.tokens, theirs_beam.tokens)
            assert torch.allclose(ours_beam.scores, theirs_beam.scores, atol=1e-4)


def test_the_translators_onnx_backend_translates_as_pytorch_does(exported: Path) -> None:
    torch_translator, onnx_translator = (
        Translator.load(exported),
        Translator.load(exported, backend="onnx"),
    )
    assert onnx_translator.backend == "onnx"
    for beam_size in [1, 5]:
        assert onnx_translator.translate(
            SENTENCES, beam_size=beam_size
        ) == torch_translator.translate(SENTENCES, beam_size=beam_size)


def test_the_onnx_backend_needs_the_graphs(exported: Path, tmp_path: Path) -> None:
    plain = export_bundle(load(exported), tmp_path / "plain")
    with pytest.raises(ModelFileError, match="exported with --onnx"):
        Translator.load(plain, backend="onnx")
    with pytest.raises(ModelFileError, match="backend must be one of torch, onnx"):
        Translator.load(exported, backend="tensorrt")


@pytest.mark.slow  # the scripts end to end; the Translator's backend is tested by default
def test_the_scripts_take_the_onnx_backend(exported: Path, tmp_path: Path) -> None:
    """export.py --onnx wrote ``exported``'s graphs (the fixture uses its function); translate.py
    and evaluate.py with --backend onnx give what they give with PyTorch."""
    source = tmp_path / "source.txt"
    source.write_text("\n".join(SENTENCES) + "\n")

    translate = ["scripts/translate.py", "--model", str(exported), "--input", str(source)]
    assert script_output(*translate, "--backend", "onnx") == script_output(*translate)
    evaluate = ["scripts/evaluate.py", "--model", str(exported), "--src", str(source)]
    evaluate += ["--ref", str(source), "--beam-size", "3", "--json"]
    onnx_score = json.loads(script_output(*evaluate, "--backend", "onnx"))["score"]
    assert onnx_score == json.loads(script_output(*evaluate))["score"]


def test_the_server_serves_the_onnx_backend(exported: Path, tmp_path: Path) -> None:
    from tests.test_server import start_server, stop

    server = start_server([f"--model=m={exported}", "--backend", "onnx"], tmp_path / "log")
    try:
        assert server.request("GET", "/models")[1]["models"][0]["backend"] == "onnx"
        status, answer = server.translate({"src": SENTENCES, "beam_size": 4})
        assert status == 200
        expected = Translator.load(exported).translate(SENTENCES, beam_size=4)
        assert [result["tgt"] for result in answer["results"]] == expected
    finally:
        assert stop(server) == 0
