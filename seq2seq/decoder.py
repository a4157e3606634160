"""Attention decoders: Bahdanau style (sequential) and Luong style (parallel over target steps).

Shape legend: B batch, S source length, T target length, E embedding size, H decoder hidden size,
M memory size (encoder output), K key size, V target vocabulary, G gates (3H for a GRU, 4H for an
LSTM).

Both read the same ``EncodedSource`` and have the same parts (embeddings, a GRU or LSTM cell, the
attention, an initial state from the encoder's summary, an output layer run once over all steps);
they differ in where the attention sits, and each follows its paper in how it starts and reads
out:

- ``BahdanauDecoder`` (Bahdanau et al., 2015): the query is the previous state s_{t-1}, and the
  context c_t it reads is fed into the cell, s_t = cell([e_{t-1}; c_t], s_{t-1}). Each step needs
  the previous step's attention, so teacher forcing is a loop over T. It starts from a bridge,
  s_0 = tanh(W_b summary), and its output layer reads ``[s_t; c_t; e_{t-1}]`` (the paper's deep
  output without the maxout).
- ``LuongDecoder`` (Luong et al., 2015, without input feeding): h_t = cell(e_{t-1}, h_{t-1}) does
  not depend on the attention, so teacher forcing runs the cell over all T steps in one call, and
  the T states then attend as T queries in one batched operation. It starts from the encoder's
  summary itself when that has the state's size, and reads out the attentional state
  ``tanh(W_c [c_t; h_t])`` (eq. 5–6).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.backends.cudnn import rnn as cudnn_rnn

from seq2seq.attention import AdditiveAttention, Attention
from seq2seq.dropout import Dropout
from seq2seq.embedding import Embedding
from seq2seq.fused_attention import PackedProductAttention
from seq2seq.fused_attention import product_attend as fused_product_attend
from seq2seq.fused_bahdanau import Recurrence as FusedRecurrence
from seq2seq.fused_bahdanau import attend as fused_attend
from seq2seq.fused_greedy import luong_greedy as fused_luong_greedy
from seq2seq.fused_rnn import Steps as FusedSteps
from seq2seq.fused_rnn import gru_cell as fused_gru_cell
from seq2seq.fused_rnn import gru_steps as fused_gru_steps
from seq2seq.fused_rnn import tanh_ as fused_tanh_
from seq2seq.fused_rnn import tanh_with_grad_ as fused_tanh_with_grad_
from seq2seq.fused_rnn import usable as fused_usable
from seq2seq.packing import PackedTokens, pack_tokens

AttentionFactory = Callable[..., Attention]
CellFactory = Callable[..., nn.GRUCell | nn.LSTMCell]

# A GRU state is (h,), an LSTM state is (h, c); h (B, H) is the query in both.
DecoderState = tuple[Tensor, ...]


@dataclass(frozen=True)
class GreedyTask:
    """What greedy decoding of a batch needs besides its source and first state."""

    limits: Tensor  # (B,) each sentence's most tokens, EOS included
    max_steps: int  # the largest limit
    bos_id: int
    eos_id: int
    pad_id: int  # what follows each sentence's end in the tokens


@dataclass
class EncodedSource:
    """What the decoder reads at every step, computed once per source batch."""

    memory: Tensor  # (B, S, M) encoder outputs: the attention values
    keys: Tensor  # (B, S, K) memory, projected to the query size when the scoring needs it
    projected_keys: Tensor  # attention.project_keys(keys), the query-independent part of scores
    src_lens: Tensor  # (B,) number of real source tokens
    # (V, G): the embedding part of the cell's input projection, W_ie e + b_ih, of every target
    # token, when decoding on the CPU (``AttentionDecoder.prepare_source``); not per row.
    token_gates: Tensor | None = None
    # (B, S, H): the context part of Luong's attentional layer applied to every source position,
    # W_c1 m_s, when decoding (``LuongDecoder.prepare_source``).
    attentional_memory: Tensor | None = None

    def index_select(self, indices: Tensor) -> EncodedSource:
        """Rows of the batch in the order of ``indices`` (B',), e.g. to drop finished sentences.

        Fields that are one tensor (dot-product scoring of a memory of the query's size uses the
        memory as keys and as projected keys) are selected once and stay one tensor: decoding
        selects rows at most steps of a batch whose sentences finish at different lengths.
        """
        selected: dict[int, Tensor] = {}
        for tensor in (self.memory, self.keys, self.projected_keys, self.src_lens):
            if id(tensor) not in selected:
                selected[id(tensor)] = tensor.index_select(0, indices)
        attentional_memory = self.attentional_memory
        if attentional_memory is not None:
            attentional_memory = attentional_memory.index_select(0, indices)
        return EncodedSource(
            selected[id(self.memory)],
            selected[id(self.keys)],
            selected[id(self.projected_keys)],
            selected[id(self.src_lens)],
            self.token_gates,
            attentional_memory,
        )


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
        fused_rnn: bool = True,
    ) -> None:
        super().__init__()
        # A GRU through seq2seq.fused_rnn on the CPU: Luong's cell over all steps, and every
        # decoding step of either decoder (``fused_step_applies``).
        self.fused = fused_rnn
        self.embedding = Embedding(vocab_size, embedding_size, padding_idx=padding_idx)
        self.dropout = Dropout(dropout)
        self.attention = attention(query_size=hidden_size, key_size=memory_size)
        # Dot products need keys of the query's size: project the memory once per batch.
        self.key_projection: nn.Module = (
            nn.Linear(memory_size, hidden_size, bias=False)
            if self.attention.needs_equal_sizes and memory_size != hidden_size
            else nn.Identity()
        )
        self.embedding_size = embedding_size
        self.memory_size = memory_size
        cell_input_size = embedding_size + (memory_size if self.feeds_context else 0)
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

    def is_decoding(self, stepping: bool) -> bool:
        """Whether ``prepare_source`` builds the tables only ``decode_step`` reads: for a caller
        that will step (``stepping``, the searches), in eval mode, without autograd."""
        return stepping and not (self.training or torch.is_grad_enabled())

    def prepare_source(
        self, memory: Tensor, src_lens: Tensor, stepping: bool = True
    ) -> EncodedSource:
        """Keys and their query-independent projection, once per batch. memory (B, S, M).

        Decoding on the CPU (``is_decoding(stepping)``) also gets ``token_gates``: each step's
        cell input projection of the previous token is then a row lookup instead of a (B, E) @
        (E, G) GEMM, a third of the cell's FLOPs. The table costs V / B steps' worth of those
        GEMMs, so it is built only for vocabularies of at most ``8 * B`` tokens (the reverse
        task's 54 at B = 64; not a 16k subword vocabulary). Teacher forcing passes
        ``stepping=False``: it reads no table.
        """
        keys = self.key_projection(memory)  # (B, S, K)
        token_gates = None
        decoding = self.is_decoding(stepping)
        small_vocabulary = self.embedding.num_embeddings <= 8 * memory.shape[0]
        if decoding and memory.device.type == "cpu" and small_vocabulary:
            embedding_weight = self.cell.weight_ih[:, : self.embedding_size]  # (G, E)
            token_gates = self.embedding_gates(self.embedding.weight, embedding_weight)  # (V, G)
        return EncodedSource(memory, keys, self.attention.project_keys(keys), src_lens, token_gates)

    def init_state(self, summary: Tensor) -> DecoderState:
        """summary (B, M) -> initial state, tensors of (B, H)."""
        if self.bridge is None:
            # Luong with M = H: the summary is the state itself; an LSTM's cell starts at 0.
            return (summary, torch.zeros_like(summary)) if self.is_lstm else (summary,)
        bridged = torch.tanh(self.bridge(summary))  # (B, H) or (B, 2H) for an LSTM
        return tuple(bridged.chunk(2, dim=-1)) if self.is_lstm else (bridged,)

    def attend(
        self,
        queries: Tensor,
        source: EncodedSource,
        need_weights: bool = True,
        values: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """queries (R, Tq, H) -> contexts (R, Tq, M), weights (R, Tq, S) or None.

        ``values`` (B, S, D) replaces the memory as what the weights average (contexts are then
        (R, Tq, D)); by default it is ``source.memory``.

        R is the source's batch B, or B · K when K hypotheses of each sentence share its source
        (beam search: row b · K + k is hypothesis k of sentence b). Those are scored as K · Tq
        queries of one sentence, so each sentence's keys and memory are read once per step
        instead of once per hypothesis, and the source is never copied per hypothesis.

        With ``need_weights=False`` the scoring function may take a fused path
        (``Attention.context``).
        """
        rows, num_queries = queries.shape[:2]
        sentences = source.memory.shape[0]
        if rows != sentences:
            if rows % sentences:
                raise ValueError(
                    f"{rows} query rows for {sentences} source sentences: the rows must be a "
                    "whole number of hypotheses per sentence, in the order b · K + k."
                )
            # (B·K, Tq, H) -> (B, K·Tq, H): the queries of sentence b are contiguous rows.
            queries = queries.reshape(sentences, -1, queries.shape[2])
        if values is None:
            values = source.memory
        if need_weights:
            context, weights = self.attention(
                queries,
                source.keys,
                values,
                source.src_lens,
                projected_keys=source.projected_keys,
            )
        else:
            context = self.attention.context(
                queries,
                source.keys,
                values,
                source.src_lens,
                projected_keys=source.projected_keys,
            )
            weights = None
        if rows != sentences:  # (B, K·Tq, ...) -> (B·K, Tq, ...)
            context = context.reshape(rows, num_queries, context.shape[2])
            if weights is not None:
                weights = weights.reshape(rows, num_queries, weights.shape[2])
        return context, weights

    def embedding_gates(self, embedded: Tensor, weight: Tensor) -> Tensor:
        """W_ie e + b_ih, (..., E) -> (..., G): the part of the cell input without attention.
        ``weight`` is the embedding part (G, E) of the cell's input weight."""
        return F.linear(embedded, weight, self.cell.bias_ih)

    def step_cell(self, cell_input: Tensor, state: DecoderState) -> DecoderState:
        """One step of the cell: cell_input (B, E [+ M]), state -> new state."""
        if self.is_lstm:
            return tuple(self.cell(cell_input, (state[0], state[1])))
        return (self.cell(cell_input, state[0]),)

    def cpu_cell(
        self, cell_input: Tensor, input_gates: Tensor, state: DecoderState, input_weight: Tensor
    ) -> DecoderState:
        """The cell through ATen's own CPU kernels, with part of its input projection done by
        the caller: ``input_gates`` (B, G) + ``input_weight`` (G, I) @ ``cell_input`` (B, I).

        ``torch.gru_cell(x, h, W_ih, W_hh, b_ih, b_hh)`` is ``nn.GRUCell``'s function; on the CPU
        it adds ``b_ih`` through ``addmm``, which broadcasts, so a per-row bias (B, G) carries
        the precomputed part and the kernel's input GEMM covers only ``cell_input``. (The CUDA
        kernels read the bias per column, hence the callers' other paths off the CPU.)
        """
        weight_hh, bias_hh = self.cell.weight_hh, self.cell.bias_hh
        if self.is_lstm:
            hidden, cell = torch.lstm_cell(
                cell_input, (state[0], state[1]), input_weight, weight_hh, input_gates, bias_hh
            )
            return hidden, cell
        hidden = torch.gru_cell(cell_input, state[0], input_weight, weight_hh, input_gates, bias_hh)
        return (hidden,)

    def fused_step_applies(self, hidden: Tensor) -> bool:
        """Whether ``cell_gates`` steps through ``seq2seq.fused_rnn.gru_cell``: a GRU with
        ``fused_rnn`` on, stepped without autograd (decoding) where the kernels are ``usable``."""
        if self.is_lstm or not self.fused or torch.is_grad_enabled():
            return False
        return fused_usable(hidden, self.cell.weight_hh)

    def fused_attention_source(self, source: EncodedSource, rows: int) -> bool:
        """What the C attention kernels (``seq2seq.fused_bahdanau``, ``seq2seq.fused_attention``)
        need whatever the scoring: ``fused_rnn`` on, no active dropout on the weights, one
        length per sentence, a whole number of the ``rows`` queries per sentence, and source
        tensors they take. Each decoder adds its scoring's own conditions."""
        attention = self.attention
        if not self.fused or (attention.training and attention.dropout.p > 0):
            return False
        if source.src_lens.dim() != 1 or rows % source.memory.shape[0]:
            return False  # a ragged query count: attend's error says what is wrong
        return fused_usable(source.memory, source.projected_keys)

    def cell_gates(self, input_gates: Tensor, state: DecoderState) -> DecoderState:
        """The cell from its input projection ``W_ih x + b_ih`` (B, G): the same function as
        ``nn.GRUCell`` / ``nn.LSTMCell`` (their gate order), with the input GEMM done by the caller.
        Bahdanau's step uses it off the CPU and when decoding, Luong's decoding step on the CPU,
        where its few elementwise ops beat ``cpu_cell`` fed an empty input (its kernel would copy
        the (B, G) rows once more). Decoding a GRU on the CPU takes the fused C pass instead
        (``fused_step_applies``): one pass where the ops below are five kernels."""
        hidden = state[0]  # (B, H)
        if self.fused_step_applies(hidden):
            return (fused_gru_cell(input_gates, hidden, self.cell.weight_hh, self.cell.bias_hh),)
        recurrent = F.linear(hidden, self.cell.weight_hh, self.cell.bias_hh)  # (B, G)
        if self.is_lstm:
            # Gates i, f, g, o (PyTorch's order), each (B, H).
            i, f, g, o = (input_gates + recurrent).chunk(4, dim=-1)
            cell = torch.sigmoid(f) * state[1] + torch.sigmoid(i) * torch.tanh(g)
            return torch.sigmoid(o) * torch.tanh(cell), cell
        # GRU gates r, z, n: r and z read input and state together, n reads r ⊙ (W_hn h + b_hn).
        size = hidden.shape[-1]
        both = torch.sigmoid(input_gates[:, : 2 * size] + recurrent[:, : 2 * size])  # (B, 2H)
        reset, update = both.chunk(2, dim=-1)  # (B, H) each
        new = torch.tanh(torch.addcmul(input_gates[:, 2 * size :], reset, recurrent[:, 2 * size :]))
        return (torch.lerp(new, hidden, update),)  # n + z (h - n) = (1 - z) n + z h

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

    def packed_logits(
        self, tgt_in: Tensor, tgt_out: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, Tensor] | None:
        """Teacher forcing over the real target tokens only, where a decoder can: logits (N, V)
        and their targets (N,) (tgt_in, tgt_out (B, T), padded); None: ``forward`` runs on the
        padded grid instead (the loss is the same either way)."""
        return None

    def pack_targets(self, tgt_in: Tensor, tgt_out: Tensor) -> tuple[PackedTokens, Tensor]:
        """tgt_in's real tokens packed (``pack_tokens``; a sentence's length is its count of
        targets), and tgt_out's tokens at the same rows (N,)."""
        padding = self.embedding.padding_idx
        assert padding is not None  # the constructor gives the embedding one
        real = tgt_out.ne(padding)  # (B, T)
        packed = pack_tokens(tgt_in, real.sum(1))
        return packed, tgt_out.reshape(-1).index_select(0, packed.positions)

    def fused_greedy(
        self, source: EncodedSource, state: DecoderState, task: GreedyTask
    ) -> tuple[Tensor, Tensor, int] | None:
        """Greedy decoding of the whole batch in one C call, where a decoder has one and it
        applies: tokens (B, L), weights (B, L, S) and the steps run. None: step ``decode_step``
        (``greedy_search``)."""
        return None


class BahdanauDecoder(AttentionDecoder):
    """A GRU (or LSTM) cell stepped over the target, attending once per step before the cell.

    The cell's input is ``[e_{t-1}; c_t]``, so its input projection splits into an embedding part
    and a context part: ``W_ih [e; c] = W_ie e + W_ic c``. The embedding part does not depend on
    the attention, so teacher forcing computes it for all T steps in one GEMM before the loop,
    and each step only adds ``W_ic c_t`` (``cell_gates``). The parameters are the cell's own, so
    checkpoints are those of ``nn.GRUCell`` / ``nn.LSTMCell`` on ``[e; c]``.
    """

    feeds_context = True
    starts_from_summary = False

    def build_output(
        self, vocab_size: int, embedding_size: int, hidden_size: int, memory_size: int
    ) -> None:
        self.output_layer = nn.Linear(hidden_size + memory_size + embedding_size, vocab_size)

    def split_input_weight(self) -> tuple[Tensor, Tensor]:
        """The cell's input weight (G, E + M) as its embedding part (G, E) and context part (G, M).

        Called once per batch: every step's use of the context part then adds into one gradient.
        """
        return self.cell.weight_ih.split([self.embedding_size, self.memory_size], dim=1)

    def output(self, hidden: Tensor, contexts: Tensor, embedded: Tensor) -> Tensor:
        """Logits (..., V) from states (..., H), contexts (..., M) and input embeddings (..., E)."""
        features = torch.cat([hidden, contexts, embedded], dim=-1)  # (..., H + M + E)
        return self.output_layer(self.dropout(features))  # (..., V)

    def step(
        self,
        input_gates: Tensor,
        state: DecoderState,
        source: EncodedSource,
        context_weight: Tensor,
        need_weights: bool = True,
    ) -> tuple[DecoderState, Tensor, Tensor | None]:
        """One step from the previous token's ``embedding_gates`` (B, G) -> new state, context
        (B, M), weights (B, S). ``context_weight`` is ``split_input_weight()[1]``."""
        fused_step = self.fused_step_applies(state[0])
        attention = self.attention
        weights: Tensor | None
        if fused_step and self.fused_attention_applies(source, state[0].shape[0]):
            assert isinstance(attention, AdditiveAttention)  # fused_attention_applies checked
            # Decoding: the attention in one C pass too. (B, M), (B, S)
            context, weights = fused_attend(
                state[0], source.projected_keys, source.memory, source.src_lens,
                attention.W_q.weight, attention.W_q.bias, attention.w_v.weight,
            )  # fmt: skip
        else:
            query = state[0][:, None, :]  # (B, 1, H): the previous state asks where to look
            context, weights = self.attend(query, source, need_weights)  # (B, 1, M), (B, 1, S)
            context = context[:, 0]  # (B, M)
            weights = None if weights is None else weights[:, 0]  # (B, S)
        if context.device.type == "cpu" and not fused_step:
            new_state = self.cpu_cell(context, input_gates, state, context_weight)
        else:
            # W_ie e + b_ih + W_ic c: (B, G) + (B, M) @ (M, G)
            gates = torch.addmm(input_gates, context, context_weight.t())
            new_state = self.cell_gates(gates, state)
        return new_state, context, weights

    def forward(
        self, tgt_in: Tensor, state: DecoderState, source: EncodedSource, need_weights: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Teacher forcing: tgt_in (B, T) -> logits (B, T, V), weights (B, T, S) or None."""
        embedded = self.dropout(self.embedding(tgt_in))  # (B, T, E)
        embedding_weight, context_weight = self.split_input_weight()
        # Every step's embedding part in one GEMM: (B, T, E) @ (E, G) -> (B, T, G).
        input_gates = self.embedding_gates(embedded, embedding_weight)
        if self.fused_recurrence_applies(source, state[0], need_weights):
            attention = self.attention
            assert isinstance(attention, AdditiveAttention)  # fused_recurrence_applies checked
            # (B, T, H), (B, T, M), (B, T, S)
            states, step_contexts, attention_weights = FusedRecurrence.apply(
                input_gates, state[0], source.projected_keys, source.memory, source.src_lens,
                attention.W_q.weight, attention.W_q.bias, attention.w_v.weight, context_weight,
                self.cell.weight_hh, self.cell.bias_hh,
            )  # fmt: skip
            logits = self.output(states, step_contexts, embedded)  # (B, T, V)
            return logits, attention_weights if need_weights else None
        hiddens, contexts, weights = [], [], []
        # unbind, not input_gates[:, t]: the backward of T selects would allocate and add a
        # zero (B, T, G) gradient per step; unbind's backward stacks the T gradients once.
        for step_gates in input_gates.unbind(1):  # (B, G) each
            state, context, step_weights = self.step(
                step_gates, state, source, context_weight, need_weights
            )
            hiddens.append(state[0])
            contexts.append(context)
            if step_weights is not None:
                weights.append(step_weights)
        # One matmul over all steps: (B, T, H + M + E) @ (H + M + E, V).
        logits = self.output(torch.stack(hiddens, 1), torch.stack(contexts, 1), embedded)
        return logits, torch.stack(weights, dim=1) if need_weights else None

    def packed_logits(
        self, tgt_in: Tensor, tgt_out: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, Tensor] | None:
        """Teacher forcing on the N real target tokens where the recurrence runs fused
        (``fused_recurrence_applies``): logits (N, V) and targets (N,), rows in ``pack_tokens``'
        order. The batch is sorted longest target first, so that each step of the loop runs only
        the sentences that have not ended; the embedding's GEMM and the output layer skip the
        padding too. Elsewhere None: ``forward`` runs padded."""
        if not self.fused_recurrence_applies(source, state[0], need_weights=False):
            return None
        attention = self.attention
        assert isinstance(attention, AdditiveAttention)  # fused_recurrence_applies checked
        packed, targets = self.pack_targets(tgt_in, tgt_out)
        order = packed.sorted_indices  # (B,) longest target first
        source = source.index_select(order)
        embedded = self.dropout(self.embedding(packed.tokens))  # (N, E)
        embedding_weight, context_weight = self.split_input_weight()
        input_gates = self.embedding_gates(embedded, embedding_weight)  # (N, G)
        # (N, H), (N, M)
        states, contexts, _ = FusedRecurrence.apply(
            input_gates, state[0].index_select(0, order), source.projected_keys, source.memory,
            source.src_lens, attention.W_q.weight, attention.W_q.bias, attention.w_v.weight,
            context_weight, self.cell.weight_hh, self.cell.bias_hh,
            FusedSteps.packed(packed.batch_sizes),
        )  # fmt: skip
        return self.output(states, contexts, embedded), targets  # (N, V), (N,)

    def fused_recurrence_applies(
        self, source: EncodedSource, hidden: Tensor, need_weights: bool
    ) -> bool:
        """Whether teacher forcing runs as ``seq2seq.fused_bahdanau``'s one autograd node: a GRU
        with ``fused_rnn`` on, additive attention in its plain form, one length per sentence,
        the weights not needing a gradient (they are an output without one there), and tensors
        the C kernels take."""
        if self.is_lstm or (need_weights and torch.is_grad_enabled()):
            return False
        return self.fused_attention_applies(source, hidden.shape[0]) and fused_usable(
            hidden, self.cell.weight_hh
        )

    def fused_attention_applies(self, source: EncodedSource, rows: int) -> bool:
        """Whether ``seq2seq.fused_bahdanau`` can compute this attention for ``rows`` queries:
        additive attention in its plain form, and what ``fused_attention_source`` asks."""
        attention = self.attention
        if not isinstance(attention, AdditiveAttention) or not attention.fusable():
            return False
        return self.fused_attention_source(source, rows) and fused_usable(attention.W_q.weight)

    def decode_step(
        self, prev_tokens: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """prev_tokens (B,) -> logits (B, V), new state, attention weights (B, S)."""
        embedded = self.dropout(self.embedding(prev_tokens))  # (B, E)
        embedding_weight, context_weight = self.split_input_weight()
        if source.token_gates is None:
            input_gates = self.embedding_gates(embedded, embedding_weight)  # (B, G)
        else:
            # (B, G) rows of the (V, G) table (index_select: on the CPU several times faster
            # than advanced indexing, which a step's few hundred microseconds notice).
            input_gates = source.token_gates.index_select(0, prev_tokens)
        state, context, weights = self.step(input_gates, state, source, context_weight)
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

    Luong et al. (2015), section 3, without input feeding: h_t = cell(e_{t-1}, h_{t-1}), the
    query is h_t itself, and the logits are W_s tanh(W_c [c_t; h_t]) + b_s (eq. 5–6). The first
    state is the encoder's summary (the final forward and backward states) when it has the
    decoder's size, as in the paper and OpenNMT-py; otherwise a bridge maps it. On the reverse
    task (README, "Performance") these two choices took the updates to dev BLEU 95 from 625 to
    312 (median of 3 seeds), where OpenNMT-py's dot model reaches it. ``decode_step`` steps the
    same cell, so decoding and teacher forcing compute the same function.
    """

    feeds_context = False
    starts_from_summary = True

    def build_output(
        self, vocab_size: int, embedding_size: int, hidden_size: int, memory_size: int
    ) -> None:
        # W_c of eq. 5 has no bias in the paper (nor in OpenNMT-py); W_s of eq. 6 has one.
        self.attentional = nn.Linear(memory_size + hidden_size, hidden_size, bias=False)
        self.output_layer = nn.Linear(hidden_size, vocab_size)

    def prepare_source(
        self, memory: Tensor, src_lens: Tensor, stepping: bool = True
    ) -> EncodedSource:
        """The base class's, plus ``attentional_memory`` when decoding (``is_decoding``):
        W_c1 m (B, S, H) over the S source positions costs about S steps' worth of the per-step
        W_c1 c GEMM it replaces, and beam search saves it for each of its K rows per sentence."""
        source = super().prepare_source(memory, src_lens, stepping)
        if self.is_decoding(stepping):
            context_weight = self.attentional.weight[:, : self.memory_size]  # W_c1 (H, M)
            # (B, S, M) -> (B, S, H)
            source = replace(source, attentional_memory=F.linear(memory, context_weight))
        return source

    def cell_parameters(self) -> list[Tensor]:
        """The cell's parameters in ``torch.gru`` / ``torch.lstm``'s order for one layer."""
        cell = self.cell
        params = [cell.weight_ih, cell.weight_hh]
        if cell.bias_ih is not None:
            params += [cell.bias_ih, cell.bias_hh]
        return params

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> LuongDecoder:
        """Every device or dtype move (``.to``, ``.cuda``, ``.half``) re-lays the cell out for
        cuDNN afterwards, as ``nn.GRU`` does (``flatten_cell``)."""
        moved = super()._apply(fn, recurse)
        self.flatten_cell()
        return moved

    def flatten_cell(self) -> None:
        """On a GPU, make the cell's parameters views of one buffer in cuDNN's layout (what
        ``nn.GRU.flatten_parameters`` does for its own). ``run_cell``'s ``torch.gru`` then reads
        them in place; otherwise cuDNN copies them into such a buffer at every call and warns
        ("RNN module weights are not part of single contiguous chunk of memory"). The parameters
        keep their names and shapes, so checkpoints and the decoding step are unaffected.
        """
        params = self.cell_parameters()
        first = params[0]
        if not (first.is_cuda and torch.backends.cudnn.is_acceptable(first)):
            return
        if any(p.dtype != first.dtype for p in params):
            return
        with torch.cuda.device_of(first), torch.no_grad():
            # Arguments: weight stride (parameters per layer), input size, mode, hidden size,
            # projection size, layers, batch_first, bidirectional.
            torch._cudnn_rnn_flatten_weight(
                params,
                len(params),
                self.cell.input_size,
                cudnn_rnn.get_cudnn_mode("LSTM" if self.is_lstm else "GRU"),
                self.cell.hidden_size,
                0,
                1,
                True,
                False,
            )

    def cell_runs_fused(self, *tensors: Tensor) -> bool:
        """Whether the cell over all steps runs through ``seq2seq.fused_rnn`` for these tensors
        (its inputs and parameters): a GRU, ``fused_rnn`` on, and tensors the kernels take."""
        return self.fused and not self.is_lstm and fused_usable(*tensors)

    def run_cell(self, embedded: Tensor, state: DecoderState) -> Tensor:
        """The cell over every step in one call: embedded (B, T, E) -> states (B, T, H).

        ``torch.gru`` / ``torch.lstm`` are the kernels behind ``nn.GRU`` / ``nn.LSTM``; a one-layer
        unidirectional RNN has exactly the parameters of its cell, so this is the cell's own
        function, looped in C++ instead of Python. A GRU on the CPU takes
        ``seq2seq.fused_rnn.gru_steps``, the same function in fewer kernels.
        """
        params = self.cell_parameters()
        if self.cell_runs_fused(embedded, *params):
            return fused_gru_steps(embedded, state[0], params)  # (B, T, H)
        has_biases = len(params) == 4
        # Arguments after params: has_biases, num_layers, dropout, train, bidirectional,
        # batch_first. The initial state gets a layer axis: (B, H) -> (1, B, H).
        if self.is_lstm:
            outputs, _, _ = torch.lstm(
                embedded,
                (state[0][None], state[1][None]),
                params,
                has_biases,
                1,
                0.0,
                self.training,
                False,
                True,
            )
        else:
            outputs, _ = torch.gru(
                embedded, state[0][None], params, has_biases, 1, 0.0, self.training, False, True
            )
        return outputs  # (B, T, H)

    def forward(
        self, tgt_in: Tensor, state: DecoderState, source: EncodedSource, need_weights: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Teacher forcing: tgt_in (B, T) -> logits (B, T, V), weights (B, T, S) or None."""
        embedded = self.dropout(self.embedding(tgt_in))  # (B, T, E)
        hiddens = self.run_cell(embedded, state)  # (B, T, H)
        # All T queries at once: (B, T, H) against (B, S, K) -> contexts (B, T, M).
        contexts, weights = self.attend(hiddens, source, need_weights)
        return self.output(hiddens, contexts), weights  # (B, T, V)

    def decode_step(
        self, prev_tokens: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """prev_tokens (B,) -> logits (B, V), new state, attention weights (B, S)."""
        if source.token_gates is None:
            state = self.step_cell(self.dropout(self.embedding(prev_tokens)), state)  # (B, E) in
        else:
            # (B, G) rows of the table, then the gates (see ``cell_gates``).
            state = self.cell_gates(source.token_gates.index_select(0, prev_tokens), state)
        query = state[0]  # (B, H)
        # When decoding, the weights average ``attentional_memory`` instead of the memory:
        # W_c [c; h] = W_c1 c + W_c2 h, and W_c1 c = Σ_s a_s (W_c1 m_s), projected once per batch,
        # which leaves no concatenation and only the W_c2 h GEMM per step.
        values = source.memory if source.attentional_memory is None else source.attentional_memory
        fused_step = self.fused_step_applies(query)
        scale = self.fused_product_scale(source, query) if fused_step else None
        if scale is not None:
            # The scores, mask, softmax and average in one C pass: (B, M) or (B, H), and (B, S).
            averaged, weights = fused_product_attend(
                query, source.projected_keys, values, source.src_lens, scale
            )
        else:
            # (B, 1, M) or (B, 1, H), and (B, 1, S)
            step_averaged, step_weights = self.attend(query[:, None, :], source, values=values)
            assert step_weights is not None  # asked for by default
            averaged, weights = step_averaged[:, 0], step_weights[:, 0]
        if source.attentional_memory is None:
            return self.output(query, averaged), state, weights
        hidden_weight = self.attentional.weight[:, self.memory_size :]  # W_c2 (H, H)
        attentional = torch.addmm(averaged, query, hidden_weight.t())  # (B, H)
        # The C pass's tanh where the cell took it too (decoding a GRU on the CPU).
        attentional = fused_tanh_(attentional) if fused_step else torch.tanh(attentional)
        return self.readout(attentional), state, weights

    def packed_logits(
        self, tgt_in: Tensor, tgt_out: Tensor, state: DecoderState, source: EncodedSource
    ) -> tuple[Tensor, Tensor] | None:
        """Teacher forcing on the N real target tokens where the cell runs fused (a GRU on the
        CPU): logits (N, V) and targets (N,), rows in ``pack_tokens``' order. The embedding, the
        cell's input projection and steps, W_c and the output layer skip the padding, which is
        up to 40 % of a batch of mixed lengths. Product scoring (dot, scaled dot, general) attends
        from the rows too, each over its sentence's keys (``PackedProductAttention``); other
        scoring reads the states back on the padded grid, one (B, T, S) product. Elsewhere None:
        ``forward`` runs padded."""
        params = self.cell_parameters()
        if not self.cell_runs_fused(*params):
            return None
        packed, targets = self.pack_targets(tgt_in, tgt_out)
        embedded = self.dropout(self.embedding(packed.tokens))  # (N, E)
        initial = state[0].index_select(0, packed.sorted_indices)  # (B, H), longest first
        hiddens = fused_gru_steps(embedded, initial, params, packed.batch_sizes)  # (N, H)
        scale = self.fused_product_scale(source, hiddens, rows=source.memory.shape[0])
        if scale is not None:
            # (N, H) queries, each against its sentence's (S, K) keys -> contexts (N, M)
            contexts = PackedProductAttention.apply(
                hiddens, source.projected_keys, source.memory, source.src_lens,
                packed.row_sentences(), scale,
            )  # fmt: skip
        else:
            # (B, T, H) queries against (B, S, K) -> contexts (B, T, M) -> the rows' (N, M)
            padded, _ = self.attend(packed.pad(hiddens), source, need_weights=False)
            contexts = packed.select(padded)
        return self.output(hiddens, contexts), targets  # (N, V), (N,)

    def fused_greedy(
        self, source: EncodedSource, state: DecoderState, task: GreedyTask
    ) -> tuple[Tensor, Tensor, int] | None:
        """``seq2seq.fused_greedy`` where ``decode_step`` would take the C paths at every step:
        a GRU decoding on the CPU (``fused_step_applies``), product scoring
        (``fused_product_scale``), the token-gate table and ``attentional_memory`` of
        ``prepare_source``, and no active dropout before the output layer. The same steps,
        without the Python between their GEMMs: greedy translation of the reverse task's test
        sentences 1.18-1.28x as fast (README, "What made it faster")."""
        query = state[0]
        table, values = source.token_gates, source.attentional_memory
        if table is None or values is None or not self.fused_step_applies(query):
            return None
        if self.dropout.training and self.dropout.p > 0:
            return None
        scale = self.fused_product_scale(source, query)
        if scale is None:
            return None
        return fused_luong_greedy(
            table, self.cell.weight_hh, self.cell.bias_hh, source.projected_keys, values,
            source.src_lens, scale, self.attentional.weight[:, self.memory_size :],
            self.output_layer.weight, self.output_layer.bias, query, task,
        )  # fmt: skip

    def fused_product_scale(
        self, source: EncodedSource, query: Tensor, rows: int | None = None
    ) -> float | None:
        """The attention's ``product_scale`` when ``seq2seq.fused_attention`` can compute the
        attention for ``query`` (R, H): dot-product or bilinear scoring at a fixed temperature,
        and what ``fused_attention_source`` asks of R rows; else None. ``rows`` stands in for R
        where the rows name their sentences themselves (teacher forcing's packed rows), not
        R / B rows per sentence (a decoding step's)."""
        scale = self.attention.product_scale(query.shape[-1])
        rows = query.shape[0] if rows is None else rows
        if scale is None or not self.fused_attention_source(source, rows):
            return None
        return scale if fused_usable(query) else None

    def output(self, hidden: Tensor, contexts: Tensor) -> Tensor:
        """Logits (..., V) from states (..., H) and contexts (..., M), through Luong's attentional
        state tanh(W_c [c_t; h_t]) (..., H), eq. 5."""
        attentional = self.attentional(torch.cat([contexts, hidden], dim=-1))  # (..., H)
        if self.fused and fused_usable(attentional) and attentional.is_contiguous():
            return self.readout(fused_tanh_with_grad_(attentional))  # a fresh tensor: in place
        return self.readout(torch.tanh(attentional))

    def readout(self, attentional: Tensor) -> Tensor:
        """Logits (..., V) from attentional states (..., H), eq. 6: what ``output`` and the
        decoding step's shortcut through ``attentional_memory`` share."""
        return self.output_layer(self.dropout(attentional))  # (..., V)

    def teacher_forced_queries(
        self, tgt_in: Tensor, state: DecoderState, source: EncodedSource
    ) -> Tensor:
        """Query t is the state after reading tgt_in[:, t], (B, T, H)."""
        return self.run_cell(self.dropout(self.embedding(tgt_in)), state)
