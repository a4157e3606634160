"""A Transformer with dot-product scoring as a CTranslate2 model (int8, int16 or float32).

CTranslate2 computes one attention: ``softmax(q·k / √d)`` per head. Our scoring functions that
are that function up to a linear map are folded into the projections, exactly:

- ``scaled_dot``: as is; a temperature T (fixed, or the learned one's value) divides ``W_q``;
- ``dot`` (unscaled): ``W_q`` times √d (/ T), which cancels CTranslate2's 1/√d;
- ``general`` (``qᵀ W k`` per head, one W shared by the heads): W folded into each head's slice
  of the key projection, ``W_k ← W W_k`` and ``b_k ← W b_k``, then as ``dot``.

Additive scoring (and any user's own) cannot be written as a dot product, and RNN models are not
Transformers: both are refused with the reason (their fast path is ONNX). The sinusoidal table
is passed explicitly (CTranslate2's built-in one puts the sines and cosines in two halves, ours
interleaves them), ``MAX_POSITIONS`` rows: no source or output can be longer.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from seq2seq.attention import DotProductAttention, GeneralAttention, MultiHeadAttention, scores_as
from seq2seq.data.tokenization import BOS_ID, EOS_ID, UNK_ID
from seq2seq.errors import CTRANSLATE2, ConfigError, missing_extra, require_extra
from seq2seq.inference.bundle import TrainedModel
from seq2seq.models.transformer import (
    PositionWiseFFN,
    Transformer,
    TransformerEncoderLayer,
    sinusoidal_positions,
)

CTRANSLATE2_DIR = "ctranslate2"
QUANTIZATIONS = ("int8", "int16", "float32")
# Rows of the position table: the longest source, and the longest output, CTranslate2 can take.
MAX_POSITIONS = 1024


def refusal(trained: TrainedModel) -> str | None:
    """Why ``trained`` cannot run in CTranslate2, or None when it can."""
    model = trained.model
    if not isinstance(model, Transformer):
        return (
            f"CTranslate2 runs Transformers; this is a {type(model).__name__} (an RNN model). "
            "Export it with --onnx for ONNX Runtime instead, or serve the bundle with PyTorch."
        )
    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention) and module.normalization is not None:
            return (
                f"CTranslate2 computes softmax attention over every key, and {name} has "
                f"{module.normalization.description}, which it cannot compute. Export it with "
                "--onnx for ONNX Runtime, which runs every normalizer, or serve the bundle with "
                "PyTorch."
            )
        if isinstance(module, MultiHeadAttention):
            scoring = module.scoring
            if not (
                scores_as(scoring, DotProductAttention) or scores_as(scoring, GeneralAttention)
            ):
                return (
                    "CTranslate2 computes only dot-product attention (q·k/√d per head), and "
                    f"{name} scores with {type(scoring).__name__}, which no dot product rewrites "
                    "(scaled_dot, dot and general can). Export it with --onnx for ONNX Runtime, "
                    "which runs every scoring function."
                )
    return None


def fold_attention(attention: MultiHeadAttention) -> dict[str, Tensor]:
    """W_q, b_q, W_k, b_k, W_v, b_v, W_o, b_o of ``attention`` rewritten so that CTranslate2's
    ``softmax(q'·k' / √d)`` is our scoring function's softmax (module docstring)."""
    scoring = attention.scoring
    heads = attention.num_heads
    size = attention.W_q.weight.shape[0] // heads  # d, the head size
    temperature = float(scoring.temperature)
    query_factor = 1.0 / temperature
    if not (isinstance(scoring, DotProductAttention) and scoring.scaled):
        query_factor *= math.sqrt(size)  # dot and general are unscaled: cancel the 1/√d
    folded = {
        "W_q": attention.W_q.weight * query_factor,
        "b_q": bias(attention.W_q) * query_factor,
        "W_k": attention.W_k.weight,
        "b_k": bias(attention.W_k),
        "W_v": attention.W_v.weight,
        "b_v": bias(attention.W_v),
        "W_o": attention.W_o.weight,
        "b_o": bias(attention.W_o),
    }
    if isinstance(scoring, GeneralAttention):
        bilinear = scoring.W.weight  # (d, d): W k per head
        # (h·d, D) -> (h, d, D); each head's keys W_k,i k become W W_k,i k.
        per_head = folded["W_k"].reshape(heads, size, -1)
        folded["W_k"] = torch.matmul(bilinear, per_head).reshape(heads * size, -1)
        folded["b_k"] = (folded["b_k"].reshape(heads, size) @ bilinear.T).reshape(-1)
    return {name: tensor.detach().float() for name, tensor in folded.items()}


def bias(linear: nn.Linear) -> Tensor:
    return linear.bias if linear.bias is not None else torch.zeros(linear.weight.shape[0])


def model_spec(trained: TrainedModel) -> Any:
    """The CTranslate2 ``TransformerSpec`` holding ``trained``'s weights."""
    require_extra("ctranslate2", CTRANSLATE2)
    from ctranslate2.specs import common_spec, transformer_spec

    model = trained.model
    assert isinstance(model, Transformer)
    encoder_layers = [
        layer for layer in model.encoder.modules() if isinstance(layer, TransformerEncoderLayer)
    ]
    decoder_layers = model.decoder.decoder_layers()
    heads = decoder_layers[0].self_attention.num_heads
    pre_norm = model.decoder.final_norm is not None
    spec = transformer_spec.TransformerSpec.from_config(
        (len(encoder_layers), len(decoder_layers)),
        heads,
        pre_norm=pre_norm,
        activation=common_spec.Activation.RELU,
        # Attention returned: the last layer's, averaged over every head, as our decoders report.
        alignment_layer=-1,
        alignment_heads=heads,
    )
    d_model = model.decoder.embedding.embedding_dim
    table = sinusoidal_positions(torch.arange(MAX_POSITIONS), d_model)
    sides = [(spec.encoder, model.encoder.embedding), (spec.decoder, model.decoder.embedding)]
    for side, embedding in sides:
        # The encoder's spec has a list of embeddings (one per source feature): ours is one.
        embeddings = side.embeddings[0] if isinstance(side.embeddings, list) else side.embeddings
        embeddings.weight = array(embedding.weight)
        side.scale_embeddings = True  # √D, as ``embed`` does
        side.position_encodings.encodings = array(table)
    if pre_norm:
        set_norm(spec.encoder.layer_norm, model.encoder.final_norm)
        set_norm(spec.decoder.layer_norm, model.decoder.final_norm)
    for layer_spec, layer in zip(spec.encoder.layer, encoder_layers, strict=True):
        set_self_attention(layer_spec.self_attention, layer.self_attention)
        set_norm(layer_spec.self_attention.layer_norm, layer.attention_residual.norm)
        set_ffn(layer_spec.ffn, layer.ffn, layer.ffn_residual.norm)
    for layer_spec, layer in zip(spec.decoder.layer, decoder_layers, strict=True):
        set_self_attention(layer_spec.self_attention, layer.self_attention)
        set_norm(layer_spec.self_attention.layer_norm, layer.self_residual.norm)
        cross = fold_attention(layer.cross_attention)
        set_linear(layer_spec.attention.linear[0], cross["W_q"], cross["b_q"])
        set_linear(
            layer_spec.attention.linear[1],
            torch.cat([cross["W_k"], cross["W_v"]]),
            torch.cat([cross["b_k"], cross["b_v"]]),
        )
        set_linear(layer_spec.attention.linear[2], cross["W_o"], cross["b_o"])
        set_norm(layer_spec.attention.layer_norm, layer.cross_residual.norm)
        set_ffn(layer_spec.ffn, layer.ffn, layer.ffn_residual.norm)
    decoder = model.decoder
    if decoder.output_layer is not None:
        set_linear(spec.decoder.projection, decoder.output_layer.weight, bias(decoder.output_layer))
    else:
        assert decoder.output_bias is not None
        set_linear(spec.decoder.projection, decoder.embedding.weight, decoder.output_bias)
    tokens = {
        "bos_token": BOS_ID,
        "eos_token": EOS_ID,
        "unk_token": UNK_ID,
        "decoder_start_token": BOS_ID,
    }
    for key, token_id in tokens.items():
        setattr(spec.config, key, trained.tgt_tokenizer.id_to_token(token_id))
    spec.config.layer_norm_epsilon = 1e-5  # nn.LayerNorm's
    spec.register_source_vocabulary(vocabulary(trained.src_tokenizer))
    spec.register_target_vocabulary(vocabulary(trained.tgt_tokenizer))
    return spec


def set_self_attention(spec: Any, attention: MultiHeadAttention) -> None:
    folded = fold_attention(attention)
    set_linear(
        spec.linear[0],
        torch.cat([folded["W_q"], folded["W_k"], folded["W_v"]]),
        torch.cat([folded["b_q"], folded["b_k"], folded["b_v"]]),
    )
    set_linear(spec.linear[1], folded["W_o"], folded["b_o"])


def set_ffn(spec: Any, ffn: PositionWiseFFN, norm: nn.LayerNorm) -> None:
    set_linear(spec.linear_0, ffn.W_1.weight, bias(ffn.W_1))
    set_linear(spec.linear_1, ffn.W_2.weight, bias(ffn.W_2))
    set_norm(spec.layer_norm, norm)


def set_linear(spec: Any, weight: Tensor, bias_: Tensor) -> None:
    spec.weight = array(weight)
    spec.bias = array(bias_)


def set_norm(spec: Any, norm: object) -> None:
    assert isinstance(norm, nn.LayerNorm)
    spec.gamma = array(norm.weight)
    spec.beta = array(norm.bias)


def array(tensor: Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy().copy()


def vocabulary(tokenizer: Any) -> list[str]:
    """The tokens in id order (CTranslate2 maps tokens to ids by position)."""
    return [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]


def export_ctranslate2(trained: TrainedModel, bundle: Path, quantization: str = "float32") -> Path:
    """Write ``bundle/ctranslate2/`` (model.bin, vocabularies) beside the bundle's own files."""
    why = refusal(trained)
    if why is not None:
        raise ConfigError(why)
    if quantization not in QUANTIZATIONS:
        raise ConfigError(
            f"--quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}."
        )
    require_extra("ctranslate2", CTRANSLATE2)
    try:
        from ctranslate2.converters.converter import Converter
    except ImportError as error:  # installed, but it cannot load
        raise missing_extra("ctranslate2", CTRANSLATE2, ["ctranslate2"], str(error)) from None

    class SpecConverter(Converter):
        def _load(self) -> Any:
            return model_spec(trained)

    out = Path(bundle) / CTRANSLATE2_DIR
    if out.exists():
        shutil.rmtree(out)
    SpecConverter().convert(str(out), quantization=quantization)
    # What a user of CTranslate2 alone needs besides model.bin: our length limit, floor(a·S) + b
    # tokens with the end token (CTranslate2's max_decoding_length counts it too), S the source
    # tokens after the cut to max_src_len; and the longest source or output the positions allow.
    limits = {key: trained.decoding[key] for key in ("max_len_a", "max_len_b", "max_src_len")}
    (out / "seq2seq.json").write_text(
        json.dumps({"quantization": quantization, "max_positions": MAX_POSITIONS, **limits}) + "\n"
    )
    return out
