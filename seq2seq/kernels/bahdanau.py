"""The Bahdanau decoder's teacher-forced recurrence on the CPU as one autograd node.

Under teacher forcing the Bahdanau decoder (``decoder.BahdanauDecoder``) steps T times: the
previous state attends over the source, and the context it reads enters the GRU cell. Through
autograd each step is some twenty small ATen kernels and as many autograd nodes, and every
step's weight gradients are GEMMs over only the B rows of that step. Here a step is three or four
GEMMs (torch's BLAS: the additive query projection, the context's and the state's gate
projections), the attention's C parts (``attention_parts.StepAttention``: the score, the
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

from seq2seq.kernels.attention_parts import (
    AttentionGrads,
    AttentionSource,
    StepAttention,
    temperature_gradient,
)
from seq2seq.kernels.gru import Steps
from seq2seq.kernels.library import FLOAT_BYTES, library


class Recurrence(torch.autograd.Function):
    """input_gates (B, T, G) = W_ie e + b_ih of every step, initial (B, H), projected keys
    (B, S, K), memory (B, S, M), src_lens (B,), then W_q (A, H) and b_q (A,) (additive scoring;
    None for a product's q = s), w_v (1, A) (additive; else None), the key bias (P,) or None,
    a learned α (0-d) or None, a learned temperature (0-d) or None, the coverage weight (w_c
    (A,) or γ (0-d)) and the coverage before the first step (B, S) or None each, local-p's W_p
    (H, H) and v_p (1, H) or None each, W_ic (G, M)
    (the context's part of the cell's input weight), W_hh (G, H), b_hh (G,) or None, and
    ``parts``, the attention's C twins
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
        input_gates = input_gates.contiguous()
        rows, gates = input_gates.shape
        batch, size = initial.shape
        keys, key_size = projected_keys.shape[1], projected_keys.shape[2]
        memory_size = memory.shape[2]
        source = AttentionSource.of(
            projected_keys, memory, src_lens, score_weight, key_bias, alpha, coverage_weight,
            temperature,
        )  # fmt: skip
        states = input_gates.new_empty(rows, size)
        contexts = input_gates.new_empty(rows, memory_size)
        weights = input_gates.new_empty(rows, keys)
        needs_grad = any(ctx.needs_input_grad)  # type: ignore[attr-defined]
        # Per visited row, in the steps' order: what the score's backward reads (additive: the
        # sigmoid(2x) of every (row, key) pair; a product: the query, s_{t-1}), and r z n gh_n h.
        saved_scores = saved_queries = None
        if needs_grad and parts.projects_queries:
            saved_scores = input_gates.new_empty(steps.rows, keys, key_size)
        elif needs_grad:
            saved_queries = input_gates.new_empty(steps.rows, size)
        saved_norm = None  # an additive layer norm's, per visited row
        if needs_grad:
            saved_norm = parts.layer_norm_buffers(steps.rows, keys, key_size, input_gates)
        saved_cells = input_gates.new_empty(steps.rows, 5 * size) if needs_grad else None
        # A learned temperature's gradient reads each visited row's logits from the score.
        saved_logits = None
        if needs_grad and parts.learned_temperature:
            saved_logits = input_gates.new_empty(steps.rows, keys)
        # What each sentence attended so far (B, S), updated after every step, and per visited
        # row the coverage its step read, for the backward pass.
        coverage = saved_coverage = None
        if initial_coverage is not None:
            coverage = initial_coverage.clone(memory_format=torch.contiguous_format)
            saved_coverage = input_gates.new_empty(steps.rows, keys) if needs_grad else None
        # Local-p's p_t, predicted from each step's query (None for other windows).
        centres = None
        if centre_weight is not None and centre_vector is not None:
            centres = PredictedCentres(
                centre_weight, centre_vector, source.src_lens, steps.rows, keys, needs_grad
            )
        state = initial.clone(memory_format=torch.contiguous_format)  # each step updates it
        query = input_gates.new_empty(batch, key_size) if parts.projects_queries else state
        logits = input_gates.new_empty(batch, keys)  # scratch: a step's scores
        cell_gates = input_gates.new_empty(batch, gates)
        recurrent = input_gates.new_empty(batch, gates)
        # The keys each sentence reads: the same at every step, or (a window centred on t or on
        # a predicted p_t) one set per step, kept for the backward pass.
        per_step = parts.needs_positions or parts.needs_centres
        step_spans = [] if per_step else [parts.spans(kernels, batch, 1, source)]
        done = 0  # rows of the steps before t
        stride = steps.stride
        for t, (active, start) in enumerate(zip(steps.batch_sizes, steps.starts, strict=True)):
            # The step's first ``active`` sentences, rows start, start + stride, ... of each.
            here = slice(done, done + active)  # this step's visited rows
            if parts.needs_positions:
                positions = torch.full((batch,), t, dtype=torch.int64)
                step_spans.append(parts.spans(kernels, batch, 1, source, positions))
            step_centres = normalized = None
            if centres is not None:  # p_t from s_{t-1}: (b,)
                step_centres = centres.forward(state[:active], done)
                step_spans.append(parts.spans(kernels, active, 1, source, centres=step_centres))
                normalized = centres.normalized_rows(done, active)
            if saved_coverage is not None and coverage is not None:
                saved_coverage[done : done + active] = coverage[:active]
            if query_weight is not None:  # q = W_q s_{t-1} + b_q: (b, H) -> (b, A)
                linear_into(query[:active], state[:active], query_weight, query_bias)
            elif saved_queries is not None:
                saved_queries[done : done + active] = state[:active]
            parts.forward(
                kernels, active, 1, query.data_ptr(), source, step_spans[-1].data_ptr(),
                None if saved_scores is None else saved_scores[done].data_ptr(), logits,
                row_at(weights, start), stride * keys, row_at(contexts, start),
                stride * memory_size, None if coverage is None else coverage[:active],
                None if saved_logits is None else saved_logits[done : done + active],
                step_centres, normalized,
                None if saved_norm is None else (saved_norm[0][here], saved_norm[1][here]),
            )  # fmt: skip
            if coverage is not None:  # c_{t+1} = c_t + a_t: (b, S)
                coverage[:active] += strided_rows(weights, start, stride, active)
            # W_ie e + b_ih + W_ic c: (b, G) + (b, M) @ (M, G)
            torch.addmm(
                strided_rows(input_gates, start, stride, active),
                strided_rows(contexts, start, stride, active),
                context_weight.t(),
                out=cell_gates[:active],
            )
            linear_into(recurrent[:active], state[:active], weight_hh, bias_hh)  # (b, G)
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
            saved = [
                saved_scores, saved_queries, saved_cells, contexts, weights, source.keys,
                source.memory, source.src_lens, query_weight, query_bias, source.score_weight,
                source.key_bias, alpha, temperature, coverage_weight, saved_coverage,
                saved_logits, context_weight, weight_hh, bias_hh, *(saved_norm or (None, None)),
            ]  # fmt: skip
            ctx.save_for_backward(*saved)  # None: not this scoring's
        ctx.steps, ctx.padded_shape, ctx.parts = steps, padded_shape, parts  # type: ignore[attr-defined]
        ctx.step_spans, ctx.centres = step_spans, centres  # type: ignore[attr-defined]
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
        (
            saved_scores, saved_queries, saved_cells, contexts, weights, projected_keys, memory,
            src_lens, query_weight, query_bias, score_weight, key_bias, alpha, temperature,
            coverage_weight, saved_coverage, saved_logits, context_weight, weight_hh, bias_hh,
            normed, rstd,
        ) = ctx.saved_tensors  # type: ignore[attr-defined]  # fmt: skip
        source = AttentionSource.of(
            projected_keys, memory, src_lens, score_weight, key_bias, alpha, coverage_weight,
            temperature,
        )  # fmt: skip
        steps: Steps = ctx.steps  # type: ignore[attr-defined]
        parts: StepAttention = ctx.parts  # type: ignore[attr-defined]
        centres: PredictedCentres | None = ctx.centres  # type: ignore[attr-defined]
        padded_shape = ctx.padded_shape  # type: ignore[attr-defined]
        rows, keys = weights.shape
        batch, key_size = projected_keys.shape[0], projected_keys.shape[2]
        size, gates, memory_size = weight_hh.shape[1], weight_hh.shape[0], memory.shape[2]
        d_states = contiguous_or_zeros(d_states, (rows, size), memory).view(rows, size)
        d_contexts = contiguous_or_zeros(d_contexts, (rows, memory_size), memory)
        d_contexts = d_contexts.view(rows, memory_size)
        if d_weights is not None:  # a loss read the weights: (rows, S)
            d_weights = d_weights.contiguous().view(rows, keys)
        d_state = memory.new_zeros(batch, size)  # dL/ds_t from the steps after t
        d_input_gates = memory.new_empty(rows, gates)
        d_recurrent = memory.new_empty(steps.rows, gates)  # in the steps' order, as saved
        d_queries = memory.new_empty(steps.rows, key_size)
        d_context = memory.new_empty(batch, memory_size)
        scratch = (memory.new_empty(batch, keys), memory.new_empty(batch, keys))
        grads = AttentionGrads.zeros(source, batch)  # w_v's per sentence, summed below
        # dL/dc_{t+1} while step t is undone (c_{t+1} = c_t + a_t: a_t's gradient too), and
        # the part a step's own score adds.
        d_coverage = d_step_coverage = None
        if saved_coverage is not None:
            d_coverage = memory.new_zeros(batch, keys)
            d_step_coverage = memory.new_empty(batch, keys)
        step_spans: list[Tensor] = ctx.step_spans  # type: ignore[attr-defined]
        done = steps.rows
        stride = steps.stride
        for t in reversed(range(len(steps.batch_sizes))):
            active, start = steps.batch_sizes[t], steps.starts[t]
            spans = step_spans[t if parts.needs_positions or parts.needs_centres else 0]
            done -= active
            here = slice(done, done + active)  # this step's visited rows
            kernels.seq2seq_gru_backward(
                active, size, d_state.data_ptr(), row_at(d_states, start), stride * size,
                saved_cells[done].data_ptr(), row_at(d_input_gates, start), stride * gates,
                d_recurrent[done].data_ptr(),
            )  # fmt: skip
            # dL/ds_{t-1} += d_gh @ W_hh: (b, G) @ (G, H)
            d_state[:active].addmm_(d_recurrent[done : done + active], weight_hh)
            # dL/dc_t: the output's part plus d_gi @ W_ic, (b, M) + (b, G) @ (G, M)
            torch.addmm(
                strided_rows(d_contexts, start, stride, active),
                strided_rows(d_input_gates, start, stride, active),
                context_weight,
                out=d_context[:active],
            )
            # The weights' own gradient: a loss's, and the later steps' through the coverage.
            d_weights_out = None if d_weights is None else (row_at(d_weights, start), stride * keys)
            if d_coverage is not None:
                d_step = d_coverage[:active].clone()  # (b, S)
                if d_weights is not None:
                    d_step += strided_rows(d_weights, start, stride, active)
                d_weights_out = (d_step.data_ptr(), keys)
            parts.backward(
                kernels, active, 0 if saved_queries is None else saved_queries[done].data_ptr(),
                source, spans.data_ptr(),
                None if saved_scores is None else saved_scores[done].data_ptr(),
                row_at(weights, start), stride * keys, d_context.data_ptr(), memory_size,
                d_weights_out, scratch, d_queries[done].data_ptr(), grads,
                None if saved_coverage is None else saved_coverage[done : done + active],
                None if d_step_coverage is None else d_step_coverage[:active],
                1, None if saved_logits is None else saved_logits[done : done + active],
                None if centres is None else centres.backward_rows(done, active),
                None if normed is None else (normed[here], rstd[here]),
            )  # fmt: skip
            if centres is not None:  # dL/ds_{t-1} through p_t
                d_state[:active] += centres.backward(done, active)
            if d_coverage is not None and d_step_coverage is not None:
                d_coverage[:active] += d_step_coverage[:active]
            if query_weight is not None:  # dL/ds_{t-1} += d_q @ W_q: (b, A) @ (A, H)
                d_state[:active].addmm_(d_queries[done : done + active], query_weight)
            else:  # q = s_{t-1}
                d_state[:active] += d_queries[done : done + active]
        # Each visited row's state before its step: (N', H) of the saved cells, row stride 5H.
        previous = saved_cells[:, 4 * size :]
        # The weight gradients, one GEMM each over all steps' rows:
        # (A, N') @ (N', H); (G, N) @ (N, M); (G, N') @ (N', H).
        d_query_weight = None if query_weight is None else d_queries.t() @ previous
        d_context_weight = d_input_gates.t() @ contexts
        d_weight_hh = d_recurrent.t() @ previous
        d_centre_weight = d_centre_vector = None
        if centres is not None:
            d_centre_weight, d_centre_vector = centres.weight_gradients(previous)
        if padded_shape is not None:
            d_input_gates = d_input_gates.view(*padded_shape, gates)
        d_score_weight = grads.d_score_weight
        return (
            d_input_gates,
            d_state,
            grads.d_keys,
            grads.d_memory,
            None,
            d_query_weight,
            None if query_bias is None else d_queries.sum(0),
            None if d_score_weight is None else d_score_weight.sum(0).view_as(score_weight),
            grads.d_key_bias,
            None if grads.d_alpha is None else grads.d_alpha.sum().view_as(alpha),
            temperature_gradient(grads.d_temperature, temperature),
            None if grads.d_coverage_weight is None else grads.d_coverage_weight.sum(0),
            d_coverage,
            d_centre_weight,
            d_centre_vector,
            d_context_weight,
            d_weight_hh,
            None if bias_hh is None else d_recurrent.sum(0),
            None,
            None,
        )


class PredictedCentres:
    """Local-p's centres inside the loop, ``LocalWindow.centres``: p_t = (S_b - 1) ·
    σ(v_p · tanh(W_p s_{t-1})) for each visited row (N' of them, in the steps' order), with
    what the backward pass reads: tanh(W_p s) (N', H), σ (N',), p_t (N',) and the weights
    before the Gaussian (N', S) (``StepAttention.forward``'s ``normalized``)."""

    def __init__(
        self,
        weight: Tensor,
        vector: Tensor,
        src_lens: Tensor,
        rows: int,
        keys: int,
        needs_grad: bool,
    ) -> None:
        self.weight, self.vector = weight, vector  # W_p (H, H), v_p (1, H)
        self.last = (src_lens - 1).clamp(min=0).to(weight.dtype)  # (B,): S_b - 1
        self.features = weight.new_empty(rows, weight.shape[0])
        self.gates = weight.new_empty(rows)
        self.centres = weight.new_empty(rows)
        self.normalized = weight.new_empty(rows, keys) if needs_grad else None
        self.d_centres = weight.new_zeros(rows) if needs_grad else None
        self.d_predicted = weight.new_empty(rows) if needs_grad else None
        self.d_projected = weight.new_empty(rows, weight.shape[0]) if needs_grad else None

    def forward(self, state: Tensor, done: int) -> Tensor:
        """p_t of the step's rows, from s_{t-1} (b, H) -> (b,); rows done .. done + b."""
        active = state.shape[0]
        features = self.features[done : done + active]
        torch.tanh(state @ self.weight.t(), out=features)  # (b, H) @ (H, H)
        gate = self.gates[done : done + active]
        torch.sigmoid(features @ self.vector[0], out=gate)  # (b, H) @ (H,) -> (b,)
        centres = self.centres[done : done + active]
        torch.mul(self.last[:active], gate, out=centres)
        return centres

    def normalized_rows(self, done: int, active: int) -> Tensor | None:
        return None if self.normalized is None else self.normalized[done : done + active]

    def backward_rows(self, done: int, active: int) -> tuple[Tensor, Tensor, Tensor]:
        """What ``StepAttention.backward`` reads and writes for local-p: centres, normalized
        weights, and where the centres' gradient is added."""
        assert self.normalized is not None and self.d_centres is not None
        rows = slice(done, done + active)
        return self.centres[rows], self.normalized[rows], self.d_centres[rows]

    def backward(self, done: int, active: int) -> Tensor:
        """dL/ds_{t-1} (b, H) through p_t, from the centres' gradient; keeps what the weight
        gradients need."""
        assert self.d_centres is not None and self.d_predicted is not None
        assert self.d_projected is not None
        rows = slice(done, done + active)
        gate, features = self.gates[rows], self.features[rows]
        # p = last σ(z): dz = dp · last · σ (1 - σ), z = v_p · u, u = tanh(W_p s).
        d_predicted = self.d_predicted[rows]
        torch.mul(self.d_centres[rows] * self.last[:active], gate * (1 - gate), out=d_predicted)
        d_projected = self.d_projected[rows]  # dL/d(W_p s) = dz v_p (1 - u²): (b, H)
        torch.mul(d_predicted[:, None] * self.vector, 1 - features.square(), out=d_projected)
        return d_projected @ self.weight  # (b, H) @ (H, H)

    def weight_gradients(self, previous: Tensor) -> tuple[Tensor, Tensor]:
        """dL/dW_p (H, H) and dL/dv_p (1, H), one GEMM each over the visited rows, from each
        row's state before its step, previous (N', H)."""
        assert self.d_projected is not None and self.d_predicted is not None
        return self.d_projected.t() @ previous, (self.d_predicted @ self.features)[None]


def linear_into(out: Tensor, inputs: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    """out = inputs @ weight.T (+ bias), written in place: (N, I) @ (I, O) -> (N, O)."""
    if bias is None:
        torch.mm(inputs, weight.t(), out=out)
    else:
        torch.addmm(bias, inputs, weight.t(), out=out)


def row_at(tensor: Tensor, row: int) -> int:
    """The address of row ``row`` of a contiguous (N, D) float32 tensor."""
    return tensor.data_ptr() + row * tensor.shape[1] * FLOAT_BYTES


def strided_rows(tensor: Tensor, start: int, stride: int, count: int) -> Tensor:
    """Rows start, start + stride, ... (``count`` of them) of a contiguous (N, D) tensor, as a
    (count, D) view."""
    width = tensor.shape[1]
    offset = tensor.storage_offset() + start * width
    return tensor.as_strided((count, width), (stride * width, 1), offset)


def contiguous_or_zeros(grad: Tensor | None, shape: tuple[int, ...], like: Tensor) -> Tensor:
    """An output's gradient, contiguous; zeros where the output was not used (autograd's None)."""
    return like.new_zeros(shape) if grad is None else grad.contiguous()
