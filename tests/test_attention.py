"""The masking contract and every scoring function, checked against formulas and torch SDPA."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from seq2seq.attention import (
    AdditiveAttention,
    Attention,
    DotProductAttention,
    MultiplicativeAttention,
    masked_softmax,
    sdpa_context,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 1e-3}


def make_attentions(query_size: int, key_size: int) -> dict[str, Attention]:
    torch.manual_seed(0)
    attentions: dict[str, Attention] = {
        "additive": AdditiveAttention(query_size, key_size, num_hiddens=8),
        "general": MultiplicativeAttention(query_size, key_size),
    }
    if query_size == key_size:
        attentions["scaled_dot"] = DotProductAttention(scaled=True)
        attentions["dot"] = DotProductAttention(scaled=False)
    return attentions


# ---- masked_softmax ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_softmax_1d_valid_lens(dtype: torch.dtype) -> None:
    scores = (torch.randn(3, 4, 6) * 5).to(dtype)
    valid_lens = torch.tensor([6, 2, 0])
    weights = masked_softmax(scores, valid_lens)
    assert weights.dtype == dtype
    assert torch.isfinite(weights).all()
    for b, n in enumerate(valid_lens.tolist()):
        assert (weights[b, :, n:] == 0.0).all()  # exactly zero, not merely small
        if n > 0:
            sums = weights[b].float().sum(-1)
            torch.testing.assert_close(sums, torch.ones(4), atol=TOLERANCE[dtype] * 4, rtol=0)
            expected = torch.softmax(scores[b, :, :n].float(), dim=-1)
            torch.testing.assert_close(
                weights[b, :, :n].float(), expected, atol=TOLERANCE[dtype] * 4, rtol=0
            )
    assert (weights[2] == 0.0).all()  # valid_len 0: all zeros, neither NaN nor uniform


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_softmax_2d_valid_lens(dtype: torch.dtype) -> None:
    scores = torch.randn(2, 3, 5).to(dtype)
    valid_lens = torch.tensor([[1, 3, 5], [0, 2, 4]])  # one length per query
    weights = masked_softmax(scores, valid_lens)
    for b in range(2):
        for q in range(3):
            n = int(valid_lens[b, q])
            assert (weights[b, q, n:] == 0.0).all()
            if n:
                assert abs(float(weights[b, q].float().sum()) - 1.0) <= TOLERANCE[dtype] * 4
            else:
                assert (weights[b, q] == 0.0).all()


def test_masked_softmax_none_is_plain_softmax() -> None:
    scores = torch.randn(2, 3, 4)
    torch.testing.assert_close(masked_softmax(scores, None), torch.softmax(scores, -1))


def test_masked_softmax_large_scores_in_half_precision() -> None:
    # Scores near the fp16 maximum overflow a naive fp16 softmax; the fp32 computation does not.
    scores = torch.full((1, 1, 3), 60000.0, dtype=torch.float16)
    weights = masked_softmax(scores, torch.tensor([2]))
    assert weights.tolist() == [[[0.5, 0.5, 0.0]]]


def test_masked_softmax_gradient_is_finite_for_empty_rows() -> None:
    scores = torch.randn(2, 2, 3, requires_grad=True)
    masked_softmax(scores, torch.tensor([0, 2])).sum().backward()
    assert scores.grad is not None and torch.isfinite(scores.grad).all()


# ---- every scoring function -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["additive", "general", "scaled_dot", "dot"])
def test_padding_invariance(name: str) -> None:
    attention = make_attentions(6, 6)[name].eval()
    queries, keys, values = torch.randn(2, 3, 6), torch.randn(2, 5, 6), torch.randn(2, 5, 4)
    valid_lens = torch.tensor([3, 5])
    context, weights = attention(queries, keys, values, valid_lens)

    # Junk in the padded keys and values of sentence 0 changes nothing.
    junk_keys, junk_values = keys.clone(), values.clone()
    junk_keys[0, 3:] = 1e4 * torch.randn(2, 6)
    junk_values[0, 3:] = 1e4 * torch.randn(2, 4)
    junk_context, junk_weights = attention(queries, junk_keys, junk_values, valid_lens)
    torch.testing.assert_close(junk_context, context)
    torch.testing.assert_close(junk_weights, weights)

    # Appending padding positions changes nothing either.
    padded_keys = torch.cat([keys, torch.randn(2, 4, 6)], dim=1)
    padded_values = torch.cat([values, torch.randn(2, 4, 4)], dim=1)
    long_context, long_weights = attention(queries, padded_keys, padded_values, valid_lens)
    torch.testing.assert_close(long_context, context)
    torch.testing.assert_close(long_weights[..., :5], weights)
    assert (long_weights[..., 5:] == 0.0).all()


@pytest.mark.parametrize("name", ["additive", "general", "scaled_dot", "dot"])
def test_projected_keys_passed_back_give_the_same_result(name: str) -> None:
    attention = make_attentions(6, 6)[name]
    queries, keys, values = torch.randn(2, 3, 6), torch.randn(2, 5, 6), torch.randn(2, 5, 4)
    valid_lens = torch.tensor([2, 5])
    expected = attention(queries, keys, values, valid_lens)
    projected = attention.project_keys(keys)
    actual = attention(queries, keys, values, valid_lens, projected_keys=projected)
    torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize(
    "valid_lens", [None, torch.tensor([4, 1, 0]), torch.tensor([[4, 2], [1, 3], [0, 4]])]
)
def test_dot_product_matches_torch_sdpa(scaled: bool, valid_lens: torch.Tensor | None) -> None:
    queries, keys, values = torch.randn(3, 2, 8), torch.randn(3, 4, 8), torch.randn(3, 4, 5)
    context, weights = DotProductAttention(scaled=scaled)(queries, keys, values, valid_lens)
    attn_mask = None
    if valid_lens is not None:
        lens = valid_lens if valid_lens.dim() == 2 else valid_lens[:, None].expand(-1, 2)
        attn_mask = torch.arange(4)[None, None, :] < lens[:, :, None]  # True = may attend
    reference = F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=attn_mask, scale=None if scaled else 1.0
    )
    # SDPA gives NaN where a query has no valid key; the contract there is zeros.
    if valid_lens is not None:
        empty_rows = ~attn_mask.any(-1)  # type: ignore[union-attr]
        assert empty_rows.any()
        reference = reference.masked_fill(empty_rows[..., None], 0.0)
    torch.testing.assert_close(context, reference)
    torch.testing.assert_close(sdpa_context(queries, keys, values, valid_lens, scaled), reference)
    scale = 1 / math.sqrt(8) if scaled else 1.0
    torch.testing.assert_close(
        weights, masked_softmax(queries @ keys.transpose(1, 2) * scale, valid_lens)
    )


def test_dot_product_context_fast_path_matches_forward() -> None:
    attention = DotProductAttention().eval()
    queries, keys, values = torch.randn(2, 3, 8), torch.randn(2, 4, 8), torch.randn(2, 4, 5)
    valid_lens = torch.tensor([4, 2])
    torch.testing.assert_close(
        attention.context(queries, keys, values, valid_lens),
        attention(queries, keys, values, valid_lens)[0],
    )


def test_dot_product_rejects_mismatched_sizes_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"query size 8 and key size 6.*attention=general"):
        DotProductAttention()(torch.randn(1, 1, 8), torch.randn(1, 2, 6), torch.randn(1, 2, 3))


def test_dot_product_has_no_parameters() -> None:
    assert list(DotProductAttention(query_size=4, key_size=4).parameters()) == []


def test_additive_matches_the_formula() -> None:
    attention = AdditiveAttention(query_size=5, key_size=7, num_hiddens=6)
    queries, keys, values = torch.randn(2, 3, 5), torch.randn(2, 4, 7), torch.randn(2, 4, 3)
    valid_lens = torch.tensor([4, 2])
    context, weights = attention(queries, keys, values, valid_lens)

    W_q, W_k, w_v = attention.W_q.weight, attention.W_k.weight, attention.w_v.weight[0]
    for b in range(2):
        n = int(valid_lens[b])
        for i in range(3):
            # score(q, k_j) = w_vᵀ tanh(W_q q + W_k k_j), softmax over the n real keys.
            scores = torch.stack(
                [w_v @ torch.tanh(W_q @ queries[b, i] + W_k @ keys[b, j]) for j in range(n)]
            )
            expected_weights = torch.softmax(scores, dim=0)
            torch.testing.assert_close(weights[b, i, :n], expected_weights)
            torch.testing.assert_close(context[b, i], expected_weights @ values[b, :n])
    assert not any(
        module.bias is not None for module in (attention.W_q, attention.W_k, attention.w_v)
    )


def test_general_matches_the_formula() -> None:
    attention = MultiplicativeAttention(query_size=5, key_size=7)
    queries, keys, values = torch.randn(2, 3, 5), torch.randn(2, 4, 7), torch.randn(2, 4, 3)
    context, weights = attention(queries, keys, values, None)
    W = attention.W.weight  # (Dq, Dk)
    scores = torch.einsum("bqd,de,bke->bqk", queries, W, keys)  # qᵀ W k
    torch.testing.assert_close(weights, torch.softmax(scores, -1))
    torch.testing.assert_close(context, torch.softmax(scores, -1) @ values)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["additive", "general", "scaled_dot"])
def test_half_precision_close_to_float32(name: str, dtype: torch.dtype) -> None:
    attention = make_attentions(6, 6)[name]
    queries, keys, values = torch.randn(2, 3, 6), torch.randn(2, 5, 6), torch.randn(2, 5, 4)
    valid_lens = torch.tensor([0, 4])
    context, weights = attention(queries, keys, values, valid_lens)
    half = attention.to(dtype)
    half_context, half_weights = half(
        queries.to(dtype), keys.to(dtype), values.to(dtype), valid_lens
    )
    assert half_weights.dtype == dtype
    assert (half_weights[0] == 0).all() and (half_weights[1, :, 4:] == 0).all()
    torch.testing.assert_close(half_weights.float(), weights, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(half_context.float(), context, atol=5e-2, rtol=5e-2)
