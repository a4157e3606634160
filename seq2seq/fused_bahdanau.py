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

``Recurrence.apply(...)`` applies where ``BahdanauDecoder.fused_recurrence_applies`` says so: a GRU
cell with ``fused_rnn`` on, additive attention in its plain form (``AdditiveAttention.fusable``),
and tensors ``fused_rnn.usable`` accepts. ``attend(...)`` is one decoding step's attention through
the same C pass, without autograd (``BahdanauDecoder.step`` when ``fused_attention_applies``),
for greedy and beam search.

Shape legend: B batch, S source length, T target length, H decoder hidden size, M memory size
(encoder output), A attention hidden size, G gates (3H).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from seq2seq.fused_rnn import FLOAT_BYTES, library


class Recurrence(torch.autograd.Function):
    """input_gates (B, T, G) = W_ie e + b_ih of every step, initial (B, H), projected keys
    (B, S, A) = W_k k, memory (B, S, M), src_lens (B,), then W_q (A, H), b_q (A,) or None, w_v
    (1, A), W_ic (G, M) (the context's part of the cell's input weight), W_hh (G, H), b_hh (G,) or
    None -> states (B, T, H), contexts (B, T, M), attention weights (B, T, S).

    Step t: q = W_q s_{t-1} + b_q; weights = masked softmax of w_v . tanh(q + W_k k_s) over s;
    c_t = weights @ memory; s_t = GRU(input_gates_t + W_ic c_t, s_{t-1}). The weights are an
    output without a gradient. ``fused_rnn.usable`` must hold for the tensors.
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
    ) -> tuple[Tensor, Tensor, Tensor]:
        kernels = library()
        assert kernels is not None  # usable() checked it
        batch, length, gates = input_gates.shape
        size, keys, memory_size = initial.shape[1], projected_keys.shape[1], memory.shape[2]
        attention_size = projected_keys.shape[2]
        projected_keys, memory = projected_keys.contiguous(), memory.contiguous()
        src_lens = src_lens.to(torch.int64).contiguous()
        score_weight = score_weight.contiguous()
        states = input_gates.new_empty(batch, length, size)
        contexts = input_gates.new_empty(batch, length, memory_size)
        weights = input_gates.new_empty(batch, length, keys)
        needs_grad = any(ctx.needs_input_grad)  # type: ignore[attr-defined]
        # Per step: sigmoid(2x) of every (sentence, key) pair, and r z n gh_n h of every row.
        saved_scores = (
            input_gates.new_empty(length, batch, keys, attention_size) if needs_grad else None
        )
        saved_cells = input_gates.new_empty(length, batch, 5 * size) if needs_grad else None
        state = initial.clone(memory_format=torch.contiguous_format)  # each step updates it
        query = input_gates.new_empty(batch, attention_size)
        cell_gates = input_gates.new_empty(batch, gates)
        recurrent = input_gates.new_empty(batch, gates)
        for t in range(length):
            _linear_into(query, state, query_weight, query_bias)  # (B, H) -> (B, A)
            kernels.seq2seq_additive_forward(
                batch, 1, keys, attention_size, memory_size, query.data_ptr(),
                projected_keys.data_ptr(), score_weight.data_ptr(), src_lens.data_ptr(),
                memory.data_ptr(), None if saved_scores is None else saved_scores[t].data_ptr(),
                _step(weights, t), length * keys, _step(contexts, t), length * memory_size,
            )  # fmt: skip
            # W_ie e + b_ih + W_ic c: (B, G) + (B, M) @ (M, G)
            torch.addmm(input_gates[:, t], contexts[:, t], context_weight.t(), out=cell_gates)
            _linear_into(recurrent, state, weight_hh, bias_hh)  # (B, H) -> (B, G)
            kernels.seq2seq_gru_forward(
                batch, size, cell_gates.data_ptr(), gates, recurrent.data_ptr(), state.data_ptr(),
                _step(states, t), length * size,
                None if saved_cells is None else saved_cells[t].data_ptr(),
            )  # fmt: skip
        ctx.mark_non_differentiable(weights)
        if needs_grad:
            saved = [
                saved_scores, saved_cells, contexts, weights, projected_keys, memory, src_lens,
                query_weight, query_bias, score_weight, context_weight, weight_hh, bias_hh,
            ]  # fmt: skip
            ctx.save_for_backward(*saved)  # type: ignore[arg-type]  # None: no bias
        return states, contexts, weights

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
        length, batch, keys, attention_size = saved_scores.shape
        size, gates, memory_size = weight_hh.shape[1], weight_hh.shape[0], memory.shape[2]
        d_states = _contiguous_or_zeros(d_states, (batch, length, size), memory)
        d_contexts = _contiguous_or_zeros(d_contexts, (batch, length, memory_size), memory)
        d_state = memory.new_zeros(batch, size)  # dL/ds_t from the steps after t
        d_input_gates = memory.new_empty(batch, length, gates)
        d_recurrent = memory.new_empty(length, batch, gates)
        d_queries = memory.new_empty(length, batch, attention_size)
        d_context = memory.new_empty(batch, memory_size)
        d_keys = torch.zeros_like(projected_keys)
        d_memory = torch.zeros_like(memory)
        d_score_weight = memory.new_zeros(batch, attention_size)  # per sentence, summed below
        for t in reversed(range(length)):
            kernels.seq2seq_gru_backward(
                batch, size, d_state.data_ptr(), _step(d_states, t), length * size,
                saved_cells[t].data_ptr(), _step(d_input_gates, t), length * gates,
                d_recurrent[t].data_ptr(),
            )  # fmt: skip
            # dL/ds_{t-1} += d_gh @ W_hh: (B, G) @ (G, H)
            d_state.addmm_(d_recurrent[t], weight_hh)
            # dL/dc_t: the output's part plus d_gi @ W_ic, (B, M) + (B, G) @ (G, M)
            torch.addmm(d_contexts[:, t], d_input_gates[:, t], context_weight, out=d_context)
            kernels.seq2seq_additive_backward(
                batch, keys, attention_size, memory_size, saved_scores[t].data_ptr(),
                score_weight.data_ptr(), src_lens.data_ptr(), memory.data_ptr(),
                _step(weights, t), length * keys, d_context.data_ptr(), memory_size,
                d_queries[t].data_ptr(), d_keys.data_ptr(), d_memory.data_ptr(),
                d_score_weight.data_ptr(),
            )  # fmt: skip
            # dL/ds_{t-1} += d_q @ W_q: (B, A) @ (A, H)
            d_state.addmm_(d_queries[t], query_weight)
        # Each step's state before it, as T·B rows of the saved cells: (T·B, H), row stride 5H.
        previous = saved_cells[:, :, 4 * size :].flatten(0, 1)
        d_queries_rows = d_queries.view(length * batch, attention_size)
        d_recurrent_rows = d_recurrent.view(length * batch, gates)
        # The weight gradients, one GEMM each over all steps' rows:
        # (A, T·B) @ (T·B, H); (G, B·T) @ (B·T, M); (G, T·B) @ (T·B, H).
        d_query_weight = d_queries_rows.t() @ previous
        d_context_weight = d_input_gates.view(-1, gates).t() @ contexts.view(-1, memory_size)
        d_weight_hh = d_recurrent_rows.t() @ previous
        return (
            d_input_gates,
            d_state,
            d_keys,
            d_memory,
            None,
            d_query_weight,
            None if query_bias is None else d_queries_rows.sum(0),
            d_score_weight.sum(0).view_as(score_weight),
            d_context_weight,
            d_weight_hh,
            None if bias_hh is None else d_recurrent_rows.sum(0),
        )


def _linear_into(out: Tensor, inputs: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    """out = inputs @ weight.T (+ bias), written in place: (N, I) @ (I, O) -> (N, O)."""
    if bias is None:
        torch.mm(inputs, weight.t(), out=out)
    else:
        torch.addmm(bias, inputs, weight.t(), out=out)


def _step(tensor: Tensor, t: int) -> int:
    """The address of row 0 of step t in a contiguous (B, T, ·) float32 tensor."""
    return tensor.data_ptr() + t * tensor.shape[2] * FLOAT_BYTES


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
    search: row b·K + k is hypothesis k of sentence b). ``fused_rnn.usable`` must hold."""
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
