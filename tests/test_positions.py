"""Luong's local windows and the per-key bias against the formulas, written out here position by
position: local-m's window around p_t = min(t, S - 1); local-p's p_t = (S - 1) · sigmoid(v_pᵀ
tanh(W_p h_t)), its window around round(p_t) and the Gaussian exp(-(s - p_t)² / 2σ²), σ = D / 2;
e_ti = score / T + b_i. Every attention reads them through ``use_parts``, with every normalizer."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from seq2seq.attention import (
    AdditiveAttention,
    AttentionParts,
    DotProductAttention,
    MultiHeadAttention,
)
from seq2seq.errors import ConfigError
from seq2seq.normalizers import entmax15, softmax, sparsemax
from seq2seq.positions import KeyBias, LocalWindow

NORMALIZE = {"softmax": softmax, "sparsemax": sparsemax, "entmax15": entmax15}


def local_weights_by_hand(
    logits: Tensor, src_lens: list[int], centres: Tensor, size: int, gaussian: bool, normalizer: str
) -> Tensor:
    """Luong et al. (2015) eq. 7-10, one (sentence, step) at a time: the normalizer over the real
    keys with |s - round(p_t)| <= D, zero elsewhere, times the Gaussian for local-p."""
    batch, steps, keys = logits.shape
    expected = torch.zeros(batch, steps, keys, dtype=logits.dtype)
    for b in range(batch):
        for t in range(steps):
            p = float(centres[b, t])
            window = [s for s in range(src_lens[b]) if abs(s - round(p)) <= size]
            row = NORMALIZE[normalizer](logits[b, t, window][None, None], None)[0, 0]
            for weight, s in zip(row.tolist(), window, strict=True):
                sigma = size / 2
                expected[b, t, s] = weight * (
                    math.exp(-((s - p) ** 2) / (2 * sigma**2)) if gaussian else 1
                )
    return expected


@pytest.mark.parametrize("normalizer", sorted(NORMALIZE))
def test_local_m_follows_the_formula(normalizer: str) -> None:
    torch.manual_seed(0)
    attention = DotProductAttention(scaled=False).double()
    attention.use_parts(AttentionParts(normalizer, window="local_m", window_size=1), 8)
    queries, keys = (
        torch.randn(3, 6, 8, dtype=torch.float64),
        torch.randn(3, 5, 8, dtype=torch.float64),
    )
    src_lens = [5, 3, 1]
    positions = torch.arange(6).expand(3, 6)  # target steps 0..5, beyond every source's end
    _, weights = attention(queries, keys, keys, torch.tensor(src_lens), positions=positions)
    centres = torch.minimum(positions, torch.tensor(src_lens)[:, None] - 1)  # clipped to S - 1
    logits = attention.logits(queries, keys)
    expected = local_weights_by_hand(logits, src_lens, centres, 1, False, normalizer)
    torch.testing.assert_close(weights, expected)


@pytest.mark.parametrize("normalizer", sorted(NORMALIZE))
def test_local_p_follows_the_formula(normalizer: str) -> None:
    torch.manual_seed(1)
    parts = AttentionParts(normalizer, window="local_p", window_size=2)
    attention = AdditiveAttention(8, 8, 8).use_parts(parts, 8).double()
    window = attention.normalization.window  # type: ignore[union-attr]
    assert window is not None and window.W_p is not None and window.v_p is not None
    queries, keys = (
        torch.randn(3, 4, 8, dtype=torch.float64),
        torch.randn(3, 7, 8, dtype=torch.float64),
    )
    src_lens = [7, 4, 2]
    _, weights = attention(queries, keys, keys, torch.tensor(src_lens))
    predicted = window.v_p(torch.tanh(window.W_p(queries))).squeeze(-1)  # (B, Tq)
    centres = (torch.tensor(src_lens, dtype=torch.float64)[:, None] - 1) * torch.sigmoid(predicted)
    logits = attention.logits(queries, attention.project_keys(keys))
    expected = local_weights_by_hand(
        logits.detach(), src_lens, centres.detach(), 2, True, normalizer
    )
    torch.testing.assert_close(weights.detach(), expected)


def test_local_p_learns_its_centre_through_the_gaussian() -> None:
    torch.manual_seed(2)
    attention = DotProductAttention()
    attention.use_parts(AttentionParts(window="local_p", window_size=2), 8)
    queries, keys = torch.randn(2, 3, 8), torch.randn(2, 9, 8)
    context, _ = attention(queries, keys, keys, torch.tensor([9, 6]))
    context.sum().backward()
    window = attention.normalization.window  # type: ignore[union-attr]
    assert window.W_p.weight.grad is not None and window.W_p.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", ["local_m", "local_p"])
def test_a_window_never_reads_padding_and_never_is_empty(kind: str) -> None:
    torch.manual_seed(3)
    attention = AdditiveAttention(8, 8, 8)
    attention.use_parts(AttentionParts(window=kind, window_size=1), 8)
    queries, keys = torch.randn(4, 12, 8), torch.randn(4, 6, 8)
    src_lens = torch.tensor([6, 4, 2, 1])
    positions = torch.arange(12).expand(4, 12)
    _, weights = attention(queries, keys, keys, src_lens, positions=positions)
    real = torch.arange(6)[None, :] < src_lens[:, None]  # (B, S)
    assert (weights.masked_select(~real[:, None, :]) == 0).all()
    assert (weights.sum(-1) > 0).all()  # the word nearest p_t is always in its window


def test_a_window_in_a_padded_batch_equals_each_sentence_alone() -> None:
    torch.manual_seed(4)
    attention = AdditiveAttention(8, 8, 8)
    attention.use_parts(AttentionParts("sparsemax", window="local_p", window_size=2), 8)
    queries, keys = torch.randn(3, 2, 8), torch.randn(3, 7, 8)
    src_lens = torch.tensor([7, 5, 3])
    _, batched = attention(queries, keys, keys, src_lens)
    for b, length in enumerate(src_lens.tolist()):
        _, alone = attention(
            queries[b : b + 1],
            keys[b : b + 1, :length],
            keys[b : b + 1, :length],
            src_lens[b : b + 1],
        )
        torch.testing.assert_close(batched[b : b + 1, :, :length], alone)


def test_multi_head_attention_shares_the_window_across_heads() -> None:
    torch.manual_seed(5)
    attention = MultiHeadAttention(DotProductAttention(), 2, 8, 8, 8, 8)
    attention.use_parts(AttentionParts(window="local_m", window_size=0), 8)
    queries, keys = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    positions = torch.arange(3).expand(2, 3)
    _, weights = attention(queries, keys, keys, torch.tensor([5, 2]), positions=positions)
    assert weights is not None  # (B, h, Tq, Tk)
    # D = 0: each step reads exactly its own position (clipped to the sentence's end).
    expected = torch.zeros(2, 3, 5)
    for b, length in enumerate([5, 2]):
        for t in range(3):
            expected[b, t, min(t, length - 1)] = 1.0
    for head in range(2):
        torch.testing.assert_close(weights[:, head], expected)


def test_key_bias_adds_b_i_after_the_temperature_and_zero_past_its_table() -> None:
    torch.manual_seed(6)
    attention = DotProductAttention(temperature=2.0)
    attention.use_parts(AttentionParts(key_bias=True, key_bias_positions=4), 8)
    bias = attention.normalization.key_bias  # type: ignore[union-attr]
    assert isinstance(bias, KeyBias)
    with torch.no_grad():
        bias.bias.copy_(torch.tensor([3.0, -1.0, 0.5, 2.0]))
    queries, keys = torch.randn(2, 3, 8), torch.randn(2, 6, 8)
    _, weights = attention(queries, keys, keys, torch.tensor([6, 5]))
    logits = attention.score(queries, keys) / 2.0 + torch.tensor([3.0, -1.0, 0.5, 2.0, 0.0, 0.0])
    expected = softmax(logits, torch.arange(6)[None, None, :] < torch.tensor([6, 5])[:, None, None])
    torch.testing.assert_close(weights, expected)


def test_key_bias_changes_the_weights_where_a_scalar_bias_cannot() -> None:
    torch.manual_seed(7)
    queries, keys = torch.randn(1, 2, 8), torch.randn(1, 5, 8)
    plain = DotProductAttention()
    biased = DotProductAttention().use_parts(AttentionParts(key_bias=True, key_bias_positions=5), 8)
    with torch.no_grad():
        biased.normalization.key_bias.bias.fill_(7.0)  # type: ignore[union-attr]
    torch.testing.assert_close(biased(queries, keys, keys)[1], plain(queries, keys, keys)[1])
    with torch.no_grad():
        biased.normalization.key_bias.bias.copy_(torch.arange(5.0))  # type: ignore[union-attr]
    assert not torch.allclose(biased(queries, keys, keys)[1], plain(queries, keys, keys)[1])


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        ({"window": "local"}, "attention.window='local' is not a window"),
        (
            {"window": "local_m", "window_size": -1},
            "attention.window_size=-1 must be a whole number >= 0",
        ),
        (
            {"window": "local_p", "window_size": 0},
            "must be a whole number >= 1 for attention.window=local_p",
        ),
        ({"window": "global", "window_size": 3}, "attention.window_size=3 is the half-width"),
        ({"key_bias": "yes"}, "attention.key_bias must be true or false"),
        ({"key_bias": True}, "attention.key_bias=true needs attention.key_bias_positions"),
        ({"key_bias": True, "key_bias_positions": 0}, "attention.key_bias_positions=0 must be"),
        ({"key_bias_positions": 5}, "but attention.key_bias=false has none"),
    ],
)
def test_bad_windows_and_biases_name_the_key_and_the_fix(parts: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        AdditiveAttention(8, 8, 8).use_parts(AttentionParts(**parts), 8)
    assert expected in str(error.value)


def test_local_m_without_positions_says_what_the_decoder_must_pass() -> None:
    window = LocalWindow("local_m", 2, 8)
    with pytest.raises(ValueError, match="the decoder must pass positions"):
        window(torch.randn(1, 2, 8), torch.tensor([4]), None, 4)


def test_default_parts_add_no_module_and_no_parameter() -> None:
    attention = AdditiveAttention(8, 8, 8)
    before = {name for name, _ in attention.named_parameters()}
    attention.use_parts(AttentionParts(), 8)
    assert attention.normalization is None
    assert {name for name, _ in attention.named_parameters()} == before
