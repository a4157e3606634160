"""The Bahdanau decoder's teacher-forced recurrence on the CPU as one autograd node.

Under teacher forcing the Bahdanau decoder (``decoder.BahdanauDecoder``) steps T times: the
previous state attends over the source, and the context it reads enters the GRU cell. Through
autograd each step is some twenty small ATen kernels and as many autograd nodes, and every
step's weight gradients are GEMMs over only the B rows of that step. Here a step is three or four
GEMMs (torch's BLAS: the additive query projection, the context's and the state's gate
projections), the attention's C parts (``loop_attention.LoopAttention``: the score, the
normalizer, the context, whichever the attention is built with) and one pass of ``csrc/gru.c``
(the GRU cell); the backward pass is the same by hand, the parts' backward passes in reverse,
with the weight gradients as one GEMM each over all T·B rows after the loop. The parameters are
the modules' own, so checkpoints and the autograd step loop (which runs wherever this does not)
are unchanged.

``Recurrence.apply(...)`` applies where ``FastBahdanauDecoder.fused_recurrence_applies`` says
so: a GRU cell, an attention whose parts have C twins (``attention_parts.step_attention``), and
tensors ``library.usable`` accepts. A decoding step's attention goes through the same parts
(``attention_parts.attend``).

Shape legend: B batch, S source length, T target length, H decoder hidden size, M memory size
(encoder output), A attention hidden size, K key size (A, or H for product scoring), G gates
(3H).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from seq2seq.kernels.attention_parts import StepAttention
from seq2seq.kernels.gru import Steps
from seq2seq.kernels.library import library
from seq2seq.kernels.loop_attention import LoopAttention, contiguous_or_zeros, row_at, strided_rows
from seq2seq.kernels.step_gemm import StepWeight


class Recurrence(torch.autograd.Function):
    """input_gates (B, T, G) = W_ie e + b_ih of every step, initial (B, H), projected keys
    (B, S, K), memory (B, S, M), src_lens (B,), then W_q (A, H) and b_q (A,) (additive scoring;
    None for a product's q = s), the heads' W_q (D, H) and b_q (D,) before an additive score's
    (several heads; else None), w_v (1, A) (additive; else None), the key bias (P,) or None,
    a learned α (0-d) or None, a learned temperature (0-d) or None, the coverage weight (w_c
    (A,) or γ (0-d)) and the coverage before the first step (B, S) or None each, local-p's W_p
    (H, H) and v_p (1, H) or None each, W_ic (G, M) (the context's part of the cell's input
    weight), W_hh (G, H), b_hh (G,) or None, and ``parts``, the attention's C twins
    (``attention_parts.StepAttention``) -> states (B, T, H), contexts (B, T, M), attention
    weights (B, T, S), each with its gradient (a loss may read the weights: alignment,
    coverage). K is A for additive scoring, H for a product's.

    With ``steps`` (a ``gru.Steps.packed``), input_gates are packed rows (N, G), step t's
    ``steps.batch_sizes[t]`` rows being the first sentences of the batch (sorted longest first,
    as ``seq2seq.kernels.packing.pack_tokens`` orders them), and the outputs are rows (N, ·) too: a
    sentence's steps end with it, and no step computes padding.

    Step t: q = W_q s_{t-1} + b_q (additive) or s_{t-1}; weights = normalize(score(q, k)) over
    the valid keys; c_t = weights @ memory; s_t = GRU(input_gates_t + W_ic c_t, s_{t-1}).
    ``library.usable`` must hold for the tensors.

    With several heads (``parts.heads`` h > 1; ``FastDecoder.loop_inputs``) the keys
    (B·h, S, K) and memory (B·h, S, d) are split into heads, src_lens repeated (B·h,), W_q
    (h·K, H) gives a row's h queries at once (a product's), or the heads' W_q (D, H) and then
    an additive score's W_q (A, d) of each head, the coverage weight is the heads' γ (h,), W_ic
    is (G, h·d), and the contexts and weights come out as (…, h·d) and (…, h·S), head after
    head (``loop_attention``); the steps' rows must then follow each other (packed, or
    time-major padded).
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        input_gates: Tensor,
        initial: Tensor,
        projected_keys: Tensor,
        memory: Tensor,
        src_lens: Tensor,
        query_weight: Tensor | None,
        query_bias: Tensor | None,
        heads_weight: Tensor | None,
        heads_bias: Tensor | None,
        score_weight: Tensor | None,
        key_bias: Tensor | None,
        alpha: Tensor | None,
        temperature: Tensor | None,
        coverage_weight: Tensor | None,
        initial_coverage: Tensor | None,
        centre_weight: Tensor | None,
        centre_vector: Tensor | None,
        context_weight: Tensor,
        weight_hh: Tensor,
        bias_hh: Tensor | None,
        parts: StepAttention,
        steps: Steps | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        kernels = library()
        assert kernels is not None  # usable() checked it
        padded_shape = None
        if steps is None:  # (B, T, G): row b * T + t of the (B·T, G) rows
            padded_shape = input_gates.shape[:2]
            steps = Steps.padded(padded_shape[0], padded_shape[1], batch_first=True)
            input_gates = input_gates.reshape(-1, input_gates.shape[2])
        assert parts.heads == 1 or steps.stride == 1  # a step's head rows side by side
        input_gates = input_gates.contiguous()
        rows, gates = input_gates.shape
        batch, size = initial.shape
        needs_grad = any(ctx.needs_input_grad)  # type: ignore[attr-defined]
        attention = LoopAttention(
            kernels, parts, (
                projected_keys, memory, src_lens, query_weight, query_bias, heads_weight,
                heads_bias, score_weight, key_bias, alpha, temperature, coverage_weight,
                initial_coverage, centre_weight, centre_vector,
            ), batch, size, steps, needs_grad,
        )  # fmt: skip
        new = input_gates.new_empty
        states = new(rows, size)
        contexts = new(rows, parts.heads * attention.value_size)
        weights = new(rows, parts.heads * attention.keys)
        # Per visited row, in the steps' order: the cell's r z n gh_n h_{t-1}.
        saved_cells = new(steps.rows, 5 * size) if needs_grad else None
        state = initial.clone(memory_format=torch.contiguous_format)  # each step updates it
        cell_gates, recurrent = new(batch, gates), new(batch, gates)
        # Each step's products: x @ W^T through ``StepWeight``, each weight packed once here.
        reads, recurs = StepWeight(context_weight), StepWeight(weight_hh)
        done, stride = 0, steps.stride  # rows of the steps before t
        for t, (active, start) in enumerate(zip(steps.batch_sizes, steps.starts, strict=True)):
            # The step's first ``active`` sentences, rows start, start + stride, ... of each.
            step_contexts = strided_rows(contexts, start, stride, active)  # (b, M)
            attention.forward(
                t, done, state[:active], strided_rows(weights, start, stride, active),
                step_contexts,
            )  # fmt: skip
            # W_ie e + b_ih + W_ic c: (b, G) + (b, M) @ (M, G)
            step_gates = cell_gates[:active].copy_(strided_rows(input_gates, start, stride, active))
            reads.into(step_gates, step_contexts, accumulate=True)
            recurs.into(recurrent[:active], state[:active], bias_hh)  # (b, H) @ (H, G)
            kernels.seq2seq_gru_forward(
                active, size, cell_gates.data_ptr(), gates, recurrent.data_ptr(),
                state.data_ptr(), row_at(states, start), stride * size,
                None if saved_cells is None else saved_cells[done].data_ptr(),
            )  # fmt: skip
            done += active
        outputs: tuple[Tensor, ...] = (states, contexts, weights)
        if padded_shape is not None:  # (B·T, ·) -> (B, T, ·)
            outputs = tuple(output.view(*padded_shape, -1) for output in outputs)
        if needs_grad:
            saved = saved_cells, contexts, weights, context_weight, weight_hh, bias_hh
            ctx.save_for_backward(*saved)  # type: ignore[arg-type]  # None: not used
        ctx.steps, ctx.padded_shape, ctx.attention = steps, padded_shape, attention  # type: ignore[attr-defined]
        return outputs[0], outputs[1], outputs[2]

    @staticmethod
    @once_differentiable
    def backward(
        ctx: FunctionCtx,
        d_states: Tensor | None,
        d_contexts: Tensor | None,
        d_weights: Tensor | None,
    ) -> tuple[Tensor | None, ...]:
        kernels = library()
        assert kernels is not None
        saved_cells, contexts, weights, context_weight, weight_hh, bias_hh = ctx.saved_tensors  # type: ignore[attr-defined]
        steps: Steps = ctx.steps  # type: ignore[attr-defined]
        attention: LoopAttention = ctx.attention  # type: ignore[attr-defined]
        padded_shape = ctx.padded_shape  # type: ignore[attr-defined]
        (rows, width), keys = contexts.shape, weights.shape[1]
        size, gates = weight_hh.shape[1], weight_hh.shape[0]
        d_states = contiguous_or_zeros(d_states, (rows, size), contexts).view(rows, size)
        d_contexts = contiguous_or_zeros(d_contexts, (rows, width), contexts).view(rows, width)
        if d_weights is not None:  # a loss read the weights: (rows, S)
            d_weights = d_weights.contiguous().view(rows, keys)
        d_state = contexts.new_zeros(attention.batch, size)  # dL/ds_t from the steps after t
        d_input_gates = contexts.new_empty(rows, gates)
        d_recurrent = contexts.new_empty(steps.rows, gates)  # in the steps' order, as saved
        d_context = contexts.new_empty(attention.batch, width)
        # Each step's products: d @ W through ``StepWeight``, each weight packed once here.
        reads = StepWeight(context_weight, transposed=False)
        recurs = StepWeight(weight_hh, transposed=False)
        attention.start_backward()
        done, stride = steps.rows, steps.stride
        for t in reversed(range(len(steps.batch_sizes))):
            active, start = steps.batch_sizes[t], steps.starts[t]
            done -= active
            kernels.seq2seq_gru_backward(
                active, size, d_state.data_ptr(), row_at(d_states, start), stride * size,
                saved_cells[done].data_ptr(), row_at(d_input_gates, start), stride * gates,
                d_recurrent[done].data_ptr(),
            )  # fmt: skip
            # dL/ds_{t-1} += d_gh @ W_hh: (b, G) @ (G, H)
            recurs.into(d_state[:active], d_recurrent[done : done + active], accumulate=True)
            # dL/dc_t: the output's part plus d_gi @ W_ic, (b, M) + (b, G) @ (G, M)
            step_d_context = d_context[:active].copy_(
                strided_rows(d_contexts, start, stride, active)
            )
            reads.into(
                step_d_context, strided_rows(d_input_gates, start, stride, active), accumulate=True
            )
            attention.backward(
                t, done, strided_rows(weights, start, stride, active), d_context[:active],
                None if d_weights is None else strided_rows(d_weights, start, stride, active),
                d_state[:active],
            )  # fmt: skip
        # Each visited row's state before its step: (N', H) of the saved cells, row stride 5H.
        previous = saved_cells[:, 4 * size :]
        # The weight gradients, one GEMM each over all steps' rows: (G, N) @ (N, M);
        # (G, N') @ (N', H).
        d_context_weight = d_input_gates.t() @ contexts
        d_weight_hh = d_recurrent.t() @ previous
        if padded_shape is not None:
            d_input_gates = d_input_gates.view(*padded_shape, gates)
        return (
            d_input_gates,
            d_state,
            *attention.gradients(previous),
            d_context_weight,
            d_weight_hh,
            None if bias_hh is None else d_recurrent.sum(0),
            None,
            None,
        )
