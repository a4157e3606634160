"""Bidirectional recurrent encoder over packed sequences.

Shape legend: B batch, S source length, E embedding size, H hidden size per direction, L layers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seq2seq.dropout import Dropout
from seq2seq.embedding import Embedding
from seq2seq.fused_rnn import gru as fused_gru
from seq2seq.fused_rnn import usable as fused_usable

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
        embedded = self.dropout(self.embedding(src))  # (B, S, E)
        lengths = src_lens.cpu()
        if self.uses_fused_rnn(embedded):
            assert isinstance(self.rnn, nn.GRU)
            memory, final = self.fused_recurrence(embedded, lengths)
        else:
            # Packing skips the padding, so the backward direction starts at each sentence's
            # last token.
            packed = pack_padded_sequence(embedded, lengths, batch_first=True, enforce_sorted=False)
            packed_memory, final = self.rnn(packed)
            memory, _ = pad_packed_sequence(
                packed_memory, batch_first=True, total_length=src.shape[1]
            )
        final_hidden = final[0] if isinstance(final, tuple) else final  # LSTM: (h_n, c_n)
        # final_hidden: (L*2, B, H); the last layer's forward and backward states are the last two.
        summary = torch.cat([final_hidden[-2], final_hidden[-1]], dim=-1)  # (B, 2H)
        return self.dropout(memory), summary

    def fused_recurrence(self, embedded: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """The GRU through ``seq2seq.fused_rnn`` on the padded batch: embedded (B, S, E),
        lengths (B,) on the CPU -> memory (B, S, 2H), final states (L·2, B, H).

        Its steps take the sentences longest first; a batch in another order (the samplers
        give longest first: ``BucketBatchSampler``, ``Translator``) is sorted for it and put
        back, two gathers where packing makes three copies.
        """
        assert isinstance(self.rnn, nn.GRU)
        order = None
        if bool((lengths[1:] > lengths[:-1]).any()):
            order = torch.argsort(lengths, descending=True, stable=True)  # (B,)
            embedded, lengths = embedded.index_select(0, order.to(embedded.device)), lengths[order]
        memory, final = fused_gru(self.rnn, embedded, lengths=lengths.tolist())
        if order is not None:
            restore = torch.argsort(order).to(memory.device)  # (B,) the inverse permutation
            memory, final = memory.index_select(0, restore), final.index_select(1, restore)
        return memory, final

    def uses_fused_rnn(self, embedded: Tensor) -> bool:
        """Whether ``forward`` runs the GRU through ``seq2seq.fused_rnn`` for this input."""
        return (
            self.fused
            and isinstance(self.rnn, nn.GRU)
            and fused_usable(embedded, *self.rnn.parameters())
        )
