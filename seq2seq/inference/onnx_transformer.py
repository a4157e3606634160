"""The Transformer in ONNX: an encoder graph, a decoder-step graph with its key/value cache as
explicit inputs and outputs, and a model that runs them in ONNX Runtime under our own greedy and
beam search (so the search is the one PyTorch decoding uses, step for step).

Shape legend: B batch, S source length, R decoding rows (B, or B·K in beam search), h heads,
k key size and d value size per head, T the longest output (the static cache's length), D model
size, V target vocabulary, L decoder layers.

- ``encoder.onnx``: ``src (B, S) int64, src_lens (B,) int64 -> memory (B, S, D),
  cross_keys_l (B·h, S, k), cross_values_l (B·h, S, d)`` for each decoder layer l;
- ``decoder_step.onnx``: ``prev_tokens (R,), position (R,), src_lens (B,), cross_keys_l,
  cross_values_l, cache_keys_l (R, h, T, k), cache_values_l (R, h, T, d) -> logits (R, V),
  weights (R, S), next_cache_keys_l, next_cache_values_l``.

The cache is static: T slots allocated when a batch starts, the step writes slot ``position`` and
its self-attention reads slots 0..position (``valid_lens = position + 1``, the masked softmax
gives the others weight exactly 0). A cache that grows by concatenation would need graphs for
zero-length inputs, which ``torch.export`` specializes away. Every scoring function exports,
additive included: the graph is the model's own ``MultiHeadAttention`` and scoring code, traced
by torch's ``torch.export``-based exporter (``dynamo=True``).
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from seq2seq.errors import ONNX, ConfigError, require_extra
from seq2seq.kernels import reference
from seq2seq.models.decoder import EncodedSource
from seq2seq.models.transformer import (
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerSource,
    sinusoidal_positions,
)
from seq2seq.search import max_output_lengths

OPSET = 18
ENCODER, DECODER_STEP = "encoder.onnx", "decoder_step.onnx"


class TransformerEncoderGraph(nn.Module):
    """``Transformer.encode`` with tensors in and out: the memory and every decoder layer's
    cross-attention keys and values."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor, src_lens: Tensor) -> tuple[Tensor, ...]:
        source, _ = self.model.encode(src, src_lens)
        return (source.memory, *source.cross_keys, *source.cross_values)


class TransformerStepGraph(nn.Module):
    """One decoding step over a static cache (the module docstring): the decoder's own layers,
    with the self-attention reading and writing cache slots instead of concatenating."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.decoder: TransformerDecoder = model.decoder

    def forward(
        self, prev_tokens: Tensor, position: Tensor, src_lens: Tensor, *tensors: Tensor
    ) -> tuple[Tensor, ...]:
        layers = self.decoder.decoder_layers()
        n = len(layers)
        cross_keys, cross_values = list(tensors[:n]), list(tensors[n : 2 * n])
        cache_keys, cache_values = tensors[2 * n : 3 * n], tensors[3 * n :]
        source = TransformerSource(cross_keys[0], src_lens, cross_keys, cross_values)
        embedding = self.decoder.embedding
        size = embedding.embedding_dim
        # (R, 1, D): √D · E[token] + PE[position], as ``embed`` computes it for one position.
        x = embedding(prev_tokens[:, None]) * math.sqrt(size)
        x = x + sinusoidal_positions(position, size)[:, None, :].to(x.dtype)
        slots = torch.arange(cache_keys[0].shape[2], device=position.device)  # (T,)
        # (R, 1, T, 1): 1 at the slot this step writes.
        write = (slots[None, :] == position[:, None]).to(x.dtype)[:, None, :, None]
        self_lens = (position + 1)[:, None]  # (R, 1): slots 0..position are readable
        next_keys, next_values = [], []
        weights: Tensor | None = None
        for index, layer in enumerate(layers):
            attention = layer.self_attention

            def attend_self(
                y: Tensor, index: int = index, attention: Any = attention
            ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
                heads = (y.shape[0], attention.num_heads)
                # (R·h, 1, ·) -> (R, h, 1, ·), written into slot ``position`` of (R, h, T, ·).
                new_keys = attention.project_keys(y).unflatten(0, heads)
                new_values = attention.project_values(y).unflatten(0, heads)
                keys = cache_keys[index] * (1 - write) + new_keys * write
                values = cache_values[index] * (1 - write) + new_values * write
                context, _ = attention(
                    y, y, y, self_lens,
                    projected_keys=keys.flatten(0, 1), projected_values=values.flatten(0, 1),
                    need_weights=False,
                )  # fmt: skip
                return context, (keys, values)

            def attend_source(
                y: Tensor, index: int = index, layer: TransformerDecoderLayer = layer
            ) -> tuple[Tensor, Tensor | None]:
                return layer.attend_source(y, source, index, need_weights=True)

            x, (keys, values) = layer.self_residual.around(x, attend_self)
            x, weights = layer.cross_residual.around(x, attend_source)
            x = layer.ffn_residual(x, layer.ffn)
            next_keys.append(keys)
            next_values.append(values)
        assert weights is not None
        logits = self.decoder.logits(x[:, 0])  # (R, V)
        return (logits, weights[:, :, 0].mean(dim=1), *next_keys, *next_values)


def names(layers: int) -> dict[str, list[str]]:
    """The graphs' input and output names, layer by layer."""

    def per_layer(stem: str) -> list[str]:
        return [f"{stem}_{index}" for index in range(layers)]

    cross = [*per_layer("cross_keys"), *per_layer("cross_values")]
    cache = [*per_layer("cache_keys"), *per_layer("cache_values")]
    return {
        "encoder_outputs": ["memory", *cross],
        "step_inputs": ["prev_tokens", "position", "src_lens", *cross, *cache],
        "step_outputs": ["logits", "weights", *(f"next_{name}" for name in cache)],
    }


def export_transformer_onnx(model: Transformer, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``encoder.onnx`` and ``decoder_step.onnx`` to ``out_dir``; returns their paths."""
    if not isinstance(model, Transformer):
        raise ConfigError(
            f"export_transformer_onnx takes a Transformer, got {type(model).__name__}."
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = copy.deepcopy(model).eval()
    reference(model)  # plain PyTorch: the C kernels are calls the exporter cannot see into
    encoder_path, step_path = out_dir / ENCODER, out_dir / DECODER_STEP
    # The exporter and its optimizer (onnxscript) report every step and warn about operators of
    # packages we do not use: errors only.
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            export_graphs(model, encoder_path, step_path)
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
    return encoder_path, step_path


def export_graphs(model: Transformer, encoder_path: Path, step_path: Path) -> None:
    """Trace both graphs on a small padded batch, every batch, length and row axis dynamic."""
    layers = len(model.decoder.decoder_layers())
    graph_names = names(layers)
    src = torch.tensor([[4, 5, 6, 7, 8], [5, 6, 7, 0, 0], [4, 4, 0, 0, 0]])  # (B, S), padded
    src_lens = torch.tensor([5, 3, 2])
    batch, sentences = torch.export.Dim("batch", min=1), torch.export.Dim("sentences", min=1)
    source_len = torch.export.Dim("src_len", min=1)
    rows, steps = torch.export.Dim("rows", min=1), torch.export.Dim("steps", min=2)
    torch.onnx.export(
        TransformerEncoderGraph(model).eval(),
        (src, src_lens),
        str(encoder_path),
        dynamo=True,
        opset_version=OPSET,
        input_names=["src", "src_lens"],
        output_names=graph_names["encoder_outputs"],
        dynamic_shapes={"src": {0: batch, 1: source_len}, "src_lens": {0: batch}},
        verbose=False,
    )
    source, _ = model.encode(src, src_lens)
    cache = initial_cache(model, rows=len(src_lens), steps=6)
    # Beam-like rows (two per sentence) and a position inside the cache.
    step_rows = torch.tensor([0, 0, 1, 1, 2, 2])
    source = source.index_select(torch.arange(3))
    example = (
        torch.tensor([5, 6, 7, 8, 9, 4]),
        torch.full((6,), 2),
        src_lens,
        *source.cross_keys,
        *source.cross_values,
        *(tensor.index_select(0, step_rows) for tensor in cache),
    )
    heads = model.decoder.decoder_layers()[0].cross_attention.num_heads
    per_source = {0: heads * sentences, 1: source_len}  # (B·h, S, ·)
    per_row_cache = {0: rows, 2: steps}
    torch.onnx.export(
        TransformerStepGraph(model).eval(),
        example,
        str(step_path),
        dynamo=True,
        opset_version=OPSET,
        input_names=graph_names["step_inputs"],
        output_names=graph_names["step_outputs"],
        # forward(prev_tokens, position, src_lens, *tensors): the tensors are one argument.
        dynamic_shapes=(
            {0: rows},
            {0: rows},
            {0: sentences},
            (*([per_source] * (2 * layers)), *([per_row_cache] * (2 * layers))),
        ),
        verbose=False,
    )


def initial_cache(model: Transformer, rows: int, steps: int) -> list[Tensor]:
    """Zeros for every layer's self-attention keys (rows, h, steps, k), then values (…, d)."""
    keys, values = [], []
    probe = torch.zeros(1, 1, model.decoder.embedding.embedding_dim)
    for layer in model.decoder.decoder_layers():
        attention = layer.self_attention
        heads = attention.num_heads
        key_size = attention.project_keys(probe).shape[-1]
        value_size = attention.project_values(probe).shape[-1]
        keys.append(torch.zeros(rows, heads, steps, key_size))
        values.append(torch.zeros(rows, heads, steps, value_size))
    return [*keys, *values]


class OnnxTransformer:
    """A Transformer run by ONNX Runtime, with the ``encode``/``decode_step`` interface that
    ``seq2seq.search`` decodes: its state is (position (R,), cache keys…, cache values…), rows
    that search reorders and drops like the PyTorch model's."""

    def __init__(self, directory: str | Path, max_len_a: float, max_len_b: int) -> None:
        require_extra("onnx", ONNX)
        import onnxruntime

        directory = Path(directory)
        options = onnxruntime.SessionOptions()
        self.encoder = onnxruntime.InferenceSession(
            str(directory / ENCODER), options, providers=["CPUExecutionProvider"]
        )
        self.step = onnxruntime.InferenceSession(
            str(directory / DECODER_STEP), options, providers=["CPUExecutionProvider"]
        )
        inputs = {node.name: node.shape for node in self.step.get_inputs()}
        self.layers = sum(name.startswith("cache_keys_") for name in inputs)
        self.names = names(self.layers)
        # (rows, h, steps, size): the heads and sizes are static in the graph.
        self.cache_shapes = [
            tuple(inputs[name][1:2] + inputs[name][3:4])
            for name in self.names["step_inputs"][3 + 2 * self.layers :]
        ]
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self.declared = {node.name for node in self.step.get_inputs()}

    # ``Any`` as in ``EncoderDecoder``: search passes the source back untouched.
    def encode(self, src: Tensor, src_lens: Tensor) -> tuple[Any, tuple[Tensor, ...]]:
        outputs = self.encoder.run(None, {"src": src.numpy(), "src_lens": src_lens.numpy()})
        memory, *cross = (torch.from_numpy(array) for array in outputs)
        n = self.layers
        source = TransformerSource(memory, src_lens, list(cross[:n]), list(cross[n:]))
        # One slot per step search can take, plus the one a step past the limit would write.
        steps = int(max_output_lengths(src_lens, self.max_len_a, self.max_len_b).max()) + 1
        rows = src.shape[0]
        cache = [torch.zeros(rows, heads, steps, size) for heads, size in self.cache_shapes]
        return source, (torch.zeros(rows, dtype=torch.long), *cache)

    def decode_step(
        self, prev_tokens: Tensor, state: tuple[Tensor, ...], source: Any
    ) -> tuple[Tensor, tuple[Tensor, ...], Tensor]:
        position, *cache = state
        feeds: dict[str, np.ndarray] = {
            "prev_tokens": prev_tokens.numpy(),
            "position": position.numpy(),
            "src_lens": source.src_lens.numpy(),
        }
        tensors = [*source.cross_keys, *source.cross_values, *cache]
        for name, tensor in zip(self.names["step_inputs"][3:], tensors, strict=True):
            feeds[name] = tensor.numpy()
        feeds = {name: value for name, value in feeds.items() if name in self.declared}
        logits, weights, *next_cache = self.step.run(None, feeds)
        next_state = (position + 1, *(torch.from_numpy(array) for array in next_cache))
        return torch.from_numpy(logits), next_state, torch.from_numpy(weights)


class OnnxSeq2Seq:
    """An RNN model's ``encoder.onnx`` and ``decoder_step.onnx`` (``onnx_export``) behind the
    same ``encode``/``decode_step`` interface, so that greedy and beam search run them too."""

    def __init__(self, directory: str | Path) -> None:
        require_extra("onnx", ONNX)
        import onnxruntime

        directory = Path(directory)
        self.encoder = onnxruntime.InferenceSession(
            str(directory / ENCODER), providers=["CPUExecutionProvider"]
        )
        self.step = onnxruntime.InferenceSession(
            str(directory / DECODER_STEP), providers=["CPUExecutionProvider"]
        )
        self.declared = {node.name for node in self.step.get_inputs()}
        # state_h [, state_c] [, state_step]: what the encoder returns after the source's three.
        self.state_names = [output.name for output in self.encoder.get_outputs()][3:]

    def encode(self, src: Tensor, src_lens: Tensor) -> tuple[EncodedSource, tuple[Tensor, ...]]:
        outputs = self.encoder.run(None, {"src": src.numpy(), "src_lens": src_lens.numpy()})
        memory, keys, projected_keys, *state = (torch.from_numpy(array) for array in outputs)
        return EncodedSource(memory, keys, projected_keys, src_lens), tuple(state)

    def decode_step(
        self, prev_tokens: Tensor, state: tuple[Tensor, ...], source: EncodedSource
    ) -> tuple[Tensor, tuple[Tensor, ...], Tensor]:
        rows, sentences = prev_tokens.shape[0], source.memory.shape[0]
        if rows != sentences:
            # Beam search: K hypotheses per sentence (rows b·K + k). The graph was traced with
            # one query row per sentence and reads the source row by row: give it its copy.
            hypotheses = torch.arange(sentences).repeat_interleave(rows // sentences)  # (R,)
            source = source.index_select(hypotheses)
        feeds = {
            "prev_tokens": prev_tokens.numpy(),
            "memory": source.memory.numpy(),
            "keys": source.keys.numpy(),
            "projected_keys": source.projected_keys.numpy(),
            "src_lens": source.src_lens.numpy(),
            **{name: tensor.numpy() for name, tensor in zip(self.state_names, state, strict=True)},
        }
        feeds = {name: value for name, value in feeds.items() if name in self.declared}
        logits, weights, *next_state = self.step.run(None, feeds)
        return (
            torch.from_numpy(logits),
            tuple(torch.from_numpy(array) for array in next_state),
            torch.from_numpy(weights),
        )
