"""The attention inside a decoder's step loop, one step at a time: what ``bahdanau.Recurrence`` and
``luong.SequentialRecurrence`` share.

A step's attention reads the state the loop has just reached (the Bahdanau decoder's s_{t-1},
the Luong decoder's h_t): ``LoopAttention.forward`` projects it into the query (additive
scoring's W_q s + b_q, or several heads' at once), runs the parts' C twins over the step's rows
(``attention_parts.StepAttention``), with the coverage so far and local-p's centre predicted
from the state, and keeps per visited row what the backward pass reads. ``backward`` undoes a
step in reverse, adding the query's gradient into the state's, and ``gradients`` gives every
attention input's gradient after the loop, the projections' as one GEMM over all rows.

Several heads (``StepAttention.heads`` h > 1, ``FastDecoder.loop_inputs``): row r's head i
is row r·h + i of the parts' rows, reading sentence b·h + i of keys and values split into heads;
the heads' weights and contexts lie side by side in a row (…, h·S), (…, h·d). The coverage is
the heads' average, and head i's logits add γ_i times it (``MultiHeadAttention.forward``). An
additive score's queries are two GEMMs a step, as the block computes them: the block's W_q s +
b_q (b, D) with D = h·d, then the score's W_a of each head's d features, (b·h, d) @ (d, A) ->
(b, h·A). One folded (h·A, H) weight would cost h·A·H multiply-adds a row where the two cost
D·(H + A): twice as many for four heads with A = H = D.

Shape legend: B batch, S source length, H state size, A additive attention size, K key size (A,
or the query's for product scoring), h heads, d a head's value size, N' rows the steps visit.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from seq2seq.kernels.attention_parts import (
    AttentionGrads,
    AttentionSource,
    StepAttention,
    temperature_gradient,
)
from seq2seq.kernels.gru import Steps
from seq2seq.kernels.library import FLOAT_BYTES
from seq2seq.kernels.step_gemm import StepWeight


class LoopAttention:
    """One decoder loop's attention, step by step (module docstring). Built from the loop's
    attention inputs: projected keys (B·h, S, K), memory (B·h, S, d), src_lens (B·h,), W_q
    (A, H), (h·K, H) or with heads' additive queries (A, d), and b_q, or None each (the state
    is the query), the heads' own W_q (D, H) and b_q (D,) before an additive score's (module
    docstring), w_v, the key bias, a learned α, a learned T, the coverage weight (w_c (A,), γ
    (0-d) or the heads' γ (h,)) and the coverage before the first step (B, S), local-p's W_p
    (H, H) and v_p (1, H), or None each; then the loop's batch B, state size H and
    ``steps``."""

    def __init__(
        self,
        kernels: ctypes.CDLL,
        parts: StepAttention,
        attention_inputs: tuple[Tensor | None, ...],
        batch: int,
        size: int,
        steps: Steps,
        needs_grad: bool,
    ) -> None:
        (
            keys, memory, src_lens, query_weight, query_bias, heads_weight, heads_bias,
            score_weight, key_bias, alpha, temperature, coverage_weight, initial_coverage,
            centre_weight, centre_vector,
        ) = attention_inputs  # fmt: skip
        assert keys is not None and memory is not None and src_lens is not None
        self.kernels, self.parts, self.heads, self.batch = kernels, parts, parts.heads, batch
        heads = self.heads
        # The heads' γ (h,) multiplies the coverage before the C twin, which then adds it as is.
        self.gamma = None
        if heads > 1 and coverage_weight is not None:
            self.gamma = coverage_weight.detach()
        self.source = AttentionSource.of(
            keys, memory, src_lens, score_weight, key_bias, alpha,
            coverage_weight if self.gamma is None else keys.new_ones(()), temperature,
        )  # fmt: skip
        self.keys, self.key_size = keys.shape[1], keys.shape[2]
        self.value_size = memory.shape[2]
        self.query_weight, self.query_bias = query_weight, query_bias
        self.heads_weight, self.heads_bias = heads_weight, heads_bias
        # The query's products, W_q s and the heads' W_q s, each weight packed once per loop.
        self.queries = None if query_weight is None else StepWeight(query_weight)
        self.head_projection = None if heads_weight is None else StepWeight(heads_weight)
        self.score_weight, self.alpha, self.temperature = score_weight, alpha, temperature
        self.coverage_weight = coverage_weight
        self.steps = steps
        query_width = size if query_weight is None else query_weight.shape[0]  # H, A or h·K
        visited, new = steps.rows * heads, keys.new_empty
        # The heads' W_q s + b_q (b, D) of each visited row, which W_a's gradient reads.
        self.head_queries = None
        if heads_weight is not None:
            query_width *= heads  # h·A
            kept = steps.rows if needs_grad else batch
            self.head_queries = new(kept, heads_weight.shape[0])
        self.needs_grad = needs_grad
        self.query = None if query_weight is None else new(batch, query_width)
        # Per visited row, in the steps' order: what the score's backward reads (the tanh(x) of
        # every (row, key) pair where an additive score keeps it, ``saves_scores``; else the
        # query it recomputes from), an additive layer norm's features, and the logits where a
        # learned temperature's gradient reads them.
        self.saved_scores = self.saved_queries = self.saved_logits = None
        if needs_grad and parts.saves_scores:
            self.saved_scores = new(visited, self.keys, self.key_size)
        elif needs_grad:
            self.saved_queries = new(steps.rows, query_width)
        if needs_grad and parts.learned_temperature:
            self.saved_logits = new(visited, self.keys)
        self.saved_norm = None
        if needs_grad:
            self.saved_norm = parts.layer_norm_buffers(visited, self.keys, self.key_size, keys)
        # What each sentence attended so far (B, S), updated after every step, and per visited
        # row the coverage its step read; with heads, what each head read, γ_i c (b·h, S), per
        # visited row where the backward pass reads it again.
        self.coverage = self.saved_coverage = self.head_coverage = None
        if initial_coverage is not None:
            self.coverage = initial_coverage.clone(memory_format=torch.contiguous_format)
            self.saved_coverage = new(steps.rows, self.keys) if needs_grad else None
            if heads > 1:
                self.head_coverage = new((steps.rows if needs_grad else batch) * heads, self.keys)
        self.centres = None  # local-p's p_t, predicted from each step's state
        if centre_weight is not None and centre_vector is not None:
            self.centres = PredictedCentres(
                kernels, centre_weight, centre_vector, src_lens[::heads], steps.rows, self.keys,
                needs_grad, heads,
            )  # fmt: skip
        self.logits = new(batch * heads, self.keys)  # scratch: a step's scores
        # The keys each row reads: the same at every step, or (a window centred on t or on a
        # predicted p_t) one set per step, kept for the backward pass.
        self.per_step = parts.needs_positions or parts.needs_centres
        self.step_spans = [] if self.per_step else [self.spans_for(batch)]

    def spans_for(
        self, rows: int, positions: Tensor | None = None, centres: Tensor | None = None
    ) -> Tensor:
        """``StepAttention.spans`` of the first ``rows`` sentences' heads."""
        return self.parts.spans(self.kernels, rows * self.heads, 1, self.source, positions, centres)

    def forward(self, t: int, done: int, state: Tensor, weights: Tensor, contexts: Tensor) -> None:
        """Step t's attention from ``state`` (b, H), the first b sentences' (``done`` rows
        visited before): the weights into ``weights`` (b, h·S) and the contexts into
        ``contexts`` (b, h·d), views of the loop's outputs (with heads, contiguous rows)."""
        active, heads, parts = state.shape[0], self.heads, self.parts
        rows = slice(done * heads, (done + active) * heads)  # this step's rows of the parts
        if parts.needs_positions:  # local-m's p_t = t
            positions = torch.full((self.batch * heads,), t, dtype=torch.int64)
            self.step_spans.append(self.spans_for(self.batch, positions))
        step_centres = normalized = None
        if self.centres is not None:  # p_t from the state: (b·h,)
            step_centres = self.centres.forward(state, done)
            self.step_spans.append(self.spans_for(active, centres=step_centres))
            normalized = self.centres.normalized_rows(done, active)
        coverage = self.step_coverage(done, active)
        query = state
        if self.query is not None and self.query_weight is not None:  # q = W_q s + b_q
            query = self.query[:active]  # (b, H) -> (b, A or h·K)
            if self.heads_weight is None:
                assert self.queries is not None  # a W_q
                self.queries.into(query, state, self.query_bias)
            else:
                self.project_heads(done, state, query)
        if self.saved_queries is not None:
            self.saved_queries[done : done + active] = query
        parts.forward(
            self.kernels, active * heads, 1, query.data_ptr(), self.source,
            self.step_spans[-1].data_ptr(),
            None if self.saved_scores is None else self.saved_scores[rows.start].data_ptr(),
            self.logits, weights.data_ptr(), weights.stride(0) // heads, contexts.data_ptr(),
            contexts.stride(0) // heads, coverage,
            None if self.saved_logits is None else self.saved_logits[rows], step_centres,
            normalized, None if self.saved_norm is None else self.norm_rows(rows),
        )  # fmt: skip
        if self.coverage is not None:  # c_{t+1} = c_t + a_t (the heads' average): (b, S)
            step = weights if heads == 1 else weights.view(active, heads, -1).mean(dim=1)
            self.coverage[:active] += step

    def project_heads(self, done: int, state: Tensor, query: Tensor) -> None:
        """The heads' additive queries into ``query`` (b, h·A) from ``state`` (b, H): the
        block's W_q s + b_q (b, D), then W_a of each head's d features (module docstring)."""
        assert self.head_queries is not None and self.query_weight is not None
        active = state.shape[0]
        at = done if self.needs_grad else 0  # kept per visited row only for the backward pass
        head_queries = self.head_queries[at : at + active]  # (b, D)
        assert self.head_projection is not None and self.queries is not None
        self.head_projection.into(head_queries, state, self.heads_bias)  # (b, H) @ (H, D)
        per_head = active * self.heads  # (b·h, d) @ (d, A) -> (b·h, A), i.e. (b, h·A)
        queries = query.view(per_head, -1)
        self.queries.into(queries, head_queries.view(per_head, -1), self.query_bias)

    def step_coverage(self, done: int, active: int) -> Tensor | None:
        """The coverage a step's rows read (b·h, S), kept per visited row for the backward pass:
        the sentences' (b, S), or with heads γ_i c for head i; None without coverage."""
        if self.coverage is None:
            return None
        if self.saved_coverage is not None:
            self.saved_coverage[done : done + active] = self.coverage[:active]
        if self.gamma is None or self.head_coverage is None:
            return self.coverage[:active]
        at = done if self.needs_grad else 0
        scaled = self.head_coverage[at * self.heads : (at + active) * self.heads]
        # (h, 1) · (b, 1, S) -> (b, h, S)
        per_head = scaled.view(active, self.heads, -1)
        torch.mul(self.gamma[:, None], self.coverage[:active, None], out=per_head)
        return scaled

    def norm_rows(self, rows: slice) -> tuple[Tensor, Tensor]:
        assert self.saved_norm is not None
        return self.saved_norm[0][rows], self.saved_norm[1][rows]

    def start_backward(self) -> None:
        """Where ``backward`` adds, zeros to start, before the loop's last step is undone."""
        batch, heads, keys = self.batch, self.heads, self.keys
        new = self.source.memory.new_empty
        width = heads * self.key_size
        self.d_queries = new(self.steps.rows, width)
        self.d_head_queries = None  # dL/d(W_q s + b_q) of the heads' additive queries (N', D)
        if self.head_queries is not None:
            self.d_head_queries = new(self.steps.rows, self.head_queries.shape[1])
        self.scratch = (new(batch * heads, keys), new(batch * heads, keys))
        self.grads = AttentionGrads.zeros(self.source, batch * heads)  # per row, summed after
        # dL/dc_{t+1} while step t is undone (c_{t+1} = c_t + a_t: a_t's gradient too), and
        # the part a step's own score adds (per head row).
        self.d_coverage = self.d_step_coverage = None
        if self.saved_coverage is not None:
            self.d_coverage = self.source.memory.new_zeros(batch, keys)
            # With γ, per visited row: γ's gradient sums them all after the loop.
            visited = self.steps.rows if self.gamma is not None else batch
            self.d_step_coverage = new(visited * heads, keys)
        # dL/ds's products, d_q @ W_q and the heads' d @ W_q, each weight packed once.
        weight, heads_weight = self.query_weight, self.heads_weight
        self.d_queries_of = None if weight is None else StepWeight(weight, transposed=False)
        self.d_heads_of = None
        if heads_weight is not None:
            self.d_heads_of = StepWeight(heads_weight, transposed=False)

    def backward(
        self,
        t: int,
        done: int,
        weights: Tensor,
        d_context: Tensor,
        d_weights: Tensor | None,
        d_state: Tensor,
    ) -> None:
        """Undo step t for its b sentences: from the contexts' gradient ``d_context`` (b, h·d,
        contiguous) and the weights' own (``d_weights``, a view (b, h·S) of a loss's, or None),
        with ``weights`` the step's (b, h·S) view, add the query's gradient into ``d_state``
        (b, H) and the rest where ``gradients`` reads it."""
        active, heads, parts = d_state.shape[0], self.heads, self.parts
        rows = slice(done * heads, (done + active) * heads)
        spans = self.step_spans[t if self.per_step else 0]
        d_weights_out = None
        if d_weights is not None:  # its address and a head row's stride
            d_weights_out = (d_weights.data_ptr(), d_weights.stride(0) // heads)
        d_step = None  # the weights' gradient with the later steps' through the coverage
        if self.d_coverage is not None and heads == 1 and d_weights is None:
            # dL/da_t = dL/dc_{t+1}: read in place (the C pass reads it before it is added to)
            d_weights_out = (self.d_coverage.data_ptr(), self.keys)
        elif self.d_coverage is not None:
            d_step = self.d_coverage[:active, None, :].expand(active, heads, -1) / heads
            if d_weights is not None:
                d_step = d_step + d_weights.view(active, heads, -1)
            d_step = d_step.contiguous()  # (b, h, S): kept alive through the C call
            d_weights_out = (d_step.data_ptr(), self.keys)
        coverage = d_step_coverage = None
        if self.saved_coverage is not None and self.d_step_coverage is not None:
            if self.gamma is not None and self.head_coverage is not None:
                coverage = self.head_coverage[rows]  # what the heads read: γ_i c, (b·h, S)
                d_step_coverage = self.d_step_coverage[rows]  # kept per visited row for γ
            else:
                coverage = self.saved_coverage[done : done + active]  # (b, S)
                d_step_coverage = self.d_step_coverage[: active * heads]
        parts.backward(
            self.kernels, active * heads,
            0 if self.saved_queries is None else self.saved_queries[done].data_ptr(), self.source,
            spans.data_ptr(),
            None if self.saved_scores is None else self.saved_scores[rows.start].data_ptr(),
            weights.data_ptr(), weights.stride(0) // heads, d_context.data_ptr(),
            d_context.stride(0) // heads, d_weights_out, self.scratch,
            self.d_queries[done].data_ptr(), self.grads, coverage, d_step_coverage, 1,
            None if self.saved_logits is None else self.saved_logits[rows],
            None if self.centres is None else self.centres.backward_rows(done, active),
            None if self.saved_norm is None else self.norm_rows(rows),
        )  # fmt: skip
        if self.d_coverage is not None and d_step_coverage is not None:
            self.add_coverage_gradient(active, d_step_coverage)
        if self.centres is not None:  # dL/ds through p_t
            d_state += self.centres.backward(done, active)
        d_query = self.d_queries[done : done + active]
        if self.d_head_queries is not None and self.d_heads_of is not None:
            assert self.d_queries_of is not None  # the heads' additive queries
            d_heads = self.d_head_queries[done : done + active]  # (b, D)
            # (b·h, A) @ (A, d) -> (b·h, d), i.e. (b, D); then dL/ds += (b, D) @ (D, H)
            per_head = active * heads
            self.d_queries_of.into(d_heads.view(per_head, -1), d_query.view(per_head, -1))
            self.d_heads_of.into(d_state, d_heads, accumulate=True)
        elif self.d_queries_of is not None:  # dL/ds += d_q @ W_q: (b, A or h·K) @ (·, H)
            self.d_queries_of.into(d_state, d_query, accumulate=True)
        else:  # q = s
            d_state += d_query

    def add_coverage_gradient(self, active: int, d_step_coverage: Tensor) -> None:
        """dL/dc_t from a step's score: its rows' (b·h, S), through γ_i with heads."""
        assert self.d_coverage is not None
        if self.gamma is None:
            self.d_coverage[:active] += d_step_coverage
            return
        per_head = d_step_coverage.view(active, self.heads, -1)  # (b, h, S)
        # Σ_i γ_i dL/d(γ_i c): (b, 1, h) @ (b, h, S) -> (b, 1, S), added in place; γ's own
        # gradient waits for the loop's end (``gradients``).
        weights = self.gamma.view(1, 1, -1).expand(active, 1, -1)
        self.d_coverage[:active, None].baddbmm_(weights, per_head)

    def gradients(self, previous: Tensor) -> tuple[Tensor | None, ...]:
        """The gradients of the attention inputs, in ``__init__``'s order, after the loop:
        ``previous`` (N', H) is each visited row's state the query came from."""
        grads = self.grads
        d_query_weight, d_query_bias, d_heads_weight, d_heads_bias = self.query_gradients(previous)
        d_centre_weight = d_centre_vector = None
        if self.centres is not None:
            d_centre_weight, d_centre_vector = self.centres.weight_gradients(previous)
        d_score_weight, d_cover = grads.d_score_weight, grads.d_coverage_weight
        if self.gamma is not None and self.d_step_coverage is not None:
            assert self.saved_coverage is not None  # coverage with a gradient
            # dL/dγ_i = Σ over visited rows and keys of dL/d(γ_i c) · c: (N', h, S), (N', S)
            visited = self.saved_coverage.shape[0]
            per_head = self.d_step_coverage.view(visited, self.heads, -1)
            d_cover = torch.einsum("nhs,ns->h", per_head, self.saved_coverage)[None]  # (1, h)
        return (
            grads.d_keys,
            grads.d_memory,
            None,
            d_query_weight,
            d_query_bias,
            d_heads_weight,
            d_heads_bias,
            summed_like(d_score_weight, self.score_weight),
            grads.d_key_bias,
            summed_like(grads.d_alpha, self.alpha),
            temperature_gradient(grads.d_temperature, self.temperature),
            summed_like(d_cover, self.coverage_weight),
            self.d_coverage,
            d_centre_weight,
            d_centre_vector,
        )

    def query_gradients(self, previous: Tensor) -> tuple[Tensor | None, ...]:
        """The gradients of W_q and b_q, and of the heads' W_q and b_q before an additive
        score's (None where there are none), from every visited row's state ``previous``."""
        d_queries, weight, bias = self.d_queries, self.query_weight, self.query_bias
        if weight is None:
            return None, None, None, None
        if self.d_head_queries is None or self.head_queries is None:
            # (·, N') @ (N', H)
            return d_queries.t() @ previous, None if bias is None else d_queries.sum(0), None, None
        d_heads, head_queries = self.d_head_queries, self.head_queries
        per_head = d_queries.view(-1, weight.shape[0])  # (N'·h, A)
        # (A, N'·h) @ (N'·h, d); (D, N') @ (N', H)
        return (
            per_head.t() @ head_queries.view(per_head.shape[0], -1),
            None if bias is None else per_head.sum(0),
            d_heads.t() @ previous,
            None if self.heads_bias is None else d_heads.sum(0),
        )


class PredictedCentres:
    """Local-p's centres inside the loop, ``LocalWindow.centres``: p_t = (S_b - 1) ·
    σ(v_p · tanh(W_p s)) for each visited row (N' of them, in the steps' order), W_p s a GEMM
    and the rest its C twin (``seq2seq_local_p_centres``), with what the backward pass reads:
    tanh(W_p s) (N', H), σ (N',), p_t (N',) and, per head row, the weights before the Gaussian
    (N'·h, S) (``StepAttention.forward``'s ``normalized``). With ``heads``, every head of a
    row reads the row's centre."""

    def __init__(
        self,
        kernels: ctypes.CDLL,
        weight: Tensor,
        vector: Tensor,
        src_lens: Tensor,
        rows: int,
        keys: int,
        needs_grad: bool,
        heads: int = 1,
    ) -> None:
        self.kernels = kernels
        self.weight, self.heads = weight, heads  # W_p (H, H)
        self.vector = vector.detach().contiguous()  # v_p (1, H), as the C twin reads it
        self.lengths = src_lens.to(torch.int64).contiguous()  # (B,): S_b
        self.features = weight.new_empty(rows, weight.shape[0])
        self.gates = weight.new_empty(rows)
        self.centres = weight.new_empty(rows)
        self.head_centres = weight.new_empty(rows * heads) if heads > 1 else self.centres
        self.normalized = weight.new_empty(rows * heads, keys) if needs_grad else None
        self.d_centres = weight.new_zeros(rows * heads) if needs_grad else None
        self.d_predicted = weight.new_empty(rows) if needs_grad else None
        self.d_projected = weight.new_empty(rows, weight.shape[0]) if needs_grad else None

    def forward(self, state: Tensor, done: int) -> Tensor:
        """p_t of the step's rows, from their state (b, H) -> (b·h,); rows done .. done + b."""
        active = state.shape[0]
        features = self.features[done : done + active]
        torch.mm(state, self.weight.t(), out=features)  # (b, H) @ (H, H): W_p s
        centres = self.centres[done : done + active]
        self.kernels.seq2seq_local_p_centres(
            active, features.shape[1], self.vector.data_ptr(), self.lengths.data_ptr(), None,
            features.data_ptr(), self.gates[done].data_ptr(), centres.data_ptr(),
        )  # fmt: skip
        if self.heads == 1:
            return centres
        head_centres = self.head_centres[done * self.heads : (done + active) * self.heads]
        head_centres.view(active, self.heads).copy_(centres[:, None])  # every head's
        return head_centres

    def head_rows(self, done: int, active: int) -> slice:
        return slice(done * self.heads, (done + active) * self.heads)

    def normalized_rows(self, done: int, active: int) -> Tensor | None:
        return None if self.normalized is None else self.normalized[self.head_rows(done, active)]

    def backward_rows(self, done: int, active: int) -> tuple[Tensor, Tensor, Tensor]:
        """What ``StepAttention.backward`` reads and writes for local-p, per head row: centres,
        normalized weights, and where the centres' gradient is added."""
        assert self.normalized is not None and self.d_centres is not None
        rows = self.head_rows(done, active)
        return self.head_centres[rows], self.normalized[rows], self.d_centres[rows]

    def backward(self, done: int, active: int) -> Tensor:
        """dL/ds (b, H) through p_t, from the centres' gradient (the heads' summed); keeps what
        the weight gradients need."""
        assert self.d_centres is not None and self.d_predicted is not None
        assert self.d_projected is not None
        # p = last σ(z): dz = dp · last · σ (1 - σ), z = v_p · u, u = tanh(W_p s), summed over
        # the heads' dp; dL/d(W_p s) = dz v_p (1 - u²): (b, H), by the C twin.
        d_projected = self.d_projected[done : done + active]
        self.kernels.seq2seq_local_p_centres_backward(
            active, self.heads, d_projected.shape[1], self.vector.data_ptr(),
            self.lengths.data_ptr(), self.features[done].data_ptr(), self.gates[done].data_ptr(),
            self.d_centres[done * self.heads].data_ptr(), self.d_predicted[done].data_ptr(),
            d_projected.data_ptr(),
        )  # fmt: skip
        return d_projected @ self.weight  # (b, H) @ (H, H)

    def weight_gradients(self, previous: Tensor) -> tuple[Tensor, Tensor]:
        """dL/dW_p (H, H) and dL/dv_p (1, H), one GEMM each over the visited rows, from each
        row's state, previous (N', H)."""
        assert self.d_projected is not None and self.d_predicted is not None
        return self.d_projected.t() @ previous, (self.d_predicted @ self.features)[None]


def summed_like(per_row: Tensor | None, parameter: Tensor | None) -> Tensor | None:
    """A parameter's gradient from its rows' (R, ...), summed over the rows, in its shape."""
    if per_row is None or parameter is None:
        return None
    return per_row.sum(0).view_as(parameter)


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
