import math

import torch

from seq2seq.models.embedding import Embedding


def test_weights_have_the_scale_of_unit_norm_rows() -> None:
    torch.manual_seed(0)
    embedding = Embedding(4000, 128, padding_idx=0)
    rows = embedding.weight[1:].detach()
    assert math.isclose(rows.std().item(), 128**-0.5, rel_tol=0.02)
    assert abs(rows.mean().item()) < 3 * 128**-0.5 / math.sqrt(rows.numel())
    assert math.isclose(rows.norm(dim=1).mean().item(), 1.0, rel_tol=0.02)


def test_padding_row_is_zero_and_gets_no_gradient() -> None:
    embedding = Embedding(10, 8, padding_idx=3)
    assert torch.equal(embedding.weight[3], torch.zeros(8))
    embedding(torch.tensor([[3, 1, 3]])).sum().backward()
    assert embedding.weight.grad is not None
    assert torch.equal(embedding.weight.grad[3], torch.zeros(8))
    assert torch.equal(embedding.weight.grad[1], torch.ones(8))


def test_reset_parameters_draws_again() -> None:
    embedding = Embedding(10, 8)
    before = embedding.weight.detach().clone()
    embedding.reset_parameters()
    assert not torch.equal(before, embedding.weight)
