"""The attention's parts from the command line to the files: each switch trains, validates,
decodes (greedy and beam 5) and exports a bundle that translates as its checkpoint does; a
sparsemax model's weights are the closed form of its own logits, with exact zeros at real keys;
the keys travel in checkpoints and bundles, a resume that changes them is refused, a user's
normalizer plugs in behind the trust rules, and bad values are one paragraph."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from seq2seq import Translator
from seq2seq.analysis.diagnostics import teacher_forced_queries
from seq2seq.attention import AdditiveAttention
from seq2seq.data.batching import pad
from seq2seq.data.tokenization import BOS_ID, encode_batch
from seq2seq.data.toy import ToyTranslation
from seq2seq.errors import ConfigError
from seq2seq.inference.bundle import PluginError, export_bundle, load
from seq2seq.pipeline import train
from tests.configs import TINY, TINY_TRANSFORMER, compose_config
from tests.test_normalizers import sparsemax_by_hand

SENTENCES = [e.src for e in ToyTranslation(train_size=10).splits()["test"][:12]]

# The acceptance commands, one tiny run each (three in the slow set).
SWITCHES = {
    "sparsemax": ["attention.normalizer=sparsemax"],
    "entmax15": ["attention.normalizer=entmax15"],
    "local_p": ["attention.window=local_p", "attention.window_size=3"],
    "key_bias": ["attention.key_bias=true"],
    "transformer entmax15": [*TINY_TRANSFORMER, "attention.normalizer=entmax15"],
}
DEFAULT_SUITE = ("sparsemax", "local_p")


def tiny_run(run_dir: Path, overrides: list[str]) -> dict:
    """``TINY`` with ``overrides``; a Transformer (``TINY_TRANSFORMER``) without the RNN sizes."""
    base = TINY
    if "model=transformer" in overrides:
        base = [override for override in TINY if not override.startswith("model.")]
    return train(compose_config([f"run_dir={run_dir}", *base, "logger=csv", *overrides]))


@pytest.mark.parametrize(
    "switch",
    [
        pytest.param(name, marks=[] if name in DEFAULT_SUITE else [pytest.mark.slow])
        for name in SWITCHES
    ],
)
def test_a_switch_trains_decodes_and_exports_a_bundle_that_translates_as_its_checkpoint(
    switch: str, tmp_path: Path
) -> None:
    result = tiny_run(tmp_path / "run", SWITCHES[switch])
    checkpoint = Path(result["best_checkpoint"])
    trained = load(checkpoint)
    parts = trained.model_config["attention_parts"]
    for override in SWITCHES[switch]:
        key, _, value = override.partition("=")
        if key.startswith("attention."):
            assert str(parts[key.removeprefix("attention.")]).lower() == value
    bundle = export_bundle(trained, tmp_path / "bundle")
    assert json.loads((bundle / "config.json").read_text())["model"]["attention_parts"] == parts
    assert_bundle_translates_as_checkpoint(checkpoint, bundle)


def assert_bundle_translates_as_checkpoint(checkpoint: Path, bundle: Path) -> None:
    """Greedy and beam-5 translations of ``SENTENCES``, and their attention, are the same."""
    from_checkpoint, from_bundle = Translator.load(checkpoint), Translator.load(bundle)
    for beam_size in (1, 5):
        expected = from_checkpoint.translate_detailed(SENTENCES, beam_size, with_attention=True)
        got = from_bundle.translate_detailed(SENTENCES, beam_size, with_attention=True)
        assert [t.text for t in got] == [t.text for t in expected]
        for ours, theirs in zip(got, expected, strict=True):
            assert torch.equal(ours.attention, theirs.attention)


@pytest.fixture(scope="module")
def sparsemax_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("sparsemax")
    return Path(tiny_run(run_dir, ["attention.normalizer=sparsemax"])["best_checkpoint"])


def test_a_sparsemax_models_weights_are_the_closed_form_of_its_own_logits(
    sparsemax_model: Path,
) -> None:
    trained = load(sparsemax_model)
    model = trained.model.eval()
    attention = model.decoder.attention
    assert isinstance(attention, AdditiveAttention)
    pairs = ToyTranslation(train_size=10).splits()["test"][:16]
    src_ids = encode_batch(trained.src_tokenizer, [e.src for e in pairs])
    tgt_ids = encode_batch(trained.tgt_tokenizer, [e.tgt for e in pairs])
    src, src_lens = pad(src_ids), torch.tensor([len(ids) for ids in src_ids])
    tgt_in = pad([[BOS_ID, *ids] for ids in tgt_ids])
    with torch.no_grad():
        _, weights = model(src, src_lens, tgt_in)  # (B, T, S)
        queries, _ = teacher_forced_queries(model, src, src_lens, tgt_in)  # (B, T, H)
        memory, _ = model.encoder(src, src_lens)  # (B, S, M)
        # Bahdanau's score, by hand: w_vᵀ tanh(W_q q + W_k k).
        hidden = attention.W_q(queries)[:, :, None, :] + attention.W_k(memory)[:, None, :, :]
        logits = attention.w_v(torch.tanh(hidden)).squeeze(-1)  # (B, T, S)
    assert weights is not None
    real_zeros = 0
    for b, (source, target) in enumerate(zip(src_ids, tgt_ids, strict=True)):
        for t in range(len(target) + 1):
            expected = sparsemax_by_hand(logits[b, t, : len(source)].double().tolist())
            assert weights[b, t, : len(source)].tolist() == pytest.approx(expected, abs=1e-5)
            assert (weights[b, t, len(source) :] == 0).all()
            real_zeros += int((weights[b, t, : len(source)] == 0).sum())
    assert real_zeros > 0, "a trained sparsemax model leaves real source words at exactly 0"


def test_the_server_returns_the_exact_zeros(sparsemax_model: Path) -> None:
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient

    from seq2seq.serving.server import ModelSource, create_app

    app = create_app([ModelSource("sparse", sparsemax_model)])
    with TestClient(app) as client:
        deadline = time.monotonic() + 60
        while client.get("/health").status_code != 200:  # the model loads in a worker thread
            assert time.monotonic() < deadline
            time.sleep(0.05)
        response = client.post("/translate", json={"src": SENTENCES[:3], "return_attention": True})
        [described] = client.get("/models").json()["models"]
    assert (described["normalizer"], described["window"]) == ("sparsemax", "global")
    assert response.status_code == 200, response.text
    rows = [row for r in response.json()["results"] for row in r["attention"]["weights"]]
    assert any(weight == 0.0 for row in rows for weight in row)
    assert all(abs(sum(row) - 1) < 1e-5 for row in rows)


def test_resuming_with_another_normalizer_or_window_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    tiny_run(run_dir, ["attention.normalizer=sparsemax", "trainer.max_epochs=1"])
    last = run_dir / "checkpoints" / "last.ckpt"
    for changed, named in [
        (["attention.normalizer=softmax"], "attention.normalizer: 'sparsemax' in the run"),
        (
            ["attention.normalizer=sparsemax", "attention.window=local_m"],
            "attention.window: 'global' in the run, 'local_m' now",
        ),
    ]:
        with pytest.raises(ConfigError, match=named):
            tiny_run(run_dir, [*changed, "trainer.max_epochs=2", f"ckpt_path={last}"])


def cube_then_normalize(logits: torch.Tensor, is_valid: torch.Tensor | None) -> torch.Tensor:
    """A user's normalizer: weights ∝ max(z - max z + 1, 0)³ over the valid keys."""
    shifted = logits - logits.masked_fill(~is_valid, -1e9).amax(-1, keepdim=True) + 1
    cubed = shifted.clamp(min=0).pow(3) * is_valid
    return cubed / cubed.sum(-1, keepdim=True).clamp(min=1e-12)


def test_a_users_normalizer_trains_and_loads_only_where_trusted(tmp_path: Path) -> None:
    target = f"{__name__}.cube_then_normalize"
    result = tiny_run(
        tmp_path / "run",
        [f"attention.normalizer={{_target_: {target}, _partial_: true}}", "trainer.max_epochs=1"],
    )
    checkpoint = Path(result["best_checkpoint"])
    with pytest.raises(PluginError, match=f"pass --trust-module {__name__}"):
        load(checkpoint)
    translator = Translator.load(checkpoint, trust_modules=[__name__])
    normalization = translator.model.decoder.attention.normalization
    assert normalization is not None
    assert normalization.normalizer.function.func is cube_then_normalize
    [translation] = translator.translate_detailed(SENTENCES[:1], with_attention=True)
    assert translation.attention is not None
    torch.testing.assert_close(
        translation.attention.sum(-1), torch.ones(len(translation.attention))
    )


def test_a_transformer_refuses_a_window_or_a_key_bias(tmp_path: Path) -> None:
    for index, (override, named) in enumerate(
        [
            (
                "attention.window=local_m",
                "model=transformer does not take attention.window=local_m",
            ),
            ("attention.key_bias=true", "model=transformer does not take attention.key_bias=true"),
        ]
    ):
        with pytest.raises(ConfigError, match=named):
            tiny_run(tmp_path / str(index), [*TINY_TRANSFORMER, override])
