"""Encoder–decoder models: what every model offers search, training and export
(``EncoderDecoder``), and ``Seq2Seq``, a bidirectional RNN encoder and an attention decoder.

Shape legend: B batch, S source length, T target length, V target vocabulary, M memory size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from seq2seq.attention import AttentionParts
from seq2seq.errors import ConfigError
from seq2seq.models.decoder import (
    AttentionDecoder,
    AttentionFactory,
    BahdanauDecoder,
    CellFactory,
    DecoderState,
)
from seq2seq.models.encoder import RNNEncoder, RNNFactory

DecoderFactory = Callable[..., AttentionDecoder]


class EncoderDecoder(nn.Module):
    """An ``encoder`` (src (B, S), src_lens (B,) -> memory, summary) and a ``decoder`` with
    ``prepare_source``, ``init_state``, ``forward`` (teacher forcing), ``decode_step`` and
    ``teacher_forced_logits``: what greedy and beam search, the loss, the translator and the
    export read. ``Seq2Seq`` (RNNs) and ``seq2seq.models.transformer.Transformer`` are two."""

    encoder: nn.Module
    decoder: Any  # an AttentionDecoder or a TransformerDecoder: the methods above

    def encode(self, src: Tensor, src_lens: Tensor) -> tuple[Any, DecoderState]:
        """src (B, S), src_lens (B,) -> what every decoder step reads, and the initial state."""
        memory, summary = self.encoder(src, src_lens)  # (B, S, M), (B, M) or None
        source = self.decoder.prepare_source(memory, src_lens)
        return source, self.initial_state(summary, memory)

    def initial_state(self, summary: Tensor | None, memory: Tensor) -> DecoderState:
        """The decoder's first state from the encoder's summary (B, M) (None: a Transformer's)
        and memory (B, S, M)."""
        return self.decoder.init_state(summary)

    def decode_step(
        self, prev_tokens: Tensor, state: DecoderState, source: Any
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """prev_tokens (B,) -> logits (B, V), next state, attention weights (B, S)."""
        return self.decoder.decode_step(prev_tokens, state, source)

    def forward(
        self, src: Tensor, src_lens: Tensor, tgt_in: Tensor, need_weights: bool = True
    ) -> tuple[Tensor, Tensor | None]:
        """Teacher forcing: -> logits (B, T, V), attention weights (B, T, S) or None."""
        source, state = self.encode(src, src_lens)
        return self.decoder(tgt_in, state, source, need_weights)

    def teacher_forced_logits_and_weights(
        self, src: Tensor, src_lens: Tensor, tgt_in: Tensor, tgt_out: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """What a loss on the attention reads: logits (N, V) and their targets (N,) (the whole
        (B, T) grid's, or the real tokens' only), and the weights (B, T, S), whatever they are
        at the padded steps (those losses skip them)."""
        source, state = self.encode(src, src_lens)
        return self.decoder.teacher_forced_logits_and_weights(tgt_in, tgt_out, state, source)


class Seq2Seq(EncoderDecoder):
    """An encoder–decoder with a pluggable attention scoring function.

    ``attention`` builds the scoring function from ``query_size`` and ``key_size`` (Hydra passes a
    ``_partial_`` of one of the classes in ``seq2seq.attention``); ``decoder`` is the decoder class
    (``BahdanauDecoder``, sequential, or ``LuongDecoder``, parallel over target steps), built with
    the sizes below and the recurrent ``cell``. ``hidden_size`` is the decoder's state size; each
    encoder direction has ``encoder_hidden_size`` (default ``hidden_size // 2``, so the encoder's
    output has the decoder's size). ``num_heads`` > 1 makes the attention a multi-head attention
    around the scoring function (``model.num_heads``, as in a Transformer; 1 is the single scoring
    function). ``attention_parts``: the attention's normalizer, window and key bias
    (``seq2seq.attention.AttentionParts``; None: global softmax, no bias). ``input_feeding``:
    the Luong decoder feeds its last attentional vector to the cell (``LuongDecoder``).
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        attention: AttentionFactory,
        embedding_size: int = 128,
        hidden_size: int = 256,
        encoder_hidden_size: int | None = None,
        encoder_layers: int = 1,
        dropout: float = 0.1,
        padding_idx: int = 0,
        rnn: RNNFactory = nn.GRU,
        cell: CellFactory = nn.GRUCell,
        decoder: DecoderFactory = BahdanauDecoder,
        num_heads: int = 1,
        attention_parts: AttentionParts | None = None,
        input_feeding: bool = False,
    ) -> None:
        super().__init__()
        for name, size in [("embedding_size", embedding_size), ("hidden_size", hidden_size)]:
            if size < 1:
                raise ConfigError(f"model.{name} must be a positive integer, got {size}.")
        if encoder_hidden_size is None:
            encoder_hidden_size = max(1, hidden_size // 2)
        self.encoder = RNNEncoder(
            vocab_size=src_vocab_size,
            embedding_size=embedding_size,
            hidden_size=encoder_hidden_size,
            num_layers=encoder_layers,
            dropout=dropout,
            padding_idx=padding_idx,
            rnn=rnn,
        )
        self.decoder = decoder(
            vocab_size=tgt_vocab_size,
            embedding_size=embedding_size,
            hidden_size=hidden_size,
            memory_size=self.encoder.output_size,
            attention=attention,
            dropout=dropout,
            padding_idx=padding_idx,
            cell=cell,
            num_heads=num_heads,
            attention_parts=attention_parts,
            input_feeding=input_feeding,
        )

    def initial_state(self, summary: Tensor | None, memory: Tensor) -> DecoderState:
        """The decoder's first state; coverage (``attention.coverage``) needs the source length."""
        assert summary is not None  # the RNN encoder always summarises
        return self.decoder.init_state(summary, memory.shape[1])
