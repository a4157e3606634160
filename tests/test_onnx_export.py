"""ONNX export: onnxruntime matches eager PyTorch on real inputs of several shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from seq2seq.data.batching import pad
from seq2seq.data.tokenization import BOS_ID, EOS_ID, PAD_ID, encode_batch
from seq2seq.data.toy import ToyTranslation
from seq2seq.inference.bundle import build_model, load
from seq2seq.inference.onnx_export import export_onnx, onnx_greedy_search, run_session
from seq2seq.models.model import Seq2Seq
from seq2seq.search import greedy_search

ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")


def test_onnx_encoder_and_decoder_step_match_eager(tiny_checkpoint: Path, tmp_path: Path) -> None:
    trained = load(tiny_checkpoint)
    model = trained.model
    encoder_path, decoder_path = export_onnx(model, tmp_path)
    encoder = ort.InferenceSession(str(encoder_path))
    decoder_step = ort.InferenceSession(str(decoder_path))
    sentences = [example.src for example in ToyTranslation(train_size=10).splits()["test"]]
    worst = 0.0
    for batch_size, start in [(1, 0), (5, 10), (16, 100)]:  # shapes unlike the export example
        ids = encode_batch(trained.src_tokenizer, sentences[start : start + batch_size])
        src, src_lens = pad(ids), torch.tensor([len(seq) for seq in ids])
        with torch.no_grad():
            source, state = model.encode(src, src_lens)
            eager_encoder = [source.memory, source.keys, source.projected_keys, *state]
            onnx_encoder = encoder.run(None, {"src": src.numpy(), "src_lens": src_lens.numpy()})
            for ours, theirs in zip(onnx_encoder, eager_encoder, strict=True):
                worst = max(worst, float(np.abs(ours - theirs.numpy()).max()))
            prev = torch.full((batch_size,), BOS_ID)
            logits, _, weights = model.decode_step(prev, state, source)
            feeds = {
                "prev_tokens": prev.numpy(),
                "memory": onnx_encoder[0],
                "keys": onnx_encoder[1],
                "projected_keys": onnx_encoder[2],
                "src_lens": src_lens.numpy(),
                "state_h": onnx_encoder[3],
            }
            onnx_logits, onnx_weights, _ = run_session(decoder_step, feeds)
            worst = max(worst, float(np.abs(onnx_logits - logits.numpy()).max()))
            worst = max(worst, float(np.abs(onnx_weights - weights.numpy()).max()))

            assert_onnx_greedy_is_eager_greedy(encoder, decoder_step, model, src, src_lens)
    print(f"max |onnxruntime - eager| = {worst:.2e}")
    assert worst < 1e-4


def test_onnx_export_of_a_luong_decoder_matches_eager(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    # decode_step is the whole interface the exported graphs need, so the Luong decoder's exports
    # like the Bahdanau one; its teacher-forced parallel path is a training-time optimisation.
    trained = load(tiny_checkpoint)
    config = {
        **trained.model_config,
        "decoder": {"_target_": "seq2seq.models.LuongDecoder", "_partial_": True},
    }
    torch.manual_seed(0)
    model = build_model(config).eval()
    encoder_path, decoder_path = export_onnx(model, tmp_path)
    encoder = ort.InferenceSession(str(encoder_path))
    decoder_step = ort.InferenceSession(str(decoder_path))
    sentences = [example.src for example in ToyTranslation(train_size=10).splits()["test"]][:7]
    ids = encode_batch(trained.src_tokenizer, sentences)
    src, src_lens = pad(ids), torch.tensor([len(seq) for seq in ids])
    assert_onnx_greedy_is_eager_greedy(encoder, decoder_step, model, src, src_lens)


def assert_onnx_greedy_is_eager_greedy(
    encoder: Any, decoder_step: Any, model: Seq2Seq, src: torch.Tensor, src_lens: torch.Tensor
) -> None:
    """onnxruntime's greedy loop emits the eager model's tokens, up to each sentence's end."""
    expected = greedy_search(model, src, src_lens, BOS_ID, EOS_ID, PAD_ID, 2.0, 10)
    tokens = onnx_greedy_search(
        encoder,
        decoder_step,
        src.numpy(),
        src_lens.numpy(),
        BOS_ID,
        EOS_ID,
        max_len=int(expected.tokens.shape[1]),
    )
    for row in range(len(src)):
        length = int(expected.lengths[row])
        assert tokens[row, :length].tolist() == expected.tokens[row, :length].tolist()


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize(
    "parts",
    [
        {}, {"normalizer": "sparsemax"}, {"window": "local_m", "window_size": 1}, "input_feeding",
        {"coverage": True},
    ],
    ids=["softmax", "sparsemax", "local_m", "luong-input-feeding", "coverage"],
)  # fmt: skip
def test_beam_search_over_the_onnx_graphs_is_eager_beam_search(
    tmp_path: Path, heads: int, parts: dict[str, Any] | str
) -> None:
    """K hypotheses of several sentences at once (the graphs were traced with one row per
    sentence), multi-head attention, a normalizer, a local-m step count, an input-fed
    decoder's attentional vector and the coverage (B·K, S) reordered with the beams: the same
    n-best tokens, scores and attention as eager PyTorch."""
    from functools import partial

    from seq2seq.attention import AdditiveAttention, AttentionParts
    from seq2seq.inference.onnx_transformer import OnnxSeq2Seq
    from seq2seq.models import LuongDecoder
    from seq2seq.search import beam_search
    from tests.test_model import randomize_coverage

    torch.manual_seed(0)
    attention = partial(AdditiveAttention, num_hiddens=16)
    feeding = parts == "input_feeding"
    model = Seq2Seq(
        13, 11, attention, embedding_size=8, hidden_size=16, num_heads=heads,
        attention_parts=AttentionParts(**parts) if isinstance(parts, dict) else None,
        **({"decoder": LuongDecoder, "input_feeding": True} if feeding else {}),
    ).eval()  # fmt: skip
    randomize_coverage(model)  # it starts at 0, where it changes nothing
    export_onnx(model, tmp_path)
    onnx = OnnxSeq2Seq(tmp_path)
    src_lens = torch.tensor([9, 6, 3, 1])
    src = torch.randint(4, 13, (4, 9))
    src[torch.arange(9)[None, :] >= src_lens[:, None]] = PAD_ID
    ids = {"bos_id": BOS_ID, "eos_id": EOS_ID, "pad_id": PAD_ID, "beam_size": 4, "n_best": 3}
    eager, ours = beam_search(model, src, src_lens, **ids), beam_search(onnx, src, src_lens, **ids)
    assert torch.equal(ours.tokens, eager.tokens)
    torch.testing.assert_close(ours.scores, eager.scores)
    torch.testing.assert_close(ours.attention, eager.attention, rtol=1e-4, atol=1e-6)
