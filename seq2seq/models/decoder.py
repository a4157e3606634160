"""Attention decoders: Bahdanau style (sequential) and Luong style (parallel over target steps).

Shape legend: B batch, S source length, T target length, E embedding size, H decoder hidden size,
M memory size (encoder output), K key size, V target vocabulary.

Both read the same ``EncodedSource`` and have the same parts (embeddings, a GRU or LSTM cell, the
attention, an initial state from the encoder's summary, an output layer run once over all steps);
they differ in where the attention sits, and each follows its paper in how it starts and reads
out:

- ``BahdanauDecoder`` (Bahdanau et al., 2015): the query is the previous state s_{t-1}, and the
  context c_t it reads is fed into the cell, s_t = cell([e_{t-1}; c_t], s_{t-1}). Each step needs
  the previous step's attention, so teacher forcing is a loop over T. It starts from a bridge,
  s_0 = tanh(W_b summary), and its output layer reads ``[s_t; c_t; e_{t-1}]`` (the paper's deep
  output without the maxout).
- ``LuongDecoder`` (Luong et al., 2015): h_t = cell(e_{t-1}, h_{t-1}) does not depend on the
  attention, so teacher forcing runs the cell over all T steps first (one call in the kernels'
  subclass: C on the CPU, cuDNN on a GPU), and the T states then attend as T queries in one
  batched operation. It starts from the encoder's summary itself when that has the state's
  size, and reads out the attentional state ``tanh(W_c [c_t; h_t])`` (eq. 5–6). With
  ``input_feeding`` (§3.3) that state also joins the next step's input, and teacher forcing is a
  loop over T again.

This is the reference implementation, plain PyTorch: what the tests define as correct and what
runs on a GPU. ``seq2seq.kernels`` has CPU-accelerated subclasses of both decoders.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from seq2seq.attention import Attention, AttentionParts, MultiHeadAttention, head_size
from seq2seq.errors import ConfigError
from seq2seq.models.embedding import Embedding

AttentionFactory = Callable[..., Attention]
CellFactory = Callable[..., nn.GRUCell | nn.LSTMCell]

# A GRU state is (h,), an LSTM state is (h, c); h (B, H) is the query in both. An input-fed Luong
# decoder appends the last attentional vector h~ (B, H); a decoder with coverage the attention
# summed over the steps so far (B, S); a decoder whose window is centred on the target step
# (local-m) that step, (B,) int64: (h, [c,] [h~,] [coverage,] [t]). ``state_names`` says which a
# decoder has; search reorders every tensor of the tuple with its beams.
DecoderState = tuple[Tensor, ...]


@dataclass
class EncodedSource:
    """What the decoder reads at every step, computed once per source batch."""

    memory: Tensor  # (B, S, M) encoder outputs: the attention values
    keys: Tensor  # (B, S, K) memory, projected to the query size when the scoring needs it
    projected_keys: Tensor  # attention.project_keys(keys), the query-independent part of scores
    src_lens: Tensor  # (B,) number of real source tokens
    # attention.project_values(memory) where that is not the memory itself (multi-head
    # attention's W_v m, split into heads); None: the weights average the memory.
    projected_values: Tensor | None = None

    def index_select(self, indices: Tensor) -> EncodedSource:
        """Rows of the batch in the order of ``indices`` (B',), e.g. to drop finished sentences.

        Fields that are one tensor (dot-product scoring of a memory of the query's size uses the
        memory as keys and as projected keys) are selected once and stay one tensor. Multi-head
        attention's fields hold h rows per sentence (b·h + i), selected as such.
        """
        selected: dict[int, Tensor] = {}
        for tensor in (self.memory, self.keys, self.projected_keys, self.src_lens):
            if id(tensor) not in selected:
                selected[id(tensor)] = select_sentences(tensor, indices, len(self.src_lens))
        values = self.projected_values
        return EncodedSource(
            selected[id(self.memory)],
            selected[id(self.keys)],
            selected[id(self.projected_keys)],
            selected[id(self.src_lens)],
            None if values is None else select_sentences(values, indices, len(self.src_lens)),
        )


def select_sentences(tensor: Tensor, indices: Tensor, sentences: int) -> Tensor:
    """The rows of sentences ``indices`` (B',) from a tensor of B sentences' rows, one each or
    h each (rows b·h .. b·h + h - 1, multi-head attention's layout): (B'·h, ...)."""
    per_sentence = tensor.shape[0] // sentences
    if per_sentence == 1:
        return tensor.index_select(0, indices)
    rows = indices[:, None] * per_sentence + torch.arange(per_sentence, device=indices.device)
    return tensor.index_select(0, rows.reshape(-1))


def queries_per_sentence(queries: Tensor, sentences: int) -> Tensor:
    """Hypothesis rows as one sentence's queries: (R, Tq, D) with R = B · K (row b · K + k is
    hypothesis k of sentence b, as search lays out beams) -> (B, K · Tq, D), so that each
    sentence's source is read once per step, never copied per hypothesis. R = B: unchanged."""
    rows = queries.shape[0]
    if rows % sentences:
        raise ValueError(
            f"{rows} query rows for {sentences} source sentences: the rows must be a whole "
            "number of hypotheses per sentence, in the order b · K + k."
        )
    return queries.reshape(sentences, -1, queries.shape[2])  # sentence b's rows are contiguous


def per_hypothesis(x: Tensor, rows: int, steps: int, dim: int = 1) -> Tensor:
    """The inverse of ``queries_per_sentence`` for a result whose query axis is ``dim``:
    (B, ..., K · Tq, ...) -> (B · K, ..., Tq, ...), e.g. contexts (B, K·Tq, M) -> (R, Tq, M) or
    multi-head weights (B, h, K·Tq, S) -> (R, h, Tq, S)."""
    hypotheses = rows // x.shape[0]
    x = x.unflatten(dim, (hypotheses, steps))  # (B, ..., K, Tq, ...)
    return x.movedim(dim, 1).flatten(0, 1)  # (B, K, ..., Tq, ...) -> (B·K, ..., Tq, ...)


def attention_module(
    attention: AttentionFactory,
    num_heads: int,
    query_size: int,
    memory_size: int,
    parts: AttentionParts | None = None,
) -> Attention | MultiHeadAttention:
    """The scoring function built for the decoder's sizes, or with ``num_heads`` > 1, a
    multi-head attention of the memory's size around it (``model.num_heads``), with the
    attention's other ``parts`` (normalizer, window, key bias; none by default)."""
    parts = parts or AttentionParts()
    what = f"the encoder's output size {memory_size} (model.hidden_size or .encoder_hidden_size)"
    size = head_size(memory_size, num_heads, what)
    if num_heads == 1:
        return attention(query_size=query_size, key_size=memory_size).use_parts(parts, query_size)
    scoring = attention(query_size=size, key_size=size)
    return MultiHeadAttention(
        scoring, num_heads, query_size, memory_size, memory_size, memory_size,
        dropout=scoring.dropout.p,
    ).use_parts(parts, query_size)  # fmt: skip


class AttentionDecoder(nn.Module):
    """What both decoders share; subclasses define how the cell and the attention interleave.

    The constructor is the same for both, so that ``model.decoder=bahdanau|luong`` swaps one for
    the other with every other setting unchanged.
    """

    # True: the context is part of the cell's input (Bahdanau); False: only the embedding (Luong).
    feeds_context: ClassVar[bool]
    # True: the initial state is the encoder's summary itself when it has the state's size
    # (Luong); False: always a bridge s_0 = tanh(W_b summary) (Bahdanau).
    starts_from_summary: ClassVar[bool]
    # True: ``input_feeding`` may feed the last attentional vector to the cell (Luong, §3.3).
    can_feed_input: ClassVar[bool] = False

    def __init__(
        self,
        vocab_size: int,
        embedding_size: int,
        hidden_size: int,
        memory_size: int,
        attention: AttentionFactory,
        dropout: float = 0.0,
        padding_idx: int = 0,
        cell: CellFactory = nn.GRUCell,
        num_heads: int = 1,
        attention_parts: AttentionParts | None = None,
        input_feeding: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(input_feeding, bool):
            raise ConfigError(
                f"model.input_feeding must be true or false, got {input_feeding!r}: true feeds "
                "the Luong decoder's attentional vector to its next step (Luong et al., 2015)."
            )
        if input_feeding and not self.can_feed_input:
            raise ConfigError(
                f"model.input_feeding=true is for the Luong decoder (model.decoder=luong); the "
                f"{type(self).__name__.removesuffix('Decoder')} decoder's cell already reads the "
                "context of its own step, attended from its previous state, and it has no "
                "attentional vector to feed. Set model.input_feeding=false, or use "
                "model.decoder=luong."
            )
        self.input_feeding = input_feeding
        # Coverage: the state sums the attention of the steps so far, and the score reads it.
        self.covers = bool(attention_parts is not None and attention_parts.coverage)
        self.embedding = Embedding(vocab_size, embedding_size, padding_idx=padding_idx)
        self.dropout = nn.Dropout(dropout)
        self.attention: Attention | MultiHeadAttention = attention_module(
            attention, num_heads, hidden_size, memory_size, attention_parts
        )
        # local-m centres each step's window on its target step t: the state counts the steps.
        window = getattr(self.attention.normalization, "window", None)
        self.counts_steps = bool(window is not None and window.needs_positions)
        # Dot products need keys of the query's size: project the memory once per batch.
        # (Multi-head attention projects keys and queries itself.)
        needs_equal_sizes = getattr(self.attention, "needs_equal_sizes", False)
        self.key_projection: nn.Module = (
            nn.Linear(memory_size, hidden_size, bias=False)
            if needs_equal_sizes and memory_size != hidden_size
            else nn.Identity()
        )
        self.embedding_size = embedding_size
        self.memory_size = memory_size
        cell_input_size = embedding_size + (memory_size if self.feeds_context else 0)
        cell_input_size += hidden_size if input_feeding else 0  # h~_{t-1}, of the state's size
        self.cell = cell(cell_input_size, hidden_size)
        self.is_lstm = isinstance(self.cell, nn.LSTMCell)
        # The bridge turns the encoder's sentence summary into the initial state (and LSTM cell).
        self.bridge: nn.Linear | None = None
        if not (self.starts_from_summary and memory_size == hidden_size):
            self.bridge = nn.Linear(memory_size, hidden_size * (2 if self.is_lstm else 1))
        self.build_output(vocab_size, embedding_size, hidden_size, memory_size)

    def build_output(
        self, vocab_size: int, embedding_size: int, hidden_size: int, memory_size: int
    ) -> None:
        """Create the layers that ``output`` maps each step's features to logits with."""
        raise NotImplementedError

    def prepare_source(self, memory: Tensor, src_lens: Tensor) -> EncodedSource:
        """Keys and their query-independent projection, once per batch. memory (B, S, M)."""
        keys = self.key_projection(memory)  # (B, S, K)
        values = self.attention.project_values(memory)  # the memory itself but for multi-head
        return EncodedSource(
            memory, keys, self.attention.project_keys(keys), src_lens,
            None if values is memory else values,
        )  # fmt: skip

    def init_state(self, summary: Tensor, source_steps: int) -> DecoderState:
        """summary (B, M) and the source's length S -> initial state: tensors of (B, H) (h~_0 =
        0 of an input-fed decoder among them), coverage 0 (B, S) and step 0 (B,) where used."""
        cell_state: DecoderState
        if self.bridge is None:
            # Luong with M = H: the summary is the state itself; an LSTM's cell starts at 0.
            cell_state = (summary, torch.zeros_like(summary)) if self.is_lstm else (summary,)
        else:
            bridged = torch.tanh(self.bridge(summary))  # (B, H) or (B, 2H) for an LSTM
            cell_state = tuple(bridged.chunk(2, dim=-1)) if self.is_lstm else (bridged,)
        if self.input_feeding:
            # h~_0 = 0: nothing attended yet (Luong et al. 2015; OpenNMT-py, Joey NMT).
            cell_state = (*cell_state, summary.new_zeros(summary.shape[0], self.cell.hidden_size))
        if self.covers:
            cell_state = (*cell_state, summary.new_zeros(summary.shape[0], source_steps))
        if not self.counts_steps:
            return cell_state
        steps = torch.zeros(summary.shape[0], dtype=torch.long, device=summary.device)  # (B,)
        return (*cell_state, steps)

    def state_names(self) -> list[str]:
        """What each tensor of the state is, in order: h, an LSTM's c, the fed attentional
        vector, the coverage, the step count (what ONNX names the decoder step's inputs and
        outputs)."""
        names = ["h", "c"] if self.is_lstm else ["h"]
        names += ["feed"] if self.input_feeding else []
        names += ["coverage"] if self.covers else []
        return [*names, "step"] if self.counts_steps else names

    def steps_of(self, state: DecoderState) -> Tensor | None:
        """The target step of each row (B,), where the state counts them (local-m), else None."""
        return state[-1] if self.counts_steps else None

    def feed_of(self, state: DecoderState) -> Tensor | None:
        """The last attentional vector h~_{t-1} (B, H) of an input-fed decoder, else None."""
        return state[self.state_names().index("feed")] if self.input_feeding else None

    def coverage_of(self, state: DecoderState) -> Tensor | None:
        """The attention summed over the steps so far (B, S) of a decoder with coverage."""
        return state[self.state_names().index("coverage")] if self.covers else None

    def advance(
        self,
        cell_state: DecoderState,
        state: DecoderState,
        feed: Tensor | None = None,
        coverage: Tensor | None = None,
    ) -> DecoderState:
        """The state after one step: the cell's new state, the attentional vector to feed (an
        input-fed decoder), the coverage with this step's weights added, the step counted on."""
        kept = tuple(part for part in (feed, coverage) if part is not None)
        steps = self.steps_of(state)
        return (*cell_state, *kept) if steps is None else (*cell_state, *kept, steps + 1)

    def attend(
        self,
        queries: Tensor,
        source: EncodedSource,
        need_weights: bool = True,
        positions: Tensor | None = None,
        coverage: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """queries (R, Tq, H) -> contexts (R, Tq, M), weights (R, Tq, S) or None; positions
        (R, Tq): each query's target step, for a window centred on it (local-m); coverage
        (R, Tq, S): each query's attention so far (which needs the weights: they are returned).

        R is the source's batch B, or B · K when K hypotheses of each sentence share its source
        (beam search: row b · K + k is hypothesis k of sentence b). Those are scored as K · Tq
        queries of one sentence, so each sentence's keys and memory are read once per step
        instead of once per hypothesis, and the source is never copied per hypothesis.

        With ``need_weights=False`` only the context is computed (``Attention.context``).
        """
        rows, num_queries = queries.shape[:2]
        sentences = source.memory.shape[0]
        queries = queries_per_sentence(queries, sentences)  # (B, K·Tq, H)
        if positions is not None:
            positions = positions.reshape(sentences, -1)  # (R, Tq) -> (B, K·Tq), as the queries
        if coverage is not None:
            coverage = queries_per_sentence(coverage, sentences)  # (B, K·Tq, S)
        arguments = (queries, source.keys, source.memory, source.src_lens)
        keys, values = source.projected_keys, source.projected_values
        weights: Tensor | None = None
        if need_weights or coverage is not None:
            context, weights = self.attention(
                *arguments, projected_keys=keys, projected_values=values, positions=positions,
                coverage=coverage,
            )  # fmt: skip
            if weights is not None and weights.dim() == 4:  # multi-head: (B, h, Tq, S)
                weights = weights.mean(dim=1)  # what a step reads on average, (B, Tq, S)
        else:
            context = self.attention.context(
                *arguments, projected_keys=keys, projected_values=values, positions=positions
            )
        context = per_hypothesis(context, rows, num_queries)  # (R, Tq, M)
        if weights is not None:
            weights = per_hypothesis(weights, rows, num_queries)  # (R, Tq, S)
        return context, weights

    def step_cell(self, cell_input: Tensor, state: DecoderState) -> DecoderState:
        """One step of the cell: cell_input (B, E [+ M]), state -> the cell's new state (h,) or
        (h, c) (``advance`` adds the step count back)."""
        if self.is_lstm:
            return tuple(self.cell(cell_input, (state[0], state[1])))
        return (self.cell(cell_input, state[0]),)

    def forward(
        self, tgt_in: Tensor, state: DecoderState, source: EncodedSource, need_weights: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Teacher forcing: tgt_in (B, T) -> logits (B, T, V), weights (B, T, S) or None."""
        raise NotImplementedError

    def decode_step(
        self, prev_tokens: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """prev_tokens (B,) -> logits (B, V), new state, attention weights (B, S)."""
        raise NotImplementedError

    def teacher_forced_queries(
        self, tgt_in: Tensor, state: DecoderState, source: EncodedSource
    ) -> Tensor:
        """The attention's queries (B, T, H) under teacher forcing (for diagnostics)."""
        raise NotImplementedError

    def teacher_forced_logits(
        self, tgt_in: Tensor, tgt_out: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, Tensor]:
        """What the loss reads: logits (N, V) and their targets (N,) under teacher forcing.

        Here every position of the (B, T) grid, the padded ones with target PAD (the loss ignores
        them): shapes that depend only on the batch's, which CUDA graphs need. Subclasses may
        return the real tokens' rows only (``seq2seq.kernels``): the loss is the same.
        """
        logits, _ = self(tgt_in, state, source, need_weights=False)  # (B, T, V)
        return logits.flatten(0, 1), tgt_out.flatten()  # (B·T, V), (B·T,)

    def teacher_forced_logits_and_weights(
        self, tgt_in: Tensor, tgt_out: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``teacher_forced_logits`` and the attention weights (B, T, S), what the losses on the
        attention read (alignment, coverage). Here the whole grid's; subclasses may return the
        real tokens' logits and zero weights at the padded steps, which those losses skip."""
        logits, weights = self(tgt_in, state, source, need_weights=True)  # (B, T, V)
        assert weights is not None  # asked for
        return logits.flatten(0, 1), tgt_out.flatten(), weights


class BahdanauDecoder(AttentionDecoder):
    """A GRU (or LSTM) cell stepped over the target, attending once per step before the cell.

    Step t: the previous state asks where to look, c_t = attention(s_{t-1}, memory); the cell
    reads the previous word and that context, s_t = cell([e_{t-1}; c_t], s_{t-1}); the logits
    read all three, W_o [s_t; c_t; e_{t-1}] + b_o.
    """

    feeds_context = True
    starts_from_summary = False

    def build_output(
        self, vocab_size: int, embedding_size: int, hidden_size: int, memory_size: int
    ) -> None:
        self.output_layer = nn.Linear(hidden_size + memory_size + embedding_size, vocab_size)

    def output(self, hidden: Tensor, contexts: Tensor, embedded: Tensor) -> Tensor:
        """Logits (..., V) from states (..., H), contexts (..., M) and input embeddings (..., E)."""
        features = torch.cat([hidden, contexts, embedded], dim=-1)  # (..., H + M + E)
        return self.output_layer(self.dropout(features))  # (..., V)

    def step(
        self,
        embedded: Tensor,
        state: DecoderState,
        source: EncodedSource,
        need_weights: bool = True,
    ) -> tuple[DecoderState, Tensor, Tensor | None]:
        """One step from the previous word's embedding e_{t-1} (B, E) -> new state s_t, context
        c_t (B, M), weights (B, S) or None. A window is centred for target step t (local-m's
        p_t = t; local-p's p_t predicted from s_{t-1}, the query)."""
        query = state[0][:, None, :]  # (B, 1, H): s_{t-1} asks where to look
        steps = self.steps_of(state)
        positions = None if steps is None else steps[:, None]  # (B, 1)
        coverage = self.coverage_of(state)  # (B, S): what steps < t attended, or None
        covered = None if coverage is None else coverage[:, None, :]  # (B, 1, S)
        # (B, 1, M), (B, 1, S)
        context, weights = self.attend(query, source, need_weights, positions, covered)
        context = context[:, 0]  # (B, M)
        # s_t = cell([e_{t-1}; c_t], s_{t-1}): (B, E + M) in.
        new_state = self.step_cell(torch.cat([embedded, context], dim=-1), state)
        step_weights = None if weights is None else weights[:, 0]  # (B, S)
        if coverage is not None:
            assert step_weights is not None  # attend returns them with coverage
            coverage = coverage + step_weights
        return self.advance(new_state, state, coverage=coverage), context, step_weights

    def forward(
        self, tgt_in: Tensor, state: DecoderState, source: EncodedSource, need_weights: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Teacher forcing: tgt_in (B, T) -> logits (B, T, V), weights (B, T, S) or None."""
        embedded = self.dropout(self.embedding(tgt_in))  # (B, T, E)
        hiddens, contexts, weights = [], [], []
        for step_embedded in embedded.unbind(1):  # (B, E) each
            state, context, step_weights = self.step(step_embedded, state, source, need_weights)
            hiddens.append(state[0])
            contexts.append(context)
            if step_weights is not None:
                weights.append(step_weights)
        # One matmul over all steps: (B, T, H + M + E) @ (H + M + E, V).
        logits = self.output(torch.stack(hiddens, 1), torch.stack(contexts, 1), embedded)
        return logits, torch.stack(weights, dim=1) if need_weights else None

    def decode_step(
        self, prev_tokens: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """prev_tokens (B,) -> logits (B, V), new state, attention weights (B, S)."""
        embedded = self.dropout(self.embedding(prev_tokens))  # (B, E)
        state, context, weights = self.step(embedded, state, source)
        assert weights is not None  # asked for by default
        return self.output(state[0], context, embedded), state, weights

    def teacher_forced_queries(
        self, tgt_in: Tensor, state: DecoderState, source: EncodedSource
    ) -> Tensor:
        """Query t is the state before reading tgt_in[:, t], (B, T, H)."""
        queries = []
        for t in range(tgt_in.shape[1]):
            queries.append(state[0])  # (B, H): the state that asks where to look at step t
            _, state, _ = self.decode_step(tgt_in[:, t], state, source)
        return torch.stack(queries, dim=1)  # (B, T, H)


class LuongDecoder(AttentionDecoder):
    """The cell runs over all target steps at once; then every step attends in one batched op.

    Luong et al. (2015), section 3: h_t = cell(e_{t-1}, h_{t-1}), the query is h_t itself, and
    the logits are W_s tanh(W_c [c_t; h_t]) + b_s (eq. 5–6). The first state is the encoder's
    summary (the final forward and backward states) when it has the decoder's size, as in the
    paper and OpenNMT-py; otherwise a bridge maps it. On the reverse task (docs/performance.md)
    these two choices took the updates to dev BLEU 95 from 625 to 312 (median of 3 seeds), where
    OpenNMT-py's dot model reaches it. ``decode_step`` steps the same cell, so decoding and
    teacher forcing compute the same function.

    With ``input_feeding`` (section 3.3), the attentional vector h~_{t-1} = tanh(W_c [c_{t-1};
    h_{t-1}]) is fed to the next step with the word, h_t = cell([e_{t-1}; h~_{t-1}], h_{t-1}), so
    that each step knows where the last one looked. As in OpenNMT-py, what is fed is h~ after the
    output's dropout. With coverage, each step's score reads the attention of the steps before.
    Either way each step waits for the previous one's attention: teacher forcing is a loop over
    T, as in the Bahdanau decoder (``sequential_step``), and h~ and the coverage are state.
    """

    feeds_context = False
    starts_from_summary = True
    can_feed_input = True

    def build_output(
        self, vocab_size: int, embedding_size: int, hidden_size: int, memory_size: int
    ) -> None:
        # W_c of eq. 5 has no bias in the paper (nor in OpenNMT-py); W_s of eq. 6 has one.
        self.attentional = nn.Linear(memory_size + hidden_size, hidden_size, bias=False)
        self.output_layer = nn.Linear(hidden_size, vocab_size)

    def run_cell(self, embedded: Tensor, state: DecoderState) -> Tensor:
        """The cell over every step, h_t = cell(e_t, h_{t-1}): embedded (B, T, E) -> states
        (B, T, H). The cell does not read the attention, so no step waits for one (the kernels'
        subclass runs the same loop in one call: ``seq2seq.kernels.modules.FastLuongDecoder``)."""
        hiddens = []
        for step in embedded.unbind(dim=1):  # (B, E) each
            state = self.step_cell(step, state)
            hiddens.append(state[0])
        return torch.stack(hiddens, dim=1)  # (B, T, H)

    def forward(
        self, tgt_in: Tensor, state: DecoderState, source: EncodedSource, need_weights: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Teacher forcing: tgt_in (B, T) -> logits (B, T, V), weights (B, T, S) or None."""
        embedded = self.dropout(self.embedding(tgt_in))  # (B, T, E)
        if self.is_sequential:
            return self.sequential_forward(embedded, state, source, need_weights)
        hiddens = self.run_cell(embedded, state)  # (B, T, H)
        # All T queries at once: (B, T, H) against (B, S, K) -> contexts (B, T, M).
        positions = self.positions(state, tgt_in)  # (B, T) for a local-m window, else None
        contexts, weights = self.attend(hiddens, source, need_weights, positions)
        return self.output(hiddens, contexts), weights  # (B, T, V)

    @property
    def is_sequential(self) -> bool:
        """Whether each step needs the attention of the one before (input feeding, coverage), so
        that teacher forcing steps through T instead of running the cell over all steps first."""
        return self.input_feeding or self.covers

    def sequential_forward(
        self, embedded: Tensor, state: DecoderState, source: EncodedSource, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Teacher forcing one step at a time: embedded (B, T, E) -> logits (B, T, V), weights
        (B, T, S) or None."""
        attentionals, weights = [], []
        for step_embedded in embedded.unbind(1):  # (B, E) each
            state, _, attentional, step_weights = self.sequential_step(
                step_embedded, state, source, need_weights
            )
            attentionals.append(attentional)
            if step_weights is not None:
                weights.append(step_weights)
        logits = self.output_layer(torch.stack(attentionals, dim=1))  # (B, T, H) @ (H, V)
        return logits, torch.stack(weights, dim=1) if need_weights else None

    def sequential_step(
        self,
        embedded: Tensor,
        state: DecoderState,
        source: EncodedSource,
        need_weights: bool = True,
    ) -> tuple[DecoderState, Tensor, Tensor, Tensor | None]:
        """One step from the previous word's embedding e_{t-1} (B, E) -> the new state, h_t
        (B, H), h~_t after dropout (B, H: what the output layer, and the next step of an
        input-fed decoder, read), weights (B, S) or None."""
        feed, coverage = self.feed_of(state), self.coverage_of(state)
        # h_t = cell([e_{t-1}; h~_{t-1}], h_{t-1}) with input feeding, (B, E + H) in; else e_{t-1}.
        cell_input = embedded if feed is None else torch.cat([embedded, feed], dim=-1)
        cell_state = self.step_cell(cell_input, state)
        query = cell_state[0][:, None, :]  # (B, 1, H): h_t asks where to look
        steps = self.steps_of(state)
        positions = None if steps is None else steps[:, None]  # (B, 1): step t
        covered = None if coverage is None else coverage[:, None, :]  # (B, 1, S)
        # (B, 1, M), (B, 1, S) or None
        context, weights = self.attend(query, source, need_weights, positions, covered)
        attentional = self.dropout(self.attentional_vector(query[:, 0], context[:, 0]))  # (B, H)
        step_weights = None if weights is None else weights[:, 0]  # (B, S)
        if coverage is not None:
            assert step_weights is not None  # attend returns them with coverage
            coverage = coverage + step_weights
        new_state = self.advance(
            cell_state, state, attentional if feed is not None else None, coverage
        )
        return new_state, query[:, 0], attentional, step_weights

    def positions(self, state: DecoderState, tgt_in: Tensor) -> Tensor | None:
        """Under teacher forcing, the target step of each query (B, T) where a window needs it:
        the state's first step onwards."""
        steps = self.steps_of(state)
        if steps is None:
            return None
        offsets = torch.arange(tgt_in.shape[1], device=tgt_in.device)  # (T,)
        return steps[:, None] + offsets[None, :]  # (B, T)

    def decode_step(
        self, prev_tokens: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """prev_tokens (B,) -> logits (B, V), new state, attention weights (B, S)."""
        embedded = self.dropout(self.embedding(prev_tokens))  # (B, E)
        if self.is_sequential:
            new_state, _, attentional, weights = self.sequential_step(embedded, state, source)
            assert weights is not None  # asked for by default
            return self.output_layer(attentional), new_state, weights  # (B, V)
        steps = self.steps_of(state)
        cell_state = self.step_cell(embedded, state)
        query = cell_state[0][:, None, :]  # (B, 1, H): h_t asks where to look
        positions = None if steps is None else steps[:, None]  # (B, 1): step t
        context, step_weights = self.attend(query, source, positions=positions)
        assert step_weights is not None  # asked for by default
        logits = self.output(query[:, 0], context[:, 0])  # (B, V)
        return logits, self.advance(cell_state, state), step_weights[:, 0]

    def attentional_vector(self, hidden: Tensor, contexts: Tensor) -> Tensor:
        """Luong's attentional state h~ = tanh(W_c [c_t; h_t]) (..., H), eq. 5, from states
        (..., H) and contexts (..., M)."""
        return torch.tanh(self.attentional(torch.cat([contexts, hidden], dim=-1)))

    def output(self, hidden: Tensor, contexts: Tensor) -> Tensor:
        """Logits (..., V) from states (..., H) and contexts (..., M): W_s h~ + b_s, eq. 6."""
        return self.output_layer(self.dropout(self.attentional_vector(hidden, contexts)))

    def teacher_forced_queries(
        self, tgt_in: Tensor, state: DecoderState, source: EncodedSource
    ) -> Tensor:
        """Query t is the state after reading tgt_in[:, t], (B, T, H)."""
        embedded = self.dropout(self.embedding(tgt_in))  # (B, T, E)
        if not self.is_sequential:
            return self.run_cell(embedded, state)
        queries = []
        for step_embedded in embedded.unbind(1):  # (B, E) each
            state, query, _, _ = self.sequential_step(step_embedded, state, source, False)
            queries.append(query)
        return torch.stack(queries, dim=1)  # (B, T, H)
