"""Bidirectional recurrent encoder over packed sequences.

Shape legend: B batch, S source length, E embedding size, H hidden size per direction, L layers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from seq2seq.dropout import Dropout
from seq2seq.embedding import Embedding
from seq2seq.fused_rnn import gru as fused_gru
from seq2seq.fused_rnn import usable as fused_usable
from seq2seq.packing import pack_tokens

RNNFactory = Callable[..., nn.GRU | nn.LSTM]


class RNNEncoder(nn.Module):
    """Embeddings, then a bidirectional GRU or LSTM (``rnn`` is ``nn.GRU`` or ``nn.LSTM``).

    ``forward`` returns the memory (B, S, 2H) the decoder attends over, zero at padded positions,
    and a summary (B, 2H) of each sentence: the last layer's final forward and backward states.

    ``fused_rnn``: run a GRU through ``seq2seq.fused_rnn`` where it applies (float32 on the CPU),
    the same function with a fraction of ATen's per-step kernels; otherwise ``nn.GRU`` itself.
    """

    def __init__(
        self,
        vocab_size: int,
        embedding_size: int,
        hidden_size: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        padding_idx: int = 0,
        rnn: RNNFactory = nn.GRU,
        fused_rnn: bool = True,
    ) -> None:
        super().__init__()
        self.embedding = Embedding(vocab_size, embedding_size, padding_idx=padding_idx)
        self.dropout = Dropout(dropout)
        self.rnn = rnn(
            input_size=embedding_size,
            hidden_size=hidden_size,
            num_layers=num_layers,
            batch_first=True,
            bidirectional=True,
            dropout=dropout if num_layers > 1 else 0.0,
        )
        self.output_size = 2 * hidden_size
        self.fused = fused_rnn

    def forward(self, src: Tensor, src_lens: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) token ids, src_lens (B,) -> memory (B, S, 2H), summary (B, 2H)."""
        lengths = src_lens.cpu()
        if self.uses_fused_rnn(self.embedding.weight):
            memory, final = self.fused_recurrence(src, lengths)
        else:
            embedded = self.dropout(self.embedding(src))  # (B, S, E)
            # Packing skips the padding, so the backward direction starts at each sentence's
            # last token.
            packed = pack_padded_sequence(embedded, lengths, batch_first=True, enforce_sorted=False)
            packed_memory, final = self.rnn(packed)
            memory, _ = pad_packed_sequence(
                packed_memory, batch_first=True, total_length=src.shape[1]
            )
            memory = self.dropout(memory)
        final_hidden = final[0] if isinstance(final, tuple) else final  # LSTM: (h_n, c_n)
        # final_hidden: (L*2, B, H); the last layer's forward and backward states are the last two.
        summary = torch.cat([final_hidden[-2], final_hidden[-1]], dim=-1)  # (B, 2H)
        return memory, summary

    def fused_recurrence(self, src: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """The GRU through ``seq2seq.fused_rnn`` on the real tokens only: src (B, S), lengths
        (B,) on the CPU -> memory (B, S, 2H) (dropout applied), final states (L·2, B, H).

        The token ids are packed (``pack_tokens``), so the embedding, its dropout, the input
        projections and the steps see the N real tokens and no padding, whatever the batch's
        mix of lengths; one scatter puts the memory back on the (B, S) grid for the attention.
        """
        assert isinstance(self.rnn, nn.GRU)
        packed = pack_tokens(src, lengths)
        rows = self.dropout(self.embedding(packed.tokens))  # (N, E)
        sorted_indices = packed.sorted_indices
        batch_sizes = torch.tensor(packed.batch_sizes, dtype=torch.long)
        sequence = PackedSequence(rows, batch_sizes, sorted_indices, packed.unsorted_indices())
        outputs, final = fused_gru(self.rnn, sequence)  # (N, 2H) rows; final (L·2, B, H)
        return packed.pad(self.dropout(outputs.data)), final  # (B, S, 2H)

    def uses_fused_rnn(self, embedded: Tensor) -> bool:
        """Whether ``forward`` runs the GRU through ``seq2seq.fused_rnn`` for ``embedded`` (the
        embeddings, or their weight: same device and dtype)."""
        return (
            self.fused
            and isinstance(self.rnn, nn.GRU)
            and fused_usable(embedded, *self.rnn.parameters())
        )
