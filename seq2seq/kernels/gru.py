"""The GRU recurrence on the CPU as one autograd node, with the cell's elementwise math in C.

ATen's CPU GRU runs each time step as a dozen small kernels (the recurrent GEMM, then adds,
sigmoids, a tanh, a lerp), each an autograd node with its own backward. On the benchmark's
shapes (B=64, H=128-256) those per-step kernels and their bookkeeping cost as much as the GEMMs.
Here a step is one GEMM and one pass of ``csrc/gru.c`` over the step's rows, and the backward
pass is the same by hand, with the recurrent weight's gradient as one GEMM over all steps after
the loop (torch's). The loop over a layer's steps runs in C, with the library's own kernel for
the steps' small GEMMs (a step's 1-64 rows by W_hh, packed once per call into cache-resident
panels, faster than torch's mm at these few rows: see csrc/gru.c), without the Python, ctypes
and dispatch of every step; ``c_loops`` checks it once against the Python loop over torch's
GEMMs, which runs where it disagrees. Where torch has one thread per direction, a bidirectional
layer's two directions run at once, each on its own thread (``_concurrent``). The parameters are
``nn.GRU``'s own, so checkpoints do not change.

``gru(module, inputs, hx)`` computes what ``module(inputs, hx)`` does for an ``nn.GRU`` (packed
or padded input, any layers, bidirectional, dropout between layers); ``gru_steps`` is one
unidirectional layer over a padded batch (the Luong decoder's cell), ``gru_cell`` one step
without autograd (either decoder's decoding step), and ``tanh_`` the C pass's tanh in place (the
Luong decoding step's attentional layer). They apply where ``library.usable`` holds. (A 64 x 256
forward step on the project's 2-core AMD EPYC: 14 us with AVX-512 on two threads, 39 us with
AVX2 on one.)

Shape legend: N rows of a packed (or flattened padded) sequence, B batch, T steps, E input
size, H hidden size, D directions (1 or 2), L layers.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import FunctionCtx, once_differentiable
from torch.nn.utils.rnn import PackedSequence

from seq2seq.kernels.library import FLOAT_BYTES, float32_references, library
from seq2seq.kernels.step_gemm import StepWeight

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "loops": whether the C loops agree with the Python loop (once)


def c_loops() -> bool:
    """Whether a GRU layer's steps loop in C (``seq2seq_gru_layer_forward`` and its backward,
    with their own small-GEMM kernel): where the library loaded and its loops compute what the
    Python loop over torch's GEMMs does (``_loops_agree``, checked once, on first call)."""
    kernels = library()
    if kernels is None:
        return False
    if "loops" not in _state:
        with _lock:
            if "loops" not in _state:
                with float32_references():
                    _state["loops"] = _loops_agree(kernels)
    return bool(_state["loops"])


def _loops_agree(kernels: ctypes.CDLL, size: int = 23, batch_sizes: Sequence[int] = (6, 5)) -> bool:
    """The C loops (the directions one after the other, and at once) against the Python loop,
    forward and backward, on random rows: both directions over a packed batch of these
    ``batch_sizes``, with biases, by default at a size whose panels and row blocks have
    remainders. They run the same passes and GEMMs of the same sums (their own kernel against
    torch's), so they must agree to rounding."""
    generator = torch.Generator().manual_seed(0)
    steps = Steps.packed(list(batch_sizes))
    rows = steps.rows
    schedules = [_schedule(steps, direction, size, 2) for direction in range(2)]
    # Every draw from the check's own generator, as in _check.
    gates = torch.randn(rows, 6 * size, generator=generator)
    d_outputs = torch.randn(rows, 2 * size, generator=generator)
    weights = [
        torch.randn(shape, generator=generator) / size**0.5
        for _ in range(2)
        for shape in ((3 * size, size), (3 * size,))
    ]
    batch = steps.batch_sizes[0]
    initial = torch.randn(2, batch, size, generator=generator)
    results = []
    for concurrent in (None, False, True):  # None: the Python loop
        finals, outputs = initial.clone(), torch.zeros(rows, 2 * size)
        recurrent, saved = torch.empty(2, batch, 3 * size), torch.empty(2, rows, 5 * size)
        d_states, d_gates = initial.clone(), torch.zeros(rows, 6 * size)
        d_recurrent = torch.empty(2, rows, 3 * size)
        if concurrent is None:
            for direction, schedule in enumerate(schedules):
                weight, bias = weights[2 * direction : 2 * direction + 2]
                _forward_steps(kernels, schedule, gates, weight, bias, finals[direction],
                               outputs, recurrent[direction], saved[direction])  # fmt: skip
                _backward_steps(kernels, schedule, d_states[direction], d_outputs,
                                saved[direction], d_gates, d_recurrent[direction],
                                weight)  # fmt: skip
        else:
            _forward_layer(kernels, schedules, gates, tuple(weights), finals, outputs, recurrent,
                           saved, concurrent)  # fmt: skip
            _backward_layer(kernels, schedules, d_states, d_outputs, saved, d_gates, d_recurrent,
                            list(weights), concurrent)  # fmt: skip
        results.append([finals, outputs, saved, d_states, d_gates, d_recurrent])
    # Values of order 1: two float32 GEMMs of up to 768-term sums differ by a few 1e-6 (measured
    # up to 5.7e-6 at H=128), a wrong kernel by far more.
    return all(
        torch.allclose(value, expected, rtol=1e-5, atol=1e-5)
        for variant in results[1:]
        for value, expected in zip(variant, results[0], strict=True)
    )


@dataclass(frozen=True)
class Steps:
    """Where each time step's rows are in an (N, ·) tensor of rows.

    Step t has ``batch_sizes[t]`` rows (non-increasing over t: packed sequences are sorted by
    length), the first at row ``starts[t]``, the next ``stride`` rows further on.
    """

    batch_sizes: tuple[int, ...]
    starts: tuple[int, ...]
    stride: int

    @staticmethod
    def packed(batch_sizes: list[int]) -> Steps:
        """A ``PackedSequence``'s rows: step after step, each step's rows together."""
        starts = [0]
        for size in batch_sizes[:-1]:
            starts.append(starts[-1] + size)
        return Steps(tuple(batch_sizes), tuple(starts), 1)

    @staticmethod
    def padded(batch: int, steps: int, batch_first: bool) -> Steps:
        """A padded (B, T, ·) or (T, B, ·) tensor's rows: every row active at every step."""
        counts = [batch] * steps
        if batch_first:  # row b * T + t
            return Steps(tuple(counts), tuple(range(steps)), steps)
        return Steps(tuple(counts), tuple(t * batch for t in range(steps)), 1)

    @property
    def rows(self) -> int:
        """How many rows the steps visit: fewer than the tensor's where some are padding."""
        return sum(self.batch_sizes)


class _Recurrence(torch.autograd.Function):
    """gates (N, D·3H) = W_ih x + b_ih of D directions, initial (D, B, H), then each direction's
    W_hh (3H, H) and b_hh (3H,) or None -> outputs (N, D·H), final states (D, B, H).

    Direction 0 runs forward in time, direction 1 backward. A row absent from a step (a short
    sentence in a packed batch) keeps its state: the backward direction starts at each
    sentence's last token, as ``nn.GRU`` on a ``PackedSequence`` does.
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx, gates: Tensor, initial: Tensor, steps: Steps, *weights: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        kernels = library()
        assert kernels is not None  # usable() checked it
        directions, _, size = initial.shape
        gates = gates.contiguous()
        rows, width = gates.shape[0], directions * size
        outputs = gates.new_empty(rows, width)
        finals = initial.clone(memory_format=torch.contiguous_format)  # each step updates it
        needs_grad = any(ctx.needs_input_grad)  # type: ignore[attr-defined]
        # Per direction, r z n gh_n h of every visited row (N', 5H), in the order the steps ran.
        saved = gates.new_empty(directions, steps.rows, 5 * size) if needs_grad else None
        # (D, B, 3H): each direction's W_hh h of one step
        recurrent = gates.new_empty(directions, initial.shape[1], 3 * size)
        schedules = [
            _schedule(steps, direction, size, directions) for direction in range(directions)
        ]
        if c_loops():  # every step of every direction in one C call
            _forward_layer(kernels, schedules, gates, weights, finals, outputs, recurrent, saved,
                           _concurrent(directions))  # fmt: skip
        else:
            for direction, schedule in enumerate(schedules):
                weight, bias = weights[2 * direction], weights[2 * direction + 1]
                assert weight is not None
                _forward_steps(
                    kernels, schedule, gates, weight, bias, finals[direction], outputs,
                    recurrent[direction], None if saved is None else saved[direction],
                )  # fmt: skip
        if saved is not None:
            ctx.save_for_backward(saved, *weights)  # type: ignore[arg-type]  # None: no bias
        ctx.steps = steps  # type: ignore[attr-defined]
        return outputs, finals

    @staticmethod
    @once_differentiable
    def backward(
        ctx: FunctionCtx, d_outputs: Tensor, d_finals: Tensor
    ) -> tuple[Tensor | None, ...]:
        kernels = library()
        assert kernels is not None
        saved, *weights = ctx.saved_tensors  # type: ignore[attr-defined]
        steps: Steps = ctx.steps  # type: ignore[attr-defined]
        directions, rows, size = saved.shape[0], saved.shape[1], saved.shape[2] // 5
        width = directions * size
        d_outputs = d_outputs.contiguous()
        d_states = d_finals.clone(memory_format=torch.contiguous_format)  # (D, B, H)
        d_gates = d_outputs.new_empty(d_outputs.shape[0], 3 * width)
        d_recurrent = d_outputs.new_empty(directions, rows, 3 * size)  # in the steps' run order
        schedules = [
            _schedule(steps, direction, size, directions) for direction in range(directions)
        ]
        if c_loops():  # every step of every direction in one C call
            _backward_layer(kernels, schedules, d_states, d_outputs, saved, d_gates, d_recurrent,
                            weights, _concurrent(directions))  # fmt: skip
        else:
            for direction, schedule in enumerate(schedules):
                _backward_steps(
                    kernels, schedule, d_states[direction], d_outputs, saved[direction],
                    d_gates, d_recurrent[direction], weights[2 * direction],
                )  # fmt: skip
        grads: list[Tensor | None] = []
        for direction in range(directions):
            bias = weights[2 * direction + 1]
            previous = saved[direction, :, 4 * size :]  # (N, H): each row's h before its step
            # All steps' W_hh gradients in one GEMM: (3H, N) @ (N, H) -> (3H, H)
            grads.append(d_recurrent[direction].t() @ previous)
            grads.append(None if bias is None else d_recurrent[direction].sum(0))
        return d_gates, d_states, None, *grads


def _forward_layer(
    kernels: ctypes.CDLL,
    schedules: list[_Schedule],
    gates: Tensor,
    weights: tuple[Tensor | None, ...],
    finals: Tensor,
    outputs: Tensor,
    recurrent: Tensor,
    saved: Tensor | None,
    concurrent: bool,
) -> None:
    """Every direction's steps of ``_Recurrence.forward`` in one C call, with ``concurrent``
    (``_concurrent``) each direction on its own thread. finals (D, B, H) enter as the initial
    states and leave as the final ones; outputs (N, D·H) and saved (D, N', 5H) are written (N'
    visited rows), recurrent (D, B, 3H) is scratch."""
    directions, batch, size = finals.shape
    tables = _tables(schedules)  # (D, 3, T)
    held = [None if tensor is None else tensor.contiguous() for tensor in weights]  # (see below)
    # Each direction's W_hh^T in the C GEMM's panels, packed there once per call.
    panels = gates.new_empty(directions, kernels.seq2seq_panel_floats(size, 3 * size))
    kernels.seq2seq_gru_layer_forward(
        directions, tables.shape[2], tables.data_ptr(), batch, size, sum(schedules[0].counts),
        gates.data_ptr(), schedules[0].gate_stride, _addresses(held[0::2]),
        _addresses(held[1::2]), finals.data_ptr(), outputs.data_ptr(), schedules[0].out_stride,
        recurrent.data_ptr(), None if saved is None else saved.data_ptr(), panels.data_ptr(),
        concurrent,
    )  # fmt: skip


def _backward_layer(
    kernels: ctypes.CDLL,
    schedules: list[_Schedule],
    d_states: Tensor,
    d_outputs: Tensor,
    saved: Tensor,
    d_gates: Tensor,
    d_recurrent: Tensor,
    weights: list[Tensor | None],
    concurrent: bool,
) -> None:
    """Every direction's steps of ``_Recurrence.backward`` in one C call, as in
    ``_forward_layer``: d_states (D, B, H) go from the final states' gradients to the initial
    ones', d_gates (N, D·3H) and d_recurrent (D, N, 3H, in the steps' run order) are written."""
    directions, batch, size = d_states.shape
    tables = _tables(schedules)  # (D, 3, T)
    held = [None if tensor is None else tensor.contiguous() for tensor in weights[0::2]]
    panels = d_states.new_empty(directions, kernels.seq2seq_panel_floats(3 * size, size))
    kernels.seq2seq_gru_layer_backward(
        directions, tables.shape[2], tables.data_ptr(), batch, size, saved.shape[1],
        d_states.data_ptr(), d_outputs.data_ptr(), schedules[0].out_stride, saved.data_ptr(),
        d_gates.data_ptr(), schedules[0].gate_stride, d_recurrent.data_ptr(), _addresses(held),
        panels.data_ptr(), concurrent,
    )  # fmt: skip


def _addresses(tensors: list[Tensor | None]) -> ctypes.Array[ctypes.c_void_p]:
    """The C array of the tensors' data pointers (NULL for None). The caller holds the tensors
    until the call returns: a temporary's memory could be freed before the C code reads it."""
    return (ctypes.c_void_p * len(tensors))(
        *(None if tensor is None else tensor.data_ptr() for tensor in tensors)
    )


def _concurrent(directions: int) -> bool:
    """Whether a layer's directions run at once, each on its own thread with single-threaded
    GEMMs: where torch has exactly as many threads as there are directions (the benchmark's 2
    threads and bidirectional encoder: its forward pass 2,700 -> 2,150-2,430 us at B=64, H=128,
    T=25). With more threads, each GEMM on all of them; with one, nothing to share."""
    return directions > 1 and torch.get_num_threads() == directions


def _forward_steps(
    kernels: ctypes.CDLL,
    schedule: _Schedule,
    gates: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    state: Tensor,
    outputs: Tensor,
    recurrent: Tensor,
    saved: Tensor | None,
) -> None:
    """One direction's steps of ``_Recurrence.forward`` where the C loops are not used
    (``c_loops``): a Python loop of torch GEMMs and C passes (the arithmetic of
    ``_forward_layer``), and the reference ``_loops_agree`` checks those against.
    state (B, H) is updated in place, outputs (N, D·H) and saved (N, 5H) are written."""
    size = state.shape[1]
    weight_t = weight.t()  # (H, 3H)
    done = 0
    for count, gate_at, out_at in schedule.steps():
        step_recurrent = recurrent[:count]
        # (n, H) @ (H, 3H) -> (n, 3H)
        if bias is None:
            torch.mm(state[:count], weight_t, out=step_recurrent)
        else:
            torch.addmm(bias, state[:count], weight_t, out=step_recurrent)
        kernels.seq2seq_gru_forward(
            count, size, _address(gates, gate_at), schedule.gate_stride,
            step_recurrent.data_ptr(), state.data_ptr(), _address(outputs, out_at),
            schedule.out_stride, None if saved is None else _address(saved, done * 5 * size),
        )  # fmt: skip
        done += count


def _backward_steps(
    kernels: ctypes.CDLL,
    schedule: _Schedule,
    d_state: Tensor,
    d_outputs: Tensor,
    saved: Tensor,
    d_gates: Tensor,
    d_recurrent: Tensor,
    weight: Tensor | None,
) -> None:
    """One direction's steps of ``_Recurrence.backward`` in Python, as ``_forward_steps``:
    d_state (B, H) goes from the final states' gradient to the initial ones', d_gates (N, D·3H)
    and d_recurrent (N, 3H, in the steps' run order) are written."""
    assert weight is not None
    size = d_state.shape[1]
    done = saved.shape[0]
    for count, gate_at, out_at in reversed(schedule.steps()):
        done -= count
        step_d_recurrent = d_recurrent[done : done + count]  # (n, 3H)
        kernels.seq2seq_gru_backward(
            count, size, d_state.data_ptr(), _address(d_outputs, out_at), schedule.out_stride,
            _address(saved, done * 5 * size), _address(d_gates, gate_at), schedule.gate_stride,
            step_d_recurrent.data_ptr(),
        )  # fmt: skip
        # dL/dh += d_gh @ W_hh: (n, 3H) @ (3H, H)
        d_state[:count].addmm_(step_d_recurrent, weight)


@dataclass(frozen=True)
class _Schedule:
    """One direction's steps in the order they run: each step's row count and where its first
    gate and output rows start (in floats, in tensors laid out as ``_Recurrence``'s gates and
    outputs), with the row strides."""

    counts: tuple[int, ...]
    gate_offsets: tuple[int, ...]
    out_offsets: tuple[int, ...]
    gate_stride: int
    out_stride: int

    def steps(self) -> list[tuple[int, int, int]]:
        return list(zip(self.counts, self.gate_offsets, self.out_offsets, strict=True))


def _tables(schedules: list[_Schedule]) -> Tensor:
    """The C layer loops' schedule: per direction its counts, gate offsets and output offsets,
    (D, 3, T) int64."""
    return torch.tensor(
        [[schedule.counts, schedule.gate_offsets, schedule.out_offsets] for schedule in schedules],
        dtype=torch.int64,
    )


def _schedule(steps: Steps, direction: int, size: int, directions: int) -> _Schedule:
    order = _order(steps, direction)
    width = directions * size
    counts = tuple(steps.batch_sizes[t] for t in order)
    gate_offsets = tuple(steps.starts[t] * 3 * width + direction * 3 * size for t in order)
    out_offsets = tuple(steps.starts[t] * width + direction * size for t in order)
    return _Schedule(
        counts, gate_offsets, out_offsets, steps.stride * 3 * width, steps.stride * width
    )


def _order(steps: Steps, direction: int) -> range:
    count = len(steps.batch_sizes)
    return range(count) if direction == 0 else range(count - 1, -1, -1)


def _address(tensor: Tensor, offset: int) -> int:
    """The address of element ``offset`` of a contiguous float32 tensor."""
    return tensor.data_ptr() + offset * FLOAT_BYTES


@overload
def gru(module: nn.GRU, inputs: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]: ...


@overload
def gru(
    module: nn.GRU, inputs: PackedSequence, hx: Tensor | None = None
) -> tuple[PackedSequence, Tensor]: ...


def gru(
    module: nn.GRU, inputs: Tensor | PackedSequence, hx: Tensor | None = None
) -> tuple[Tensor | PackedSequence, Tensor]:
    """``module(inputs, hx)`` for an ``nn.GRU`` (check ``usable`` first): outputs of the last
    layer, packed or padded like ``inputs``, and the final states (L·D, B, H)."""
    directions = 2 if module.bidirectional else 1
    size = module.hidden_size
    if isinstance(inputs, PackedSequence):
        rows = inputs.data  # (N, E)
        steps = Steps.packed(inputs.batch_sizes.tolist())
        batch = steps.batch_sizes[0]
    else:
        if inputs.dim() != 3:
            raise ValueError(f"kernels.gru.gru takes a batched (3-D) input, got {inputs.dim()}-D")
        inputs = inputs.contiguous()
        batch, length = inputs.shape[:2] if module.batch_first else inputs.shape[1::-1]
        rows = inputs.view(-1, inputs.shape[-1])  # (B·T or T·B, E)
        steps = Steps.padded(batch, length, module.batch_first)
    if hx is None:
        hx = rows.new_zeros(module.num_layers * directions, batch, size)
    elif isinstance(inputs, PackedSequence) and inputs.sorted_indices is not None:
        hx = hx.index_select(1, inputs.sorted_indices)  # the packed rows' order
    suffixes = ["", "_reverse"][:directions]
    finals = []
    for layer in range(module.num_layers):
        if layer > 0 and module.training and module.dropout > 0:
            rows = F.dropout(rows, module.dropout, training=True)
        names = [f"l{layer}{suffix}" for suffix in suffixes]
        # Both directions' input projections in one GEMM: (N, E) @ (E, D·3H).
        input_weight = torch.cat([getattr(module, f"weight_ih_{name}") for name in names])
        input_bias = None
        if module.bias:
            input_bias = torch.cat([getattr(module, f"bias_ih_{name}") for name in names])
        weights: list[Tensor | None] = []
        for name in names:
            weights.append(getattr(module, f"weight_hh_{name}"))
            weights.append(getattr(module, f"bias_hh_{name}") if module.bias else None)
        gates = F.linear(rows, input_weight, input_bias)  # (N, D·3H)
        initial = hx[layer * directions : (layer + 1) * directions]
        rows, layer_finals = _Recurrence.apply(gates, initial, steps, *weights)
        finals.append(layer_finals)
    final = torch.cat(finals)  # (L·D, B, H)
    if isinstance(inputs, PackedSequence):
        if inputs.unsorted_indices is not None:
            final = final.index_select(1, inputs.unsorted_indices)
        packed = PackedSequence(
            rows, inputs.batch_sizes, inputs.sorted_indices, inputs.unsorted_indices
        )
        return packed, final
    return rows.view(*inputs.shape[:2], directions * size), final


def gru_steps(
    inputs: Tensor, initial: Tensor, params: list[Tensor], batch_sizes: Sequence[int] | None = None
) -> Tensor:
    """One unidirectional GRU layer. ``params`` are W_ih, W_hh and optionally b_ih, b_hh
    (``torch.gru``'s order), so this is ``torch.gru`` with one layer, batch first:

    - over a padded batch: inputs (B, T, E), initial (B, H) -> states (B, T, H);
    - with ``batch_sizes`` (T',), over packed rows (a ``PackedSequence``'s order, as
      ``seq2seq.kernels.packing.pack_tokens`` gives): inputs (N, E), initial (B, H) with its
      rows in the sorted order -> states (N, H), the padding never computed.
    """
    weight_ih, weight_hh = params[0], params[1]
    bias_ih, bias_hh = (params[2], params[3]) if len(params) == 4 else (None, None)
    gates = F.linear(inputs, weight_ih, bias_ih)  # (B, T, 3H) or (N, 3H)
    if batch_sizes is not None:
        steps = Steps.packed(list(batch_sizes))
        rows, _ = _Recurrence.apply(gates, initial[None], steps, weight_hh, bias_hh)
        return rows  # (N, H)
    batch, length = inputs.shape[:2]
    steps = Steps.padded(batch, length, batch_first=True)
    rows, _ = _Recurrence.apply(
        gates.view(batch * length, -1), initial[None], steps, weight_hh, bias_hh
    )
    return rows.view(batch, length, -1)  # (B, T, H)


def gru_cell(
    input_gates: Tensor,
    hidden: Tensor,
    weight_hh: Tensor,
    bias_hh: Tensor | None,
    packed: StepWeight | None = None,
) -> Tensor:
    """One ``nn.GRUCell`` step without autograd, for decoding: the input projection
    ``W_ih x + b_ih`` (B, 3H, made by the caller) and the state (B, H) -> the new state (B, H);
    ``packed``, W_hh as a ``StepWeight`` (packed once per batch), or None for torch's GEMM.

    A decoding step is one GEMM and one C pass here instead of ATen's half-dozen elementwise
    kernels (``AttentionDecoder.cell_gates``). It saves nothing for a backward pass, so the caller
    must not want gradients; ``usable`` must hold for the tensors.
    """
    kernels = library()
    assert kernels is not None  # usable() checked it
    rows, size = hidden.shape
    if input_gates.stride(-1) != 1:
        input_gates = input_gates.contiguous()
    # (B, H) @ (H, 3H) -> (B, 3H)
    if packed is not None:
        recurrent = hidden.new_empty(rows, weight_hh.shape[0])
        packed.into(recurrent, hidden, bias_hh)
    elif bias_hh is None:
        recurrent = torch.mm(hidden, weight_hh.t())
    else:
        recurrent = torch.addmm(bias_hh, hidden, weight_hh.t())
    # The kernel overwrites the previous state it reads and writes the new one to a second
    # buffer as well (no aliasing allowed): the caller's state stays as it was.
    state = hidden.clone(memory_format=torch.contiguous_format)
    new = torch.empty_like(state)
    kernels.seq2seq_gru_forward(
        rows, size, input_gates.data_ptr(), input_gates.stride(0), recurrent.data_ptr(),
        state.data_ptr(), new.data_ptr(), size, None,
    )  # fmt: skip
    return new


class _Tanh(torch.autograd.Function):
    """tanh in place through the C pass, with tanh's gradient 1 - tanh^2 from the result."""

    @staticmethod
    def forward(ctx: FunctionCtx, values: Tensor) -> Tensor:
        tanh_(values)
        ctx.mark_dirty(values)
        ctx.save_for_backward(values)
        return values

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: Tensor) -> Tensor:
        (result,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return torch.ops.aten.tanh_backward(grad, result)


def tanh_with_grad_(values: Tensor) -> Tensor:
    """``tanh_`` as an autograd node: the Luong decoder's attentional layer in training, where
    ``torch.tanh``'s CPU kernel is several times slower than this one's (docs/performance.md).
    ``values`` must be contiguous, ``usable``, and not needed by autograd as it was (a layer's
    fresh output): it is overwritten."""
    result: Tensor = _Tanh.apply(values)
    return result


def tanh_(values: Tensor) -> Tensor:
    """tanh in place through the C pass, without autograd (decoding's attentional layer): about
    a third of ``torch.tanh``'s time at (64, 256) on the project's CPU. ``values`` must be
    contiguous and ``usable``."""
    kernels = library()
    assert kernels is not None  # usable() checked it
    assert values.is_contiguous()
    kernels.seq2seq_tanh(values.numel(), values.data_ptr())
    return values
