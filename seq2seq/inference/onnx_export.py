"""ONNX export of the encoder and of one decoder step, and a greedy decoder that runs them.

Shape legend: B batch, S source length, M memory size, K key size, H decoder state, V vocabulary.

Two graphs, because decoding is a loop that the caller drives:

- ``encoder.onnx``: ``src (B,S) int64, src_lens (B,) int64 -> memory (B,S,M), keys (B,S,K),
  projected_keys (B,S,A), state_h (B,H)`` [, ``state_c (B,H)`` for an LSTM decoder]
  [, ``state_feed (B,H)``, the attentional vector of an input-fed decoder]
  [, ``state_coverage (B,S)``, the attention summed over the steps so far]
  [, ``state_step (B,) int64`` for a local-m window, the target step];
- ``decoder_step.onnx``: ``prev_tokens (B,), memory, keys, projected_keys, src_lens, state_h
  [, state_c] [, state_feed] [, state_coverage] [, state_step] -> logits (B,V), weights (B,S),
  next_state_h [, next_state_c] [, next_state_feed] [, next_state_coverage] [, next_state_step]``.

Every normalizer and window of ``seq2seq.attention.AttentionParts`` is part of the traced step (the
normalizers' sorts and bisection loops become ONNX TopK, CumSum and unrolled elementwise ops).

The packed bidirectional RNN is exported with torch's TorchScript-based ONNX exporter: the newer
``torch.export`` one cannot trace ``pack_padded_sequence`` (torch 2.13).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from seq2seq.errors import ONNX, ConfigError, require_extra
from seq2seq.inference.onnx_transformer import export_transformer_onnx
from seq2seq.kernels import reference
from seq2seq.models.decoder import EncodedSource
from seq2seq.models.model import EncoderDecoder, Seq2Seq
from seq2seq.models.transformer import Transformer

OPSET = 17


class EncoderGraph(nn.Module):
    """``Seq2Seq.encode`` with tensors in and out, as ONNX wants them."""

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor, src_lens: Tensor) -> tuple[Tensor, ...]:
        source, state = self.model.encode(src, src_lens)
        return (source.memory, source.keys, source.projected_keys, *state)


class DecoderStepGraph(nn.Module):
    """``Seq2Seq.decode_step`` with tensors in and out."""

    def __init__(self, model: EncoderDecoder) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        prev_tokens: Tensor,
        memory: Tensor,
        keys: Tensor,
        projected_keys: Tensor,
        src_lens: Tensor,
        *state: Tensor,
    ) -> tuple[Tensor, ...]:
        source = EncodedSource(memory, keys, projected_keys, src_lens)
        logits, next_state, weights = self.model.decode_step(prev_tokens, tuple(state), source)
        return (logits, weights, *next_state)


def state_names(model: EncoderDecoder) -> list[str]:
    """The decoder state's tensors: h, an LSTM's c, an input-fed decoder's attentional vector,
    the coverage, and a local-m window's step count."""
    return [f"state_{name}" for name in model.decoder.state_names()]


def export_onnx(model: EncoderDecoder, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``encoder.onnx`` and ``decoder_step.onnx`` to ``out_dir``; returns their paths.
    A Transformer's are ``onnx_transformer``'s (static key/value cache, torch.export)."""
    require_extra("onnx", ONNX)  # torch.onnx.export needs onnx and onnxscript
    if isinstance(model, Transformer):
        return export_transformer_onnx(model, out_dir)
    if not isinstance(model, Seq2Seq):
        raise ConfigError(
            f"ONNX export covers Seq2Seq and Transformer models, not a {type(model).__name__}."
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # The reference modules, plain PyTorch, are what the exporter traces: the C kernels are
    # ctypes calls it cannot see into (the accelerated ones would fall back to them anyway).
    model = copy.deepcopy(model).eval()
    reference(model)
    states = state_names(model)
    src = torch.tensor([[4, 5, 6, 7], [5, 6, 0, 0]])  # (B, S): any ids, padded like real input
    src_lens = torch.tensor([4, 2])
    batch, source_axes = {0: "batch"}, {0: "batch", 1: "src_len"}
    # A state's axes: the batch, and the source's length for the coverage (B, S).
    state_axes = {name: source_axes if name == "state_coverage" else batch for name in states}
    encoder_path, decoder_path = out_dir / "encoder.onnx", out_dir / "decoder_step.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        # The exporter warns about packed sequences and RNN batch sizes; the parity test in
        # tests/test_onnx_export.py checks other batch sizes and lengths against eager PyTorch.
        warnings.simplefilter("ignore")
        encoder_outputs = EncoderGraph(model)(src, src_lens)
        torch.onnx.export(
            EncoderGraph(model),
            (src, src_lens),
            str(encoder_path),
            dynamo=False,
            opset_version=OPSET,
            input_names=["src", "src_lens"],
            output_names=["memory", "keys", "projected_keys", *states],
            dynamic_axes={
                "src": source_axes,
                "src_lens": batch,
                "memory": source_axes,
                "keys": source_axes,
                "projected_keys": source_axes,
                **state_axes,
            },
        )
        prev_tokens = torch.tensor([2, 2])
        memory, keys, projected_keys, *state = encoder_outputs
        torch.onnx.export(
            DecoderStepGraph(model),
            (prev_tokens, memory, keys, projected_keys, src_lens, *state),
            str(decoder_path),
            dynamo=False,
            opset_version=OPSET,
            input_names=["prev_tokens", "memory", "keys", "projected_keys", "src_lens", *states],
            output_names=["logits", "weights", *(f"next_{name}" for name in states)],
            dynamic_axes={
                "prev_tokens": batch,
                "memory": source_axes,
                "keys": source_axes,
                "projected_keys": source_axes,
                "src_lens": batch,
                **state_axes,
                "logits": batch,
                "weights": source_axes,
                **{f"next_{name}": axes for name, axes in state_axes.items()},
            },
        )
    model.eval()  # the exporter restores the caller's mode; keep the model in eval mode
    return encoder_path, decoder_path


def run_session(session: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run an onnxruntime session on the ``feeds`` it declares as inputs.

    The exporter drops inputs a graph does not read (additive attention reads ``projected_keys``
    and never ``keys``), so the declared inputs differ between scoring functions.
    """
    declared = {node.name for node in session.get_inputs()}
    return list(session.run(None, {name: feeds[name] for name in declared}))


def onnx_greedy_search(
    encoder: Any,
    decoder_step: Any,
    src: np.ndarray,
    src_lens: np.ndarray,
    bos_id: int,
    eos_id: int,
    max_len: int,
) -> np.ndarray:
    """Greedy decoding with two ``onnxruntime.InferenceSession``s; returns ids (B, L), EOS-padded.

    The same loop as ``seq2seq.search.greedy_search``, kept to the minimum a deployment needs::

        import numpy as np, onnxruntime as ort
        from tokenizers import Tokenizer
        encoder, decoder_step = (ort.InferenceSession(f"bundle/{n}.onnx")
                                 for n in ("encoder", "decoder_step"))
        src_tok, tgt_tok = (Tokenizer.from_file(f"bundle/{side}_tokenizer.json")
                            for side in ("src", "tgt"))
        ids = np.array([src_tok.encode("the dog sees a cat .").ids], dtype=np.int64)
        out = onnx_greedy_search(encoder, decoder_step, ids, np.array([ids.shape[1]]),
                                 bos_id=2, eos_id=3, max_len=30)
        print(tgt_tok.decode([i for i in out[0] if i != 3]))
    """
    memory, keys, projected_keys, *state = encoder.run(None, {"src": src, "src_lens": src_lens})
    names = [output.name for output in encoder.get_outputs()][3:]  # state_h [, state_c, ...]
    prev_tokens = np.full(src.shape[0], bos_id, dtype=np.int64)
    finished = np.zeros(src.shape[0], dtype=bool)
    outputs = []
    for _ in range(max_len):
        feeds = {
            "prev_tokens": prev_tokens,
            "memory": memory,
            "keys": keys,
            "projected_keys": projected_keys,
            "src_lens": src_lens,
            **dict(zip(names, state, strict=True)),
        }
        logits, _, *state = run_session(decoder_step, feeds)
        prev_tokens = np.where(finished, eos_id, logits.argmax(-1)).astype(np.int64)
        outputs.append(prev_tokens)
        finished |= prev_tokens == eos_id
        if finished.all():
            break
    return np.stack(outputs, axis=1)
