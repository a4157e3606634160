"""The CPU dropout mask: rate, scale, reproducibility, gradient, and nn.Dropout's contract."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from seq2seq.dropout import LEVELS, Dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drop_rate_and_scale_match_the_quantised_probability(p: float) -> None:
    torch.manual_seed(0)
    dropout = Dropout(p).train()
    inputs = torch.ones(200, 501)  # an odd element count: the last 64-bit draw is cut
    outputs = dropout(inputs)
    dropped = round(p * LEVELS) / LEVELS
    rate = (outputs == 0).float().mean().item()
    # Binomial standard error over 100,200 elements: 5 sigma.
    assert abs(rate - dropped) < 5 * math.sqrt(dropped * (1 - dropped) / inputs.numel())
    kept = outputs[outputs != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - dropped)))
    # The expectation of the output is the input.
    assert abs(outputs.mean().item() - 1.0) < 0.02


def test_every_lane_of_a_draw_is_used_independently() -> None:
    """Each of the four 16-bit lanes of a 64-bit draw decides its own element."""
    torch.manual_seed(1)
    outputs = Dropout(0.5).train()(torch.ones(40_000, 4))  # row i = the 4 lanes of draw i
    kept = outputs != 0
    for lane in range(4):
        assert abs(kept[:, lane].float().mean().item() - 0.5) < 0.02
    # Neighbouring lanes agree half of the time, as independent fair coins do.
    agree = (kept[:, 0] == kept[:, 1]).float().mean().item()
    assert abs(agree - 0.5) < 0.02


def test_gradient_is_the_same_mask() -> None:
    torch.manual_seed(2)
    inputs = torch.randn(64, 30, requires_grad=True)
    outputs = Dropout(0.2).train()(inputs)
    outputs.sum().backward()
    assert inputs.grad is not None
    expected = torch.where(outputs != 0, outputs / inputs.detach(), torch.zeros(()))
    torch.testing.assert_close(inputs.grad, expected)


def test_reproducible_from_the_seed() -> None:
    dropout = Dropout(0.1).train()
    inputs = torch.randn(8, 16, 32)
    torch.manual_seed(3)
    first = dropout(inputs)
    torch.manual_seed(3)
    assert torch.equal(first, dropout(inputs))
    assert not torch.equal(first, dropout(inputs))  # a new mask on the next call


def test_contract_of_nn_dropout() -> None:
    inputs = torch.randn(5, 7)
    assert torch.equal(Dropout(0.3).eval()(inputs), inputs)
    assert torch.equal(Dropout(0.0).train()(inputs), inputs)
    assert torch.equal(Dropout(1.0).train()(inputs), nn.Dropout(1.0).train()(inputs))
    assert Dropout(0.2).train()(torch.empty(0, 3)).shape == (0, 3)
    assert Dropout(0.1).state_dict() == {}
    assert "p=0.1" in repr(Dropout(0.1))
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="between 0 and 1"):
            Dropout(bad)


def test_bfloat16_inputs_keep_their_dtype() -> None:
    outputs = Dropout(0.1).train()(torch.ones(16, 16, dtype=torch.bfloat16))
    assert outputs.dtype == torch.bfloat16
