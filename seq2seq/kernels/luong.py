"""The Luong decoder's step loop on the CPU as one autograd node, where each step waits for the
one before: input feeding (the last attentional vector enters the cell), with or without
coverage (the score reads the attention paid so far). With coverage alone only the attention
waits for the step before: ``AttentionLoop`` steps it between the cell over every step and the
readout over every row.

Without either, the Luong decoder's cell runs over all steps first and the attention of every
step is one call (``FastLuongDecoder.teacher_forced_logits``). With them, the reference steps T
times through some twenty small autograd nodes each (``LuongDecoder.sequential_step``). Here a
step is the cell's GEMMs and its C pass (``csrc/gru.c``), the attention's C parts
(``loop_attention.LoopAttention``, as the Bahdanau loop's) and the attentional layer's two
GEMMs and tanh; the backward pass is the same by hand, in reverse, with the weight gradients as
one GEMM each over all the steps' rows after the loop. The parameters are the modules' own.

Step t: h_t = GRU(W_ie e_t + b_ih + W_if f_{t-1}, h_{t-1}) (W_if f_{t-1} with input feeding);
q = W_q h_t + b_q (additive) or h_t; weights = normalize(score(q, k) [+ coverage]) over the
keys a row may read; c_t = weights @ memory; h~_t = tanh(W_c1 c_t + W_c2 h_t); f_t = h~_t ⊙ keep
(the output's dropout, which is also what is fed: Luong et al., section 3.3, as OpenNMT-py).

Shape legend: B batch, S source length, T target length, N rows, H hidden size, M memory size,
A attention hidden size, K key size (A, or H for product scoring), G gates (3H).
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


class SequentialRecurrence(torch.autograd.Function):
    """input_gates (B, T, G) = W_ie e + b_ih of every step, initial (B, H), the first fed
    vector f_0 (B, H) or None (no input feeding), projected keys (B, S, K), memory (B, S, M),
    src_lens (B,), then W_q (A, H) and b_q (A,) (additive scoring; None for a product's q =
    h), the heads' W_q (D, H) and b_q (D,) before an additive score's (``bahdanau.Recurrence``),
    w_v (1, A) or None, the key bias (P,), a learned α (0-d), a learned temperature (0-d),
    the coverage weight (w_c (A,) or γ (0-d)) and the coverage before the first step (B, S),
    local-p's W_p (H, H) and v_p (1, H), or None each; W_if (G, H) (the fed vector's part of
    the cell's input weight; None without input feeding), W_hh (G, H), b_hh (G,) or None, W_c
    (H, M + H), a bias (H,) added to W_c [c; h] or None, keep (B, T, H) (the output's dropout
    as a multiplier) or None, and ``parts`` -> the attentional vectors f_t (B, T, H) and the
    attention weights (B, T, S), each with its gradient.

    With ``steps`` (a ``gru.Steps.packed``), input_gates, keep and the outputs are packed rows
    (N, ·), sorted longest first, as in ``bahdanau.Recurrence``; several heads as there (M is
    then h·d, the weights (…, h·S)). ``library.usable`` must hold.
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        input_gates: Tensor,
        initial: Tensor,
        initial_feed: Tensor | None,
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
        feed_weight: Tensor | None,
        weight_hh: Tensor,
        bias_hh: Tensor | None,
        attentional_weight: Tensor,
        attentional_bias: Tensor | None,
        keep: Tensor | None,
        parts: StepAttention,
        steps: Steps | None = None,
    ) -> tuple[Tensor, Tensor]:
        kernels = library()
        assert kernels is not None  # usable() checked it
        padded_shape = None
        if steps is None:  # (B, T, ·): row b * T + t of the (B·T, ·) rows
            padded_shape = input_gates.shape[:2]
            steps = Steps.padded(padded_shape[0], padded_shape[1], batch_first=True)
            input_gates = input_gates.reshape(-1, input_gates.shape[2])
            keep = None if keep is None else keep.reshape(-1, keep.shape[2])
        assert parts.heads == 1 or steps.stride == 1  # a step's head rows side by side
        input_gates = input_gates.contiguous()
        rows, gates = input_gates.shape
        batch, size = initial.shape
        visited = steps.rows
        needs_grad = any(ctx.needs_input_grad)  # type: ignore[attr-defined]
        attention = LoopAttention(
            kernels, parts, (
                projected_keys, memory, src_lens, query_weight, query_bias, heads_weight,
                heads_bias, score_weight, key_bias, alpha, temperature, coverage_weight,
                initial_coverage, centre_weight, centre_vector,
            ), batch, size, steps, needs_grad,
        )  # fmt: skip
        width = parts.heads * attention.value_size  # a context's columns: M, or h·d
        new = input_gates.new_empty
        attentionals, weights = new(rows, size), new(rows, parts.heads * attention.keys)
        # Per visited row, in the steps' order: the cell's r z n gh_n h_{t-1}, h_t, c_t, h~_t;
        # per row as the outputs, f_{t-1}.
        saved_cells = new(visited, 5 * size) if needs_grad else None
        hiddens, contexts, tildes = new(visited, size), new(visited, width), new(visited, size)
        fed = new(rows, size) if needs_grad and initial_feed is not None else None
        state = initial.clone(memory_format=torch.contiguous_format)  # each step updates it
        feed = None if initial_feed is None else initial_feed.clone()  # f_{t-1}, (B, H)
        cell_gates, recurrent = new(batch, gates), new(batch, gates)
        # Each step's products: x @ W^T through ``StepWeight``, each weight packed once here.
        context_weight, hidden_weight = attentional_weight.split([width, size], dim=1)
        feeds = None if feed_weight is None else StepWeight(feed_weight)
        recurs, reads = StepWeight(weight_hh), StepWeight(context_weight)
        hides = StepWeight(hidden_weight)
        done, stride = 0, steps.stride
        for t, (active, start) in enumerate(zip(steps.batch_sizes, steps.starts, strict=True)):
            here = slice(done, done + active)  # this step's visited rows
            cell_input = strided_rows(input_gates, start, stride, active)  # (b, G)
            if feed is not None and feeds is not None:  # + W_if f_{t-1}: (b, H) @ (H, G)
                if fed is not None:
                    strided_rows(fed, start, stride, active).copy_(feed[:active])
                cell_input = cell_gates[:active].copy_(cell_input)
                feeds.into(cell_input, feed[:active], accumulate=True)
            recurs.into(recurrent[:active], state[:active], bias_hh)  # (b, H) @ (H, G)
            cell_input = cell_input.contiguous()  # kept: the C pass reads it by address
            kernels.seq2seq_gru_forward(
                active, size, cell_input.data_ptr(), gates, recurrent.data_ptr(),
                state.data_ptr(), hiddens[done].data_ptr(), size,
                None if saved_cells is None else saved_cells[done].data_ptr(),
            )  # fmt: skip
            attention.forward(
                t, done, state[:active], strided_rows(weights, start, stride, active),
                contexts[here],
            )  # fmt: skip
            # h~_t = tanh(W_c1 c_t + W_c2 h_t [+ bias]): (b, M) @ (M, H) + (b, H) @ (H, H)
            tilde = tildes[here]
            reads.into(tilde, contexts[here], attentional_bias)
            hides.into(tilde, state[:active], accumulate=True)
            tilde.tanh_()
            out = strided_rows(attentionals, start, stride, active)
            if keep is None:
                out.copy_(tilde)
            else:
                torch.mul(tilde, strided_rows(keep, start, stride, active), out=out)
            if feed is not None:
                feed[:active] = out
            done += active
        if needs_grad:
            saved = [
                saved_cells, hiddens, contexts, tildes, fed, weights, feed_weight, weight_hh,
                bias_hh, attentional_weight, keep,
            ]  # fmt: skip
            ctx.save_for_backward(*saved)  # type: ignore[arg-type]  # None: not used
        ctx.steps, ctx.padded_shape, ctx.attention = steps, padded_shape, attention  # type: ignore[attr-defined]
        ctx.feeds = initial_feed is not None  # type: ignore[attr-defined]
        ctx.has_bias = attentional_bias is not None  # type: ignore[attr-defined]
        if padded_shape is not None:  # (B·T, ·) -> (B, T, ·)
            return attentionals.view(*padded_shape, -1), weights.view(*padded_shape, -1)
        return attentionals, weights

    @staticmethod
    @once_differentiable
    def backward(
        ctx: FunctionCtx, d_attentionals: Tensor | None, d_weights: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        kernels = library()
        assert kernels is not None
        (
            saved_cells, hiddens, contexts, tildes, fed, weights, feed_weight, weight_hh,
            bias_hh, attentional_weight, keep,
        ) = ctx.saved_tensors  # type: ignore[attr-defined]  # fmt: skip
        steps: Steps = ctx.steps  # type: ignore[attr-defined]
        attention: LoopAttention = ctx.attention  # type: ignore[attr-defined]
        padded_shape = ctx.padded_shape  # type: ignore[attr-defined]
        rows, keys = weights.shape
        size, gates, width = weight_hh.shape[1], weight_hh.shape[0], contexts.shape[1]
        batch, visited = attention.batch, steps.rows
        context_weight, hidden_weight = attentional_weight.split([width, size], dim=1)
        d_attentionals = contiguous_or_zeros(d_attentionals, (rows, size), contexts)
        d_attentionals = d_attentionals.view(rows, size)
        if d_weights is not None:  # a loss read the weights: (rows, S)
            d_weights = d_weights.contiguous().view(rows, keys)
        new = contexts.new_empty
        d_state = contexts.new_zeros(batch, size)  # dL/dh_t from the steps after t
        d_feed = contexts.new_zeros(batch, size)  # dL/df_t from step t + 1's cell
        d_input_gates = new(rows, gates)
        d_recurrent, d_pres = new(visited, gates), new(visited, size)
        d_hidden, d_context = new(batch, size), new(batch, width)
        # Each step's products: d @ W through ``StepWeight``, each weight packed once here.
        reads = StepWeight(context_weight, transposed=False)
        hides = StepWeight(hidden_weight, transposed=False)
        recurs = StepWeight(weight_hh, transposed=False)
        feeds = None if feed_weight is None else StepWeight(feed_weight, transposed=False)
        attention.start_backward()
        done, stride = visited, steps.stride
        for t in reversed(range(len(steps.batch_sizes))):
            active, start = steps.batch_sizes[t], steps.starts[t]
            done -= active
            here = slice(done, done + active)
            # dL/df_t: the output's and step t + 1's; then through the dropout and the tanh.
            d_out = strided_rows(d_attentionals, start, stride, active) + d_feed[:active]
            if keep is not None:
                d_out *= strided_rows(keep, start, stride, active)
            d_pre = d_pres[here]  # dL/d(W_c [c; h]) = d_out (1 - h~²): (b, H)
            torch.mul(d_out, 1 - tildes[here].square(), out=d_pre)
            reads.into(d_context[:active], d_pre)  # (b, H) @ (H, M)
            hides.into(d_hidden[:active], d_pre)  # (b, H) @ (H, H)
            attention.backward(
                t, done, strided_rows(weights, start, stride, active), d_context[:active],
                None if d_weights is None else strided_rows(d_weights, start, stride, active),
                d_hidden[:active],
            )  # fmt: skip
            kernels.seq2seq_gru_backward(
                active, size, d_state.data_ptr(), d_hidden.data_ptr(), size,
                saved_cells[done].data_ptr(), row_at(d_input_gates, start), stride * gates,
                d_recurrent[done].data_ptr(),
            )  # fmt: skip
            # dL/dh_{t-1} += d_gh @ W_hh: (b, G) @ (G, H)
            recurs.into(d_state[:active], d_recurrent[here], accumulate=True)
            if feeds is not None:  # dL/df_{t-1} = d_gi @ W_if: (b, G) @ (G, H)
                feeds.into(d_feed[:active], strided_rows(d_input_gates, start, stride, active))
        # The weight gradients, one GEMM each over all the steps' rows: (H, N') @ (N', M + H),
        # (G, N') @ (N', H) with each row's h_{t-1}, (G, N) @ (N, H).
        d_attentional_weight = d_pres.t() @ torch.cat([contexts, hiddens], dim=1)
        d_weight_hh = d_recurrent.t() @ saved_cells[:, 4 * size :]
        d_feed_weight = None if fed is None else d_input_gates.t() @ fed
        if padded_shape is not None:
            d_input_gates = d_input_gates.view(*padded_shape, gates)
        return (
            d_input_gates,
            d_state,
            d_feed if ctx.feeds else None,  # type: ignore[attr-defined]
            *attention.gradients(hiddens),  # each query came from h_t
            d_feed_weight,
            d_weight_hh,
            None if bias_hh is None else d_recurrent.sum(0),
            d_attentional_weight,
            d_pres.sum(0) if ctx.has_bias else None,  # type: ignore[attr-defined]
            None,
            None,
            None,
        )


class AttentionLoop(torch.autograd.Function):
    """The Luong decoder's attention step by step where only the attention waits for the step
    before (coverage without input feeding): the cell has run over every step already (its C
    loop, ``gru_steps``), and the attentional layer runs over every row after (one GEMM). In
    between, step t's attention from h_t with the coverage of the steps before it, through
    ``LoopAttention`` as in ``SequentialRecurrence``, but with no cell and no readout per step.

    hiddens (N, H), each step's rows together (``steps.stride`` 1: packed rows, or a padded
    batch time-major), then ``SequentialRecurrence``'s attention inputs (projected keys ...
    local-p's v_p), ``parts`` and ``steps`` -> contexts (N, h·d or M) and weights (N, h·S).
    Without local-p (whose centres the states predict), ``hiddens`` may be the queries
    themselves, W_q h + b_q (N, A or h·K) of every row projected before the loop, with W_q,
    b_q and the heads' W_q and b_q None. ``library.usable`` must hold.
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        hiddens: Tensor,
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
        parts: StepAttention,
        steps: Steps,
    ) -> tuple[Tensor, Tensor]:
        kernels = library()
        assert kernels is not None  # usable() checked it
        assert steps.stride == 1 and steps.rows == hiddens.shape[0]  # a step's rows together
        hiddens = hiddens.contiguous()  # a step's rows are the queries the C parts read
        rows, size = hiddens.shape
        needs_grad = any(ctx.needs_input_grad)  # type: ignore[attr-defined]
        attention = LoopAttention(
            kernels, parts, (
                projected_keys, memory, src_lens, query_weight, query_bias, heads_weight,
                heads_bias, score_weight, key_bias, alpha, temperature, coverage_weight,
                initial_coverage, centre_weight, centre_vector,
            ), steps.batch_sizes[0], size, steps, needs_grad,
        )  # fmt: skip
        contexts = hiddens.new_empty(rows, parts.heads * attention.value_size)
        weights = hiddens.new_empty(rows, parts.heads * attention.keys)
        for t, (active, start) in enumerate(zip(steps.batch_sizes, steps.starts, strict=True)):
            here = slice(start, start + active)  # every row is visited: start = rows done
            attention.forward(t, start, hiddens[here], weights[here], contexts[here])
        if needs_grad:
            ctx.save_for_backward(hiddens, weights)
        ctx.steps, ctx.attention = steps, attention  # type: ignore[attr-defined]
        return contexts, weights

    @staticmethod
    @once_differentiable
    def backward(
        ctx: FunctionCtx, d_contexts: Tensor | None, d_weights: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        hiddens, weights = ctx.saved_tensors  # type: ignore[attr-defined]
        steps: Steps = ctx.steps  # type: ignore[attr-defined]
        attention: LoopAttention = ctx.attention  # type: ignore[attr-defined]
        rows = hiddens.shape[0]
        width = attention.heads * attention.value_size
        d_contexts = contiguous_or_zeros(d_contexts, (rows, width), hiddens)
        if d_weights is not None:  # a loss read the weights
            d_weights = d_weights.contiguous()
        d_hiddens = torch.zeros_like(hiddens)  # each step's query gradient, added by backward
        attention.start_backward()
        for t in reversed(range(len(steps.batch_sizes))):
            active, start = steps.batch_sizes[t], steps.starts[t]
            here = slice(start, start + active)
            attention.backward(
                t, start, weights[here], d_contexts[here],
                None if d_weights is None else d_weights[here], d_hiddens[here],
            )  # fmt: skip
        return d_hiddens, *attention.gradients(hiddens), None, None
