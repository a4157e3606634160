"""The normalizers against references: sparsemax against its closed form written out here
(Martins and Astudillo's sort and threshold, row by row), entmax-1.5 and α-entmax against the
``entmax`` package, the family's limits (α → 1 is softmax, α = 2 sparsemax), autograd's gradcheck
in float64 with masks, and the masking contract of ``masked_softmax`` in every dtype."""

from __future__ import annotations

import functools
import math
import re

import pytest
import torch
from torch import Tensor

from seq2seq.attention import masked_softmax, valid_key_mask
from seq2seq.errors import ConfigError
from seq2seq.normalizers import (
    Entmax,
    build_normalizer,
    entmax15,
    entmax_bisect,
    softmax,
    sparsemax,
)

entmax = pytest.importorskip("entmax", reason="the entmax package (dev extra) is the reference")


def sparsemax_by_hand(z: list[float]) -> list[float]:
    """Martins and Astudillo (2016), Algorithm 1, on one row: sort descending, the support is the
    largest k with 1 + k z_(k) > Σ_{j<=k} z_(j), τ = (Σ_{j<=k} z_(j) - 1) / k, p = [z - τ]_+."""
    ordered = sorted(z, reverse=True)
    k = max(i for i in range(1, len(z) + 1) if 1 + i * ordered[i - 1] > sum(ordered[:i]))
    tau = (sum(ordered[:k]) - 1) / k
    return [max(value - tau, 0.0) for value in z]


def masked(lens: list[int], queries: int, keys: int) -> Tensor:
    """A (B, Tq, Tk) mask of per-sentence lengths (0: a row with no valid key)."""
    return valid_key_mask(torch.tensor(lens), queries, keys)


NORMALIZERS = {
    "softmax": softmax,
    "sparsemax": sparsemax,
    "entmax15": entmax15,
    "entmax_1.3": lambda z, m: entmax_bisect(z, m, 1.3),
    "entmax_2.5": lambda z, m: entmax_bisect(z, m, 2.5),
}


def test_sparsemax_is_the_closed_form_row_by_row() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 3, 9, dtype=torch.float64) * 2
    lens = [9, 5, 1, 7]
    weights = sparsemax(logits, masked(lens, 3, 9))
    for b, length in enumerate(lens):
        for t in range(3):
            expected = sparsemax_by_hand(logits[b, t, :length].tolist())
            assert weights[b, t, :length].tolist() == pytest.approx(expected, abs=1e-12)
            assert weights[b, t, length:].tolist() == [0.0] * (9 - length)
    assert (weights == 0).any(), "these logits should leave some real keys at exactly 0"


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (sparsemax, lambda z: entmax.sparsemax(z, dim=-1)),
        (entmax15, lambda z: entmax.entmax15(z, dim=-1)),
        (lambda z, m: entmax_bisect(z, m, 1.25), lambda z: entmax.entmax_bisect(z, 1.25, dim=-1)),
        (lambda z, m: entmax_bisect(z, m, 1.5), lambda z: entmax.entmax_bisect(z, 1.5, dim=-1)),
        (lambda z, m: entmax_bisect(z, m, 3.0), lambda z: entmax.entmax_bisect(z, 3.0, dim=-1)),
    ],
)
def test_the_entmax_family_matches_the_entmax_package_on_the_valid_keys(ours, theirs) -> None:
    """The package has no mask (its -inf masks give NaN: its issue 17), so each sentence's valid
    keys are given to it alone; ours sees the padded batch and must agree there."""
    torch.manual_seed(1)
    logits = torch.randn(3, 4, 8, dtype=torch.float64) * 3
    lens = [8, 3, 6]
    weights = ours(logits, masked(lens, 4, 8))
    for b, length in enumerate(lens):
        expected = theirs(logits[b, :, :length])
        torch.testing.assert_close(weights[b, :, :length], expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (sparsemax, lambda z: entmax.sparsemax(z, dim=-1)),
        (entmax15, lambda z: entmax.entmax15(z, dim=-1)),
        (lambda z, m: entmax_bisect(z, m, 1.5), lambda z: entmax.entmax_bisect(z, 1.5, dim=-1)),
    ],
)
def test_a_row_without_a_valid_key_breaks_the_package_but_not_ours(ours, theirs) -> None:
    """entmax issue 17: masking with -inf works while one key is left, but a row with none (an
    empty source, or a window with nothing in it) raises or gives NaN there; ours is all zeros."""
    empty = torch.full((1, 1, 3), float("-inf"), dtype=torch.float64)
    try:
        broken = bool(torch.isnan(theirs(empty)).any())
    except RuntimeError:
        broken = True
    assert broken
    weights = ours(torch.zeros(1, 1, 3, dtype=torch.float64), masked([0], 1, 3))
    assert weights.tolist() == [[[0.0, 0.0, 0.0]]]


def test_alpha_near_one_is_softmax_and_two_is_sparsemax_and_bisection_agrees() -> None:
    torch.manual_seed(2)
    logits = torch.randn(2, 3, 6, dtype=torch.float64)
    mask = masked([6, 4], 3, 6)
    near_one = entmax_bisect(logits, mask, 1.0001)
    torch.testing.assert_close(near_one, softmax(logits, mask), rtol=0, atol=1e-4)
    torch.testing.assert_close(entmax_bisect(logits, mask, 2.0), sparsemax(logits, mask))
    torch.testing.assert_close(entmax_bisect(logits, mask, 1.5), entmax15(logits, mask))


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
def test_gradcheck_in_float64_with_masks(name: str) -> None:
    torch.manual_seed(3)
    logits = (torch.randn(3, 2, 5, dtype=torch.float64) * 2).requires_grad_()
    mask = masked([5, 2, 0], 2, 5)  # a full row, a padded one, an empty one
    assert torch.autograd.gradcheck(lambda z: NORMALIZERS[name](z, mask), (logits,))


def test_gradcheck_of_a_learned_alpha() -> None:
    torch.manual_seed(4)
    logits = torch.randn(2, 2, 5, dtype=torch.float64).requires_grad_()
    alpha = torch.tensor(1.6, dtype=torch.float64, requires_grad=True)
    mask = masked([5, 3], 2, 5)
    assert torch.autograd.gradcheck(lambda z, a: entmax_bisect(z, mask, a), (logits, alpha))


def test_a_learnable_alpha_starts_at_its_start_and_learns() -> None:
    normalizer = Entmax("learnable", 1.7)
    assert float(torch.as_tensor(normalizer.alpha).detach()) == pytest.approx(1.7)
    logits = torch.randn(2, 3, 5)
    normalizer(logits, None)[..., 0].sum().backward()
    assert normalizer.raw_alpha is not None and normalizer.raw_alpha.grad is not None
    assert float(normalizer.raw_alpha.grad.abs()) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("name", sorted(NORMALIZERS))
def test_the_masking_contract_in_every_dtype(name: str, dtype: torch.dtype) -> None:
    torch.manual_seed(5)
    logits = (torch.randn(3, 4, 6) * 4).to(dtype)
    lens = torch.tensor([6, 3, 0])
    weights = NORMALIZERS[name](logits, valid_key_mask(lens, 4, 6))
    assert weights.dtype == dtype
    assert not torch.isnan(weights).any()
    assert (weights[1, :, 3:] == 0).all() and (weights[2] == 0).all()
    tolerance = 1e-5 if dtype in (torch.float32, torch.float64) else 1e-2
    sums = weights[:2].float().sum(-1)
    torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=tolerance)


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
def test_a_causal_mask_is_honoured(name: str) -> None:
    """valid_lens (B, Tq) = 1..T, the Transformer decoder's self-attention."""
    logits = torch.randn(2, 5, 5, dtype=torch.float64)
    causal = torch.arange(1, 6).expand(2, 5)
    weights = NORMALIZERS[name](logits, valid_key_mask(causal, 5, 5))
    assert (weights.triu(diagonal=1) == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 5, dtype=torch.float64))


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
def test_padded_keys_change_nothing_whatever_their_logits(name: str) -> None:
    torch.manual_seed(6)
    logits = torch.randn(2, 3, 4, dtype=torch.float64)
    alone = NORMALIZERS[name](logits, None)
    junk = torch.tensor([1e6, -1e6, float("nan")], dtype=torch.float64).expand(2, 3, 3)
    padded = NORMALIZERS[name](torch.cat([logits, junk], dim=-1), masked([4, 4], 3, 7))
    assert not torch.isnan(padded).any()
    torch.testing.assert_close(padded[..., :4], alone)
    assert (padded[..., 4:] == 0).all()


def test_softmax_is_masked_softmax() -> None:
    logits, lens = torch.randn(3, 2, 5), torch.tensor([5, 2, 0])
    torch.testing.assert_close(
        softmax(logits, valid_key_mask(lens, 2, 5)), masked_softmax(logits, lens)
    )


def test_sparse_normalizers_give_exact_zeros_where_softmax_gives_small_weights() -> None:
    logits = torch.tensor([[[3.0, 1.0, -2.0, 0.5]]])
    assert (softmax(logits, None) > 0).all()
    assert sparsemax(logits, None)[0, 0].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert (entmax15(logits, None)[0, 0, 2:] == 0).all()


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (("softmx",), "attention.normalizer='softmx' is not a normalizer"),
        (("sparsemax", 1.5), "attention.alpha and attention.initial_alpha set α-entmax's α"),
        (("entmax", 1.0), "attention.alpha must be a number above 1"),
        (("entmax", "fast"), "attention.alpha must be a number above 1"),
        (("entmax", "learnable", 0.9), "attention.initial_alpha must be a number above 1"),
        ((42,), "attention.normalizer must be one of"),
    ],
)
def test_bad_normalizer_settings_name_the_key_and_the_fix(arguments, expected: str) -> None:
    with pytest.raises(ConfigError, match=re_escape(expected)):
        build_normalizer(*arguments)


def test_a_users_normalizer_is_held_to_the_masking_contract() -> None:
    def leaky(logits: Tensor, is_valid: Tensor | None) -> Tensor:
        return torch.softmax(logits, dim=-1)  # ignores the mask: reads padding

    normalizer = build_normalizer(leaky)
    logits = torch.randn(2, 3, 4, dtype=torch.bfloat16)
    weights = normalizer(logits, masked([4, 2], 3, 4))
    assert weights.dtype == torch.bfloat16
    assert (weights[1, :, 2:] == 0).all()


def re_escape(text: str) -> str:
    return re.escape(text)


def test_entmax_has_no_nan_at_extreme_logits() -> None:
    logits = torch.tensor([[[1e4, -1e4, 0.0, 3e4]]])
    for name, normalizer in NORMALIZERS.items():
        weights = normalizer(logits, None)
        assert not torch.isnan(weights).any(), name
        assert math.isclose(float(weights.sum()), 1.0, rel_tol=1e-5), name


def one_argument(logits: Tensor) -> Tensor:
    return torch.softmax(logits, -1)


def wrong_shape(logits: Tensor, is_valid: Tensor | None) -> Tensor:
    return torch.softmax(logits, -1)[..., :1]


def zero_over_zero(logits: Tensor, is_valid: Tensor | None) -> Tensor:
    weights = logits.exp() * is_valid
    return weights / weights.sum(-1, keepdim=True)  # NaN for a row without a valid key


class Scaled(torch.nn.Module):
    """A user's module normalizer with a parameter of its own."""

    def __init__(self, start: float = 1.0) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(start))

    def forward(self, logits: Tensor, is_valid: Tensor | None) -> Tensor:
        return softmax(logits * self.scale, is_valid)


@pytest.mark.parametrize(
    ("normalizer", "expected"),
    [
        (one_argument, "calling your normalizer one_argument failed (TypeError"),
        (wrong_shape, "your normalizer wrong_shape returned (1, 3, 1) for logits of shape"),
        (zero_over_zero, "your normalizer zero_over_zero returned NaN or infinite weights"),
        (functools.partial(Scaled, 2.0), "calling your normalizer Scaled failed"),
    ],
    ids=["one argument", "wrong shape", "NaN", "a module class named with _partial_"],
)
def test_a_users_normalizer_is_tried_before_training(normalizer, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        build_normalizer(normalizer)
    assert expected in str(error.value)
    assert "normalizer(logits (B, Tq, Tk), is_valid (B, Tq, Tk) bool or None)" in str(error.value)


def test_a_users_module_is_copied_into_every_attention() -> None:
    shared = Scaled()
    first, second = build_normalizer(shared), build_normalizer(shared)
    assert first.function.scale is not second.function.scale
    assert first.function.scale is not shared.scale


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (("entmax", None, 1.3), "attention.initial_alpha=1.3 is where a learned α starts"),
        (("entmax", 1.3, 1.7), "but attention.alpha=1.3 is fixed"),
        (("entmax", "learnable", 0), "attention.initial_alpha must be a number above 1"),
    ],
)
def test_initial_alpha_is_for_a_learned_alpha_only(arguments, expected: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)):
        build_normalizer(*arguments)


def test_a_learned_alpha_may_start_anywhere_above_one() -> None:
    for start in (1.001, 1.5, 40.0, 1000.0):
        alpha = Entmax("learnable", start).alpha
        assert float(torch.as_tensor(alpha).detach()) == pytest.approx(start, rel=1e-6)
