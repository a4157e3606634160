"""The optional CPU accelerator: C kernels behind one seam.

The reference model (``seq2seq.models``, ``seq2seq.attention``) is plain PyTorch. On the CPU in
float32, a dozen small ATen kernels per recurrent step dominate its time at the sizes this
toolkit trains; the C kernels here compute the same functions in fewer passes (how much faster:
docs/performance.md). The reference layers never import this package. The model is accelerated
in one place, where it is built (``seq2seq.inference.bundle.build_model``, for training and
inference alike), which calls ``accelerate`` when ``model.kernels`` is ``auto``; the pipeline's
checks, the exports (ONNX) and the explorer import it only to read or undo that choice
(``KERNEL_CHOICES``, ``reference``). The modules:

- ``csrc/gru.c``, and ``library``: its build (on first use, with ``$CC``), checks and loading;
- ``gru``: the GRU recurrence (encoder layers, the Luong decoder's cell, decoding steps);
- ``csrc/attention.c`` and ``attention_parts``: the parts of one attention, each the C twin of
  its Python function by name (the scores, the normalizers, the windows, the key bias,
  coverage, local-p's factor, the context: the table in docs/architecture.md), and
  ``StepAttention``, which composes them, and ``attend``, one call of the attention for any rows
  (the Luong decoder's T steps at once, every decoding step; several heads are rows of their
  own, ``StepAttention.heads``);
- ``loop_attention``: the attention inside the step loops, one step at a time;
- ``step_gemm``: a loop's per-step products with a weight packed once (``csrc/gru.c``'s panels
  on an AVX-512 build, torch's GEMM otherwise), for the step loops and decoding steps;
- ``bahdanau``: the Bahdanau decoder's step loop with its attention's parts, one autograd node;
- ``luong``: the Luong decoder's step loop where each step waits for the one before (input
  feeding), one autograd node, and with coverage alone the attention's own loop
  (``AttentionLoop``: the cell and the queries' projection run over every step first, the
  readout over every row after);
- ``product_attention``: dot-product and general attention over packed rows and decoding steps;
- ``greedy``: the Luong decoder's greedy loop in one C call, its attention composed of the same
  C twins where it has parts (input feeding and coverage carried as the loop's state); it calls
  a serial copy of them a row and head at a time (``SEQ2SEQ_SERIAL_PARTS``);
- ``packing``: a batch's real tokens as rows, so that padding is never computed;
- ``dropout`` and ``splitmix``: the keep mask from a counter-based hash;
- ``modules``: the accelerated subclasses of the reference modules, which call the kernels where
  they apply and the reference (``super()``) everywhere else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from seq2seq.attention import Attention, MultiHeadAttention, own_formula
from seq2seq.kernels.attention_parts import say_once, say_own_formula, step_attention
from seq2seq.kernels.library import unavailable_reason, usable
from seq2seq.kernels.modules import ACCELERATED
from seq2seq.models.decoder import BahdanauDecoder, LuongDecoder

KERNEL_CHOICES = ("auto", "off")

__all__ = [
    "KERNEL_CHOICES",
    "accelerate",
    "is_accelerated",
    "reference",
    "reference_path",
    "unavailable_reason",
    "usable",
]


def accelerate(model: nn.Module) -> nn.Module:
    """Swap ``model``'s reference modules for their accelerated subclasses, in place; returns it.

    A subclass adds no parameters, buffers or state, so swapping the class of a built module
    (as ``torch.nn.utils.parametrize`` does) keeps every parameter, its name and its value:
    state dicts, checkpoints and bundles do not change. Only the exact reference classes are
    swapped (``modules.ACCELERATED``); a user's subclass keeps its own methods, and an attention
    with a method of the user's own anywhere in it (``seq2seq.attention.own_formula``) gets no
    fast path, which is said once. Both RNN decoders compose their attention from the parts' C
    twins (``attention_parts.step_attention``: every built-in score at a fixed or learned
    temperature; softmax, sparsemax, entmax15, α-entmax with a fixed or learned α; the key bias;
    global, local-m and local-p windows; coverage; several heads): the Bahdanau decoder in its
    step loop, the Luong decoder over all its target steps at once, or, where each step waits
    for the one before (input feeding, coverage), in a step loop like the Bahdanau decoder's
    (``luong``).
    """
    reference_only: set[int] = set()
    # The attentions a decoder composes from the C twins (step_attention read once each).
    composed = {id(m.attention) for m in model.modules() if composes_parts(m)}
    for module in model.modules():
        if isinstance(module, Attention | MultiHeadAttention) and id(module) not in composed:
            say_reference_path(module)
        dropout = getattr(module, "dropout", None) if id(module) in composed else None
        if isinstance(dropout, nn.Dropout) and dropout.p > 0:
            say_once(
                f"model.kernels=auto: attention.dropout={dropout.p} drops attention "
                "weights, which the C kernels' attention does not, so in training the attention "
                "(in the Bahdanau decoder, its whole step loop) runs on the reference path, at "
                "its speed; validation and decoding, which drop nothing, take the C kernels."
            )
        attention = getattr(module, "attention", None)
        has_parts = isinstance(attention, Attention | MultiHeadAttention) and (
            attention.normalization is not None
            or getattr(attention, "coverage_weight", None) is not None
        )
        if has_parts and id(attention) not in composed:
            reference_only.update(id(part) for part in module.modules())
        if isinstance(module, nn.LSTM | nn.LSTMCell):
            say_once(
                "model.kernels=auto: the C kernels' recurrent loops are GRU loops, so an LSTM "
                "(model=lstm) trains and decodes with PyTorch's own LSTM, off the C loops."
            )
        covers = getattr(getattr(module, "attention", None), "coverage_weight", None) is not None
        composed_decoder = isinstance(module, LuongDecoder) and id(module.attention) in composed
        if composed_decoder and covers and not module.input_feeding:
            say_once(
                "model.kernels=auto: with attention.coverage=true each step of the Luong decoder "
                "reads the attention of the steps before, so its attention cannot run over all "
                "steps in one call: the decoder's C kernels step one target position at a time, "
                "as the Bahdanau decoder's do."
            )
        if composed_decoder and getattr(module, "input_feeding", False):
            say_once(
                "model.kernels=auto: with model.input_feeding=true each step of the Luong decoder "
                "reads the attention of the step before, so its cell cannot run over all steps in "
                "one call: the decoder's C kernels step one target position at a time, as the "
                "Bahdanau decoder's do."
            )
    for module in model.modules():
        accelerated = ACCELERATED.get(type(module))
        if accelerated is not None and id(module) not in reference_only:
            module.__class__ = accelerated
    return model


def say_reference_path(attention: Attention | MultiHeadAttention) -> None:
    """Say once why ``attention``, which no decoder composes from the C twins, runs on the
    reference path: a formula of the user's own (``own_formula``), or parts (a normalizer
    other than softmax, a window, a key bias) where PyTorch's fused attention computes softmax
    alone (the Transformer's: the C twins serve the RNN decoders)."""
    reason = own_formula(attention)
    if reason is not None:
        say_own_formula(reason)
    elif attention.normalization is not None:
        say_once(
            f"model.kernels=auto: {attention.normalization.description}: PyTorch's fused "
            "attention computes global softmax alone, so this attention runs on its reference "
            "path (the C kernels' attention serves the RNN decoders)."
        )


def composes_parts(decoder: nn.Module) -> bool:
    """Whether ``decoder`` is an RNN decoder whose attention's parts all have C twins
    (``attention_parts.step_attention``)."""
    if not isinstance(decoder, BahdanauDecoder | LuongDecoder):
        return False
    return step_attention(decoder.attention, decoder.cell.hidden_size) is not None


def reference(model: nn.Module) -> nn.Module:
    """The inverse of ``accelerate``: ``model``'s accelerated modules back to their reference
    classes, in place; returns it."""
    for module in model.modules():
        for plain, accelerated in ACCELERATED.items():
            if type(module) is accelerated:
                module.__class__ = plain
    return model


@contextlib.contextmanager
def reference_path(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` on its reference modules for the ``with`` block, accelerated again after if it
    was: for what reads the modules' own calls (forward hooks), which the C paths do not make."""
    accelerated = is_accelerated(model)
    reference(model)
    try:
        yield model
    finally:
        if accelerated:
            accelerate(model)


def is_accelerated(model: nn.Module) -> bool:
    """Whether any of ``model``'s modules is an accelerated one."""
    return any(type(module) in ACCELERATED.values() for module in model.modules())
