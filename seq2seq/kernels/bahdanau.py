"""The Bahdanau decoder's teacher-forced recurrence on the CPU as one autograd node.

Under teacher forcing the Bahdanau decoder (``decoder.BahdanauDecoder``) steps T times: the
previous state attends over the source (additive attention), and the context it reads enters the
GRU cell. Through autograd each step is some twenty small ATen kernels and as many autograd
nodes, and every step's weight gradients are GEMMs over only the B rows of that step. Here a step
is four GEMMs (torch's BLAS: the query projection, the context's and the state's gate
projections) and two passes of ``csrc/gru.c`` (the attention: scores, masked softmax, context;
then the GRU cell), and the backward pass is the same by hand, with the weight gradients as one
GEMM each over all T·B rows after the loop. The parameters are the modules' own, so checkpoints
and the autograd step loop (which runs wherever this does not) are unchanged.

``Recurrence.apply(...)`` applies where ``FastBahdanauDecoder.fused_recurrence_applies`` says
so: a GRU cell, additive attention in its plain form (``modules.plain_additive``), and tensors
``library.usable`` accepts. ``attend(...)`` is one decoding step's attention through the same C
pass, without autograd (``FastBahdanauDecoder.gates_step`` when ``fused_attention_applies``),
for greedy and beam search.

Shape legend: B batch, S source length, T target length, H decoder hidden size, M memory size
(encoder output), A attention hidden size, G gates (3H).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from seq2seq.kernels.gru import Steps
from seq2seq.kernels.library import FLOAT_BYTES, library


class Recurrence(torch.autograd.Function):
    """input_gates (B, T, G) = W_ie e + b_ih of every step, initial (B, H), projected keys
    (B, S, A) = W_k k, memory (B, S, M), src_lens (B,), then W_q (A, H), b_q (A,) or None, w_v
    (1, A), W_ic (G, M) (the context's part of the cell's input weight), W_hh (G, H), b_hh (G,) or
    None -> states (B, T, H), contexts (B, T, M), attention weights (B, T, S).

    With ``steps`` (a ``gru.Steps.packed``), input_gates are packed rows (N, G), step t's
    ``steps.batch_sizes[t]`` rows being the first sentences of the batch (sorted longest first,
    as ``seq2seq.kernels.packing.pack_tokens`` orders them), and the outputs are rows (N, ·) too: a
    sentence's steps end with it, and no step computes padding.

    Step t: q = W_q s_{t-1} + b_q; weights = masked softmax of w_v . tanh(q + W_k k_s) over s;
    c_t = weights @ memory; s_t = GRU(input_gates_t + W_ic c_t, s_{t-1}). The weights are an
    output without a gradient. ``library.usable`` must hold for the tensors.
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        input_gates: Tensor,
        initial: Tensor,
        projected_keys: Tensor,
        memory: Tensor,
        src_lens: Tensor,
        query_weight: Tensor,
        query_bias: Tensor | None,
        score_weight: Tensor,
        context_weight: Tensor,
        weight_hh: Tensor,
        bias_hh: Tensor | None,
        steps: Steps | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        kernels = library()
        assert kernels is not None  # usable() checked it
        padded_shape = None
        if steps is None:  # (B, T, G): row b * T + t of the (B·T, G) rows
            padded_shape = input_gates.shape[:2]
            steps = Steps.padded(padded_shape[0], padded_shape[1], batch_first=True)
            input_gates = input_gates.reshape(-1, input_gates.shape[2])
        input_gates = input_gates.contiguous()
        rows, gates = input_gates.shape
        batch, size = initial.shape
        keys, memory_size = projected_keys.shape[1], memory.shape[2]
        attention_size = projected_keys.shape[2]
        projected_keys, memory = projected_keys.contiguous(), memory.contiguous()
        src_lens = src_lens.to(torch.int64).contiguous()
        score_weight = score_weight.contiguous()
        states = input_gates.new_empty(rows, size)
        contexts = input_gates.new_empty(rows, memory_size)
        weights = input_gates.new_empty(rows, keys)
        needs_grad = any(ctx.needs_input_grad)  # type: ignore[attr-defined]
        # Per visited row, in the steps' order: sigmoid(2x) of every (row, key) pair, and
        # r z n gh_n h.
        saved_scores = (
            input_gates.new_empty(steps.rows, keys, attention_size) if needs_grad else None
        )
        saved_cells = input_gates.new_empty(steps.rows, 5 * size) if needs_grad else None
        state = initial.clone(memory_format=torch.contiguous_format)  # each step updates it
        query = input_gates.new_empty(batch, attention_size)
        cell_gates = input_gates.new_empty(batch, gates)
        recurrent = input_gates.new_empty(batch, gates)
        done = 0  # rows of the steps before t
        stride = steps.stride
        for active, start in zip(steps.batch_sizes, steps.starts, strict=True):
            # The step's first ``active`` sentences, rows start, start + stride, ... of each.
            _linear_into(query[:active], state[:active], query_weight, query_bias)  # (b, A)
            kernels.seq2seq_additive_forward(
                active, 1, keys, attention_size, memory_size, query.data_ptr(),
                projected_keys.data_ptr(), score_weight.data_ptr(), src_lens.data_ptr(),
                memory.data_ptr(),
                None if saved_scores is None else saved_scores[done].data_ptr(),
                _row(weights, start), stride * keys, _row(contexts, start), stride * memory_size,
            )  # fmt: skip
            # W_ie e + b_ih + W_ic c: (b, G) + (b, M) @ (M, G)
            torch.addmm(
                _rows(input_gates, start, stride, active),
                _rows(contexts, start, stride, active),
                context_weight.t(),
                out=cell_gates[:active],
            )
            _linear_into(recurrent[:active], state[:active], weight_hh, bias_hh)  # (b, G)
            kernels.seq2seq_gru_forward(
                active, size, cell_gates.data_ptr(), gates, recurrent.data_ptr(),
                state.data_ptr(), _row(states, start), stride * size,
                None if saved_cells is None else saved_cells[done].data_ptr(),
            )  # fmt: skip
            done += active
        outputs: tuple[Tensor, ...] = (states, contexts, weights)
        if padded_shape is not None:  # (B·T, ·) -> (B, T, ·)
            outputs = tuple(output.view(*padded_shape, -1) for output in outputs)
        ctx.mark_non_differentiable(outputs[2])
        if needs_grad:
            saved = [
                saved_scores, saved_cells, contexts, weights, projected_keys, memory, src_lens,
                query_weight, query_bias, score_weight, context_weight, weight_hh, bias_hh,
            ]  # fmt: skip
            ctx.save_for_backward(*saved)  # type: ignore[arg-type]  # None: no bias
        ctx.steps, ctx.padded_shape = steps, padded_shape  # type: ignore[attr-defined]
        return outputs[0], outputs[1], outputs[2]

    @staticmethod
    @once_differentiable
    def backward(
        ctx: FunctionCtx, d_states: Tensor | None, d_contexts: Tensor | None, _: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        kernels = library()
        assert kernels is not None
        (
            saved_scores, saved_cells, contexts, weights, projected_keys, memory, src_lens,
            query_weight, query_bias, score_weight, context_weight, weight_hh, bias_hh,
        ) = ctx.saved_tensors  # type: ignore[attr-defined]  # fmt: skip
        steps: Steps = ctx.steps  # type: ignore[attr-defined]
        padded_shape = ctx.padded_shape  # type: ignore[attr-defined]
        rows, keys = weights.shape
        batch, attention_size = projected_keys.shape[0], projected_keys.shape[2]
        size, gates, memory_size = weight_hh.shape[1], weight_hh.shape[0], memory.shape[2]
        d_states = _contiguous_or_zeros(d_states, (rows, size), memory).view(rows, size)
        d_contexts = _contiguous_or_zeros(d_contexts, (rows, memory_size), memory)
        d_contexts = d_contexts.view(rows, memory_size)
        d_state = memory.new_zeros(batch, size)  # dL/ds_t from the steps after t
        d_input_gates = memory.new_empty(rows, gates)
        d_recurrent = memory.new_empty(steps.rows, gates)  # in the steps' order, as saved
        d_queries = memory.new_empty(steps.rows, attention_size)
        d_context = memory.new_empty(batch, memory_size)
        d_keys = torch.zeros_like(projected_keys)
        d_memory = torch.zeros_like(memory)
        d_score_weight = memory.new_zeros(batch, attention_size)  # per sentence, summed below
        done = steps.rows
        stride = steps.stride
        for active, start in zip(reversed(steps.batch_sizes), reversed(steps.starts), strict=True):
            done -= active
            kernels.seq2seq_gru_backward(
                active, size, d_state.data_ptr(), _row(d_states, start), stride * size,
                saved_cells[done].data_ptr(), _row(d_input_gates, start), stride * gates,
                d_recurrent[done].data_ptr(),
            )  # fmt: skip
            # dL/ds_{t-1} += d_gh @ W_hh: (b, G) @ (G, H)
            d_state[:active].addmm_(d_recurrent[done : done + active], weight_hh)
            # dL/dc_t: the output's part plus d_gi @ W_ic, (b, M) + (b, G) @ (G, M)
            torch.addmm(
                _rows(d_contexts, start, stride, active),
                _rows(d_input_gates, start, stride, active),
                context_weight,
                out=d_context[:active],
            )
            kernels.seq2seq_additive_backward(
                active, keys, attention_size, memory_size, saved_scores[done].data_ptr(),
                score_weight.data_ptr(), src_lens.data_ptr(), memory.data_ptr(),
                _row(weights, start), stride * keys, d_context.data_ptr(), memory_size,
                d_queries[done].data_ptr(), d_keys.data_ptr(), d_memory.data_ptr(),
                d_score_weight.data_ptr(),
            )  # fmt: skip
            # dL/ds_{t-1} += d_q @ W_q: (b, A) @ (A, H)
            d_state[:active].addmm_(d_queries[done : done + active], query_weight)
        # Each visited row's state before its step: (N', H) of the saved cells, row stride 5H.
        previous = saved_cells[:, 4 * size :]
        # The weight gradients, one GEMM each over all steps' rows:
        # (A, N') @ (N', H); (G, N) @ (N, M); (G, N') @ (N', H).
        d_query_weight = d_queries.t() @ previous
        d_context_weight = d_input_gates.t() @ contexts
        d_weight_hh = d_recurrent.t() @ previous
        if padded_shape is not None:
            d_input_gates = d_input_gates.view(*padded_shape, gates)
        return (
            d_input_gates,
            d_state,
            d_keys,
            d_memory,
            None,
            d_query_weight,
            None if query_bias is None else d_queries.sum(0),
            d_score_weight.sum(0).view_as(score_weight),
            d_context_weight,
            d_weight_hh,
            None if bias_hh is None else d_recurrent.sum(0),
            None,
        )


def _linear_into(out: Tensor, inputs: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    """out = inputs @ weight.T (+ bias), written in place: (N, I) @ (I, O) -> (N, O)."""
    if bias is None:
        torch.mm(inputs, weight.t(), out=out)
    else:
        torch.addmm(bias, inputs, weight.t(), out=out)


def _row(tensor: Tensor, row: int) -> int:
    """The address of row ``row`` of a contiguous (N, D) float32 tensor."""
    return tensor.data_ptr() + row * tensor.shape[1] * FLOAT_BYTES


def _rows(tensor: Tensor, start: int, stride: int, count: int) -> Tensor:
    """Rows start, start + stride, ... (``count`` of them) of a contiguous (N, D) tensor, as a
    (count, D) view."""
    width = tensor.shape[1]
    offset = tensor.storage_offset() + start * width
    return tensor.as_strided((count, width), (stride * width, 1), offset)


def _contiguous_or_zeros(grad: Tensor | None, shape: tuple[int, ...], like: Tensor) -> Tensor:
    """An output's gradient, contiguous; zeros where the output was not used (autograd's None)."""
    return like.new_zeros(shape) if grad is None else grad.contiguous()


def attend(
    queries: Tensor,
    projected_keys: Tensor,
    memory: Tensor,
    src_lens: Tensor,
    query_weight: Tensor,
    query_bias: Tensor | None,
    score_weight: Tensor,
) -> tuple[Tensor, Tensor]:
    """One decoding step's additive attention without autograd, through the same C pass:
    queries (R, H), projected keys (B, S, A), memory (B, S, M), src_lens (B,) -> contexts (R, M),
    weights (R, S). R is B, or B·K when K hypotheses of each sentence share its source (beam
    search: row b·K + k is hypothesis k of sentence b). ``library.usable`` must hold."""
    kernels = library()
    assert kernels is not None  # usable() checked it
    rows, (batch, keys, attention_size) = queries.shape[0], projected_keys.shape
    memory_size = memory.shape[2]
    projected_keys, memory = projected_keys.contiguous(), memory.contiguous()
    src_lens = src_lens.to(torch.int64).contiguous()
    projected_queries = queries.new_empty(rows, attention_size)
    _linear_into(projected_queries, queries, query_weight, query_bias)  # (R, H) -> (R, A)
    weights = queries.new_empty(rows, keys)
    contexts = queries.new_empty(rows, memory_size)
    kernels.seq2seq_additive_forward(
        rows, rows // batch, keys, attention_size, memory_size, projected_queries.data_ptr(),
        projected_keys.data_ptr(), score_weight.contiguous().data_ptr(), src_lens.data_ptr(),
        memory.data_ptr(), None, weights.data_ptr(), keys, contexts.data_ptr(), memory_size,
    )  # fmt: skip
    return contexts, weights
