"""Bidirectional recurrent encoder over packed sequences.

Shape legend: B batch, S source length, E embedding size, H hidden size per direction, L layers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seq2seq.models.embedding import Embedding

RNNFactory = Callable[..., nn.GRU | nn.LSTM]


class RNNEncoder(nn.Module):
    """Embeddings, then a bidirectional GRU or LSTM (``rnn`` is ``nn.GRU`` or ``nn.LSTM``).

    ``forward`` returns the memory (B, S, 2H) the decoder attends over, zero at padded positions,
    and a summary (B, 2H) of each sentence: the last layer's final forward and backward states.
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
    ) -> None:
        super().__init__()
        self.embedding = Embedding(vocab_size, embedding_size, padding_idx=padding_idx)
        self.dropout = nn.Dropout(dropout)
        self.rnn = rnn(
            input_size=embedding_size,
            hidden_size=hidden_size,
            num_layers=num_layers,
            batch_first=True,
            bidirectional=True,
            dropout=dropout if num_layers > 1 else 0.0,
        )
        self.output_size = 2 * hidden_size

    def forward(self, src: Tensor, src_lens: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) token ids, src_lens (B,) -> memory (B, S, 2H), summary (B, 2H)."""
        embedded = self.dropout(self.embedding(src))  # (B, S, E)
        # Packing skips the padding, so the backward direction starts at each sentence's last
        # token.
        packed = pack_padded_sequence(
            embedded, src_lens.cpu(), batch_first=True, enforce_sorted=False
        )
        packed_memory, final = self.rnn(packed)
        memory, _ = pad_packed_sequence(packed_memory, batch_first=True, total_length=src.shape[1])
        return self.dropout(memory), self.summary(final)

    @staticmethod
    def summary(final: Tensor | tuple[Tensor, Tensor]) -> Tensor:
        """The last layer's final forward and backward states (B, 2H) from the RNN's final
        states (L·2, B, H) (an LSTM's (h_n, c_n): its h_n)."""
        final_hidden = final[0] if isinstance(final, tuple) else final
        return torch.cat([final_hidden[-2], final_hidden[-1]], dim=-1)  # (B, 2H)
