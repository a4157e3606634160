"""seq2seq.lit_module's CPU gradient clipping against torch.nn.utils.clip_grad_norm_."""

from __future__ import annotations

import pytest
import torch

from seq2seq.lit_module import clip_grad_norm_on_cpu


def gradients(scale: float) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shapes = [(7, 3), (5,), (2, 2, 4)]
    return [torch.randn(shape, generator=generator) * scale for shape in shapes]


@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0])  # below, around and above the limit
def test_clipping_is_torchs(scale: float) -> None:
    ours, theirs = gradients(scale), gradients(scale)
    parameters = [torch.nn.Parameter(torch.zeros_like(grad)) for grad in theirs]
    for parameter, grad in zip(parameters, theirs, strict=True):
        parameter.grad = grad
    expected_norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm=2.0)
    norm = clip_grad_norm_on_cpu(ours, 2.0)
    torch.testing.assert_close(norm, expected_norm)
    for got, parameter in zip(ours, parameters, strict=True):
        torch.testing.assert_close(got, parameter.grad)
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in ours]))
    assert total <= 2.0 + 1e-5


def test_gradients_under_the_limit_are_left_alone() -> None:
    grads = gradients(0.01)
    before = [grad.clone() for grad in grads]
    clip_grad_norm_on_cpu(grads, 5.0)
    for got, want in zip(grads, before, strict=True):
        assert torch.equal(got, want)
