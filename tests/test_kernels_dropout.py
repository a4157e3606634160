"""The CPU dropout mask: its definition through SplitMix64 (the C pass and the torch path give the
same bits), rate, scale, reproducibility, gradient, and nn.Dropout's contract."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from seq2seq.kernels import dropout
from seq2seq.kernels.dropout import LEVELS, Dropout
from seq2seq.kernels.splitmix import splitmix64

needs_kernels = pytest.mark.skipif(dropout.mask_kernels() is None, reason="no compiled library")


def torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compute masks with torch's ops, as where the C library is not built."""
    monkeypatch.setattr(dropout, "mask_kernels", lambda: None)


def seed_drawn_after(seed: int) -> int:
    """The 64-bit seed a mask draws right after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return int(torch.empty((), dtype=torch.int64).random_(-(2**63), None))


@pytest.mark.parametrize("kernels", [True, False])
def test_element_i_is_dropped_where_splitmix64_output_i_is_below_the_threshold(
    kernels: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The definition, from the sequential generator's bits: top 16 bits of output i < dropped."""
    if kernels and dropout.mask_kernels() is None:
        pytest.skip("no compiled library")
    if not kernels:
        torch_path(monkeypatch)
    shape, p = (3, 5, 7), 0.3  # 105 elements: the C loop's vector remainder
    seed = seed_drawn_after(7)
    levels = [(value >> 48) & 0xFFFF for value in splitmix64(seed, 105).tolist()]
    dropped = round(p * LEVELS)
    expected = torch.tensor([0.0 if level < dropped else 1 / (1 - dropped / LEVELS)
                             for level in levels]).view(shape)  # fmt: skip
    torch.manual_seed(7)
    outputs = Dropout(p).train()(torch.ones(shape))
    torch.testing.assert_close(outputs, expected, rtol=1e-6, atol=0)


@needs_kernels
@pytest.mark.parametrize("shape", [(1,), (4099,), (64, 18, 128), (5, 65_537)])
def test_the_c_pass_and_the_torch_path_give_the_same_mask(
    shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On one thread and two, and across the size at which the C pass splits over threads."""
    inputs = torch.randn(shape)
    threads = torch.get_num_threads()
    masks = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            torch.manual_seed(11)
            masks.append(Dropout(0.1).train()(inputs))
    finally:
        torch.set_num_threads(threads)
    torch_path(monkeypatch)
    torch.manual_seed(11)
    masks.append(Dropout(0.1).train()(inputs))
    assert torch.equal(masks[0], masks[1])
    assert torch.equal(masks[0], masks[2])


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drop_rate_and_scale_match_the_quantised_probability(p: float) -> None:
    torch.manual_seed(0)
    dropout = Dropout(p).train()
    inputs = torch.ones(200, 501)  # an odd element count: the C loop's vector remainder
    outputs = dropout(inputs)
    dropped = round(p * LEVELS) / LEVELS
    rate = (outputs == 0).float().mean().item()
    # Binomial standard error over 100,200 elements: 5 sigma.
    assert abs(rate - dropped) < 5 * math.sqrt(dropped * (1 - dropped) / inputs.numel())
    kept = outputs[outputs != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - dropped)))
    # The expectation of the output is the input.
    assert abs(outputs.mean().item() - 1.0) < 0.02


def test_neighbouring_elements_are_independent() -> None:
    torch.manual_seed(1)
    kept = Dropout(0.5).train()(torch.ones(40_000, 4)) != 0
    for column in range(4):
        assert abs(kept[:, column].float().mean().item() - 0.5) < 0.02
    # Neighbouring elements agree half of the time, as independent fair coins do.
    for offset in (1, 2, 3):
        agree = (kept.flatten()[offset:] == kept.flatten()[:-offset]).float().mean().item()
        assert abs(agree - 0.5) < 0.01


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


def test_bfloat16_inputs_keep_their_dtype_and_get_the_float32_mask() -> None:
    torch.manual_seed(4)
    outputs = Dropout(0.1).train()(torch.ones(16, 16, dtype=torch.bfloat16))
    assert outputs.dtype == torch.bfloat16
    torch.manual_seed(4)
    expected = Dropout(0.1).train()(torch.ones(16, 16))
    assert torch.equal(outputs == 0, expected == 0)
