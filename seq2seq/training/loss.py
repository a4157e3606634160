"""The training loss: summed token cross-entropy under teacher forcing.

Shape legend: B batch, S source length, T target length, V target vocabulary, N scored tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.data.tokenization import PAD_ID
from seq2seq.models.decoder import AttentionDecoder
from seq2seq.models.model import EncoderDecoder


def decoder_loss(
    decoder: AttentionDecoder,
    tgt_in: Tensor,
    tgt_out: Tensor,
    memory: Tensor,
    src_lens: Tensor,
    *state: Tensor,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Summed token cross-entropy (in float32) of the decoder under teacher forcing, padding
    excluded; with ``label_smoothing`` ε, against targets that put 1 - ε on the reference token
    and ε spread evenly over the vocabulary (Szegedy et al., 2016).

    tgt_in, tgt_out (B, T), memory (B, S, M), src_lens (B,), state tensors of (B, H) -> ().
    """
    source = decoder.prepare_source(memory, src_lens)
    logits, targets = decoder.teacher_forced_logits(tgt_in, tgt_out, state, source)  # (N, V)
    return F.cross_entropy(
        logits.float(),
        targets,
        ignore_index=PAD_ID,
        reduction="sum",
        label_smoothing=label_smoothing,
    )


class DecoderLoss(nn.Module):
    """``decoder_loss`` as a module, which is what ``make_graphed_callables`` records (it needs the
    module to know which parameters the graph differentiates)."""

    def __init__(self, decoder: AttentionDecoder, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.decoder = decoder
        self.label_smoothing = label_smoothing

    def forward(
        self, tgt_in: Tensor, tgt_out: Tensor, memory: Tensor, src_lens: Tensor, *state: Tensor
    ) -> Tensor:
        return decoder_loss(
            self.decoder, tgt_in, tgt_out, memory, src_lens, *state,
            label_smoothing=self.label_smoothing,
        )  # fmt: skip


def teacher_forced_loss(
    model: EncoderDecoder,
    decode: Callable[..., Tensor],
    src: Tensor,
    src_lens: Tensor,
    tgt_in: Tensor,
    tgt_out: Tensor,
) -> Tensor:
    """The encoder (always eager), the decoder's initial state, then ``decode``: a
    ``DecoderLoss`` or a ``DecoderGraphs``, which take (tgt_in, tgt_out, memory, src_lens,
    *state). src (B, S), tgt_in, tgt_out (B, T) -> ()."""
    memory, summary = model.encoder(src, src_lens)  # (B, S, M), (B, M)
    state = model.decoder.init_state(summary)
    return decode(tgt_in, tgt_out, memory, src_lens, *state)
