"""The training loss: summed token cross-entropy, with label smoothing as its formula says."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from seq2seq.training.loss import decoder_loss
from tests.test_model import make_batch, make_model
from tests.test_transformer import make_transformer


def smoothed_cross_entropy(logits: Tensor, targets: Tensor, epsilon: float) -> Tensor:
    """Σ over real tokens of -(1 - ε) log p(y) - (ε / V) Σ_v log p(v), written out."""
    log_probs = logits.log_softmax(-1)  # (N, V)
    real = targets != 0
    nll = -log_probs.gather(1, targets[:, None])[:, 0]  # (N,)
    uniform = -log_probs.mean(-1)  # (N,): (1 / V) Σ_v -log p(v)
    return ((1 - epsilon) * nll + epsilon * uniform)[real].sum()


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("kind", ["rnn", "transformer"])
def test_label_smoothing_is_its_formula(epsilon: float, kind: str) -> None:
    model = make_model("dot", decoder="luong", dropout=0.0) if kind == "rnn" else make_transformer()
    src, src_lens, tgt_in = make_batch()
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full((3, 1), 3)], dim=1)
    tgt_out[2, 4:] = 0  # padding the loss must skip
    memory, summary = model.encoder(src, src_lens)
    state = model.decoder.init_state(summary)
    loss = decoder_loss(model.decoder, tgt_in, tgt_out, memory, src_lens, *state,
                        label_smoothing=epsilon)  # fmt: skip
    logits, _ = model(src, src_lens, tgt_in)
    expected = smoothed_cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), epsilon)
    torch.testing.assert_close(loss, expected, atol=1e-4, rtol=1e-5)
