"""Attention decoder in the style of Bahdanau et al. (2015).

Shape legend: B batch, S source length, T target length, E embedding size, H decoder hidden size,
M memory size (encoder output), K key size, V target vocabulary.

At step t the query is the previous decoder state s_{t-1}; the context c_t it reads is concatenated
with the embedding of the previous target token to give s_t = cell([e_{t-1}; c_t], s_{t-1}). The
output layer sees [s_t; c_t; e_{t-1}] and runs once over all steps after the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from seq2seq.attention import Attention

AttentionFactory = Callable[..., Attention]
CellFactory = Callable[..., nn.GRUCell | nn.LSTMCell]

# A GRU state is (h,), an LSTM state is (h, c); h (B, H) is the query in both.
DecoderState = tuple[Tensor, ...]


@dataclass
class EncodedSource:
    """What the decoder reads at every step, computed once per source batch."""

    memory: Tensor  # (B, S, M) encoder outputs: the attention values
    keys: Tensor  # (B, S, K) memory, projected to the query size when the scoring needs it
    projected_keys: Tensor  # attention.project_keys(keys), the query-independent part of scores
    src_lens: Tensor  # (B,) number of real source tokens

    def index_select(self, indices: Tensor) -> EncodedSource:
        """Rows of the batch in the order of ``indices`` (B',), e.g. to expand or reorder beams."""
        return EncodedSource(
            *(
                tensor.index_select(0, indices)
                for tensor in (self.memory, self.keys, self.projected_keys, self.src_lens)
            )
        )


class BahdanauDecoder(nn.Module):
    """A GRU (or LSTM) cell stepped over the target, attending once per step."""

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
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_size, padding_idx=padding_idx)
        self.dropout = nn.Dropout(dropout)
        self.attention = attention(query_size=hidden_size, key_size=memory_size)
        # Dot products need keys of the query's size: project the memory once per batch.
        self.key_projection: nn.Module = (
            nn.Linear(memory_size, hidden_size, bias=False)
            if self.attention.needs_equal_sizes and memory_size != hidden_size
            else nn.Identity()
        )
        self.cell = cell(embedding_size + memory_size, hidden_size)
        self.is_lstm = isinstance(self.cell, nn.LSTMCell)
        # The bridge turns the encoder's sentence summary into the initial state (and LSTM cell).
        self.bridge = nn.Linear(memory_size, hidden_size * (2 if self.is_lstm else 1))
        self.output_layer = nn.Linear(hidden_size + memory_size + embedding_size, vocab_size)

    def prepare_source(self, memory: Tensor, src_lens: Tensor) -> EncodedSource:
        """Keys and their query-independent projection, once per batch. memory (B, S, M)."""
        keys = self.key_projection(memory)  # (B, S, K)
        return EncodedSource(memory, keys, self.attention.project_keys(keys), src_lens)

    def init_state(self, summary: Tensor) -> DecoderState:
        """summary (B, M) -> initial state, tensors of (B, H)."""
        bridged = torch.tanh(self.bridge(summary))  # (B, H) or (B, 2H) for an LSTM
        return tuple(bridged.chunk(2, dim=-1)) if self.is_lstm else (bridged,)

    def step(
        self,
        embedded: Tensor,
        state: DecoderState,
        source: EncodedSource,
        need_weights: bool = True,
    ) -> tuple[DecoderState, Tensor, Tensor | None]:
        """One step: embedded (B, E) previous token -> new state, context (B, M), weights (B, S).

        With ``need_weights=False`` the weights are None and the scoring function may take a fused
        path (``Attention.context``).
        """
        query = state[0][:, None, :]  # (B, 1, H): the previous state asks where to look
        if need_weights:
            context, weights = self.attention(
                query,
                source.keys,
                source.memory,
                source.src_lens,
                projected_keys=source.projected_keys,
            )  # (B, 1, M), (B, 1, S)
            step_weights: Tensor | None = weights[:, 0]  # (B, S)
        else:
            context = self.attention.context(
                query,
                source.keys,
                source.memory,
                source.src_lens,
                projected_keys=source.projected_keys,
            )  # (B, 1, M)
            step_weights = None
        context = context[:, 0]  # (B, M)
        cell_input = torch.cat([embedded, context], dim=-1)  # (B, E + M)
        if self.is_lstm:
            new_state: DecoderState = self.cell(cell_input, (state[0], state[1]))
        else:
            new_state = (self.cell(cell_input, state[0]),)
        return new_state, context, step_weights

    def output(self, hidden: Tensor, contexts: Tensor, embedded: Tensor) -> Tensor:
        """Logits (..., V) from states (..., H), contexts (..., M) and input embeddings (..., E)."""
        features = torch.cat([hidden, contexts, embedded], dim=-1)  # (..., H + M + E)
        return self.output_layer(self.dropout(features))  # (..., V)

    def forward(
        self, tgt_in: Tensor, state: DecoderState, source: EncodedSource, need_weights: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Teacher forcing: tgt_in (B, T) -> logits (B, T, V), weights (B, T, S) or None."""
        embedded = self.dropout(self.embedding(tgt_in))  # (B, T, E)
        hiddens, contexts, weights = [], [], []
        for t in range(tgt_in.shape[1]):
            state, context, step_weights = self.step(embedded[:, t], state, source, need_weights)
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
