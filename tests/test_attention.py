"""The masking contract and every scoring function, checked against formulas and torch SDPA;
the remedy knobs (temperature, bias and LayerNorm in the tanh) and the invariances behind them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from seq2seq.analysis.diagnostics import tanh_saturation, valid_pairs
from seq2seq.attention import (
    AdditiveAttention,
    Attention,
    DotProductAttention,
    GeneralAttention,
    masked_softmax,
    sdpa_context,
)
from seq2seq.errors import ConfigError
from seq2seq.inference.bundle import export_bundle, load
from seq2seq.pipeline import train
from tests.scoring import SCORING_FUNCTIONS, needs_equal_sizes, scoring_factory

CONF = Path(__file__).resolve().parents[1] / "conf"

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 1e-3}


def make_attentions(query_size: int, key_size: int) -> dict[str, Attention]:
    """Every scoring function of conf/attention/ that takes these sizes."""
    torch.manual_seed(0)
    return {
        name: scoring_factory(name, {"num_hiddens": 8})(query_size=query_size, key_size=key_size)
        for name in SCORING_FUNCTIONS
        if query_size == key_size or not needs_equal_sizes(name)
    }


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


@pytest.mark.parametrize("name", SCORING_FUNCTIONS)
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


@pytest.mark.parametrize("name", SCORING_FUNCTIONS)
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
    attention = GeneralAttention(query_size=5, key_size=7)
    queries, keys, values = torch.randn(2, 3, 5), torch.randn(2, 4, 7), torch.randn(2, 4, 3)
    context, weights = attention(queries, keys, values, None)
    W = attention.W.weight  # (Dq, Dk)
    scores = torch.einsum("bqd,de,bke->bqk", queries, W, keys)  # qᵀ W k
    torch.testing.assert_close(weights, torch.softmax(scores, -1))
    torch.testing.assert_close(context, torch.softmax(scores, -1) @ values)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", SCORING_FUNCTIONS)
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


# ---- the softmax temperature -----------------------------------------------------------------


def make_tempered(name: str, temperature: float | str, size: int = 6) -> Attention:
    torch.manual_seed(0)
    factory = scoring_factory(name, {"num_hiddens": 8, "temperature": temperature})
    return factory(query_size=size, key_size=size)


@pytest.mark.parametrize("temperature", [0.25, 3, "learnable"])
@pytest.mark.parametrize("name", SCORING_FUNCTIONS)
def test_temperature_divides_the_scores(name: str, temperature: float | str) -> None:
    attention = make_tempered(name, temperature)
    expected_t = float(temperature) if temperature != "learnable" else 0.37
    if temperature == "learnable":
        assert attention.log_temperature is not None
        with torch.no_grad():
            attention.log_temperature.fill_(math.log(expected_t))
    queries, keys, values = torch.randn(2, 3, 6), torch.randn(2, 5, 6), torch.randn(2, 5, 4)
    valid_lens = torch.tensor([3, 5])
    context, weights = attention(queries, keys, values, valid_lens)
    scores = attention.score(queries, attention.project_keys(keys))  # checked by the tests above
    expected = masked_softmax(scores / expected_t, valid_lens)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(context, expected @ values)


def test_dot_product_temperature_matches_the_formula() -> None:
    # q·k / (√d T), written out, not through the module's score.
    queries, keys = torch.randn(2, 3, 16), torch.randn(2, 4, 16)
    weights = DotProductAttention(scaled=True, temperature=0.5)(queries, keys, keys)[1]
    expected = torch.softmax(torch.einsum("bqd,bkd->bqk", queries, keys) / (4.0 * 0.5), dim=-1)
    torch.testing.assert_close(weights, expected)


@pytest.mark.parametrize("name", SCORING_FUNCTIONS)
def test_default_temperature_changes_neither_weights_nor_parameters(name: str) -> None:
    attention = make_tempered(name, 1.0)
    assert attention.log_temperature is None
    assert not any("temperature" in key for key in attention.state_dict())
    queries, keys = torch.randn(2, 3, 6), torch.randn(2, 5, 6)
    weights = attention(queries, keys, keys)[1]
    # Exactly today's computation: the softmax of the score, no division on the way.
    assert torch.equal(
        weights, masked_softmax(attention.score(queries, attention.project_keys(keys)), None)
    )


@pytest.mark.parametrize("name", SCORING_FUNCTIONS)
def test_learnable_temperature_starts_at_one_and_learns(name: str) -> None:
    attention = make_tempered(name, "learnable")
    assert attention.log_temperature is not None
    with torch.no_grad():
        assert float(attention.temperature) == 1.0
    plain = make_tempered(name, 1.0)
    # One parameter more than the fixed-temperature module, and it receives a gradient.
    assert sum(p.numel() for p in attention.parameters()) == (
        sum(p.numel() for p in plain.parameters()) + 1
    )
    queries, keys = torch.randn(2, 3, 6), torch.randn(2, 5, 6)
    attention(queries, keys, keys)[1][..., 0].sum().backward()
    assert attention.log_temperature.grad is not None
    assert float(attention.log_temperature.grad.abs()) > 0


@pytest.mark.parametrize("bad", [-1, 0, 0.0, float("nan"), float("inf"), "foo", True, None])
def test_bad_temperature_names_the_key_and_the_fix(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"attention\.temperature.*positive number.*learnable"):
        DotProductAttention(temperature=bad)  # type: ignore[arg-type]  # bad on purpose
    with pytest.raises(ConfigError, match=r"attention\.temperature"):
        AdditiveAttention(4, 4, num_hiddens=4, temperature=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.3, "learnable"])
@pytest.mark.parametrize(
    "valid_lens", [None, torch.tensor([4, 1, 0]), torch.tensor([[4, 2], [1, 3], [0, 4]])]
)
def test_sdpa_context_equals_the_weights_path_with_temperature(
    scaled: bool, temperature: float | str, valid_lens: torch.Tensor | None
) -> None:
    """``context`` (no weights) through ``F.scaled_dot_product_attention`` is ``forward``'s."""
    attention = DotProductAttention(scaled=scaled, temperature=temperature)
    if attention.log_temperature is not None:
        with torch.no_grad():
            attention.log_temperature.fill_(math.log(2.5))
    queries = torch.randn(3, 2, 8, requires_grad=True)
    keys, values = torch.randn(3, 4, 8), torch.randn(3, 4, 5)
    reference = attention(queries, keys, values, valid_lens)[0]
    fused = attention.context(queries, keys, values, valid_lens)
    torch.testing.assert_close(fused, reference)
    # The gradients agree too, into the queries and into a learnable temperature.
    reference_grads = torch.autograd.grad(
        reference.square().sum(), [queries, *attention.parameters()]
    )
    fused_grads = torch.autograd.grad(fused.square().sum(), [queries, *attention.parameters()])
    for fused_grad, reference_grad in zip(fused_grads, reference_grads, strict=True):
        torch.testing.assert_close(fused_grad, reference_grad)


# ---- claim 3: a scalar bias on a dot-product score does nothing, one inside the tanh does -------


@pytest.mark.parametrize("bias", [-30.0, 0.5, 30.0])
@pytest.mark.parametrize("scaled", [True, False])
def test_scalar_bias_on_dot_product_scores_changes_no_weight(scaled: bool, bias: float) -> None:
    attention = DotProductAttention(scaled=scaled)
    queries, keys = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    valid_lens = torch.tensor([2, 5])
    weights = attention(queries, keys, keys, valid_lens)[1]
    shifted = masked_softmax(attention.logits(queries, keys) + bias, valid_lens)
    # Equal up to float32 rounding of score + bias (an ulp of 30 is 2e-6).
    torch.testing.assert_close(shifted, weights, atol=2e-5, rtol=0)


def test_bias_inside_the_tanh_changes_the_weights_and_follows_the_formula() -> None:
    torch.manual_seed(0)
    attention = AdditiveAttention(5, 7, num_hiddens=6, bias=True)
    assert attention.W_q.bias is not None
    queries, keys = torch.randn(2, 3, 5), torch.randn(2, 4, 7)
    with torch.no_grad():
        attention.W_q.bias.zero_()
    unbiased = attention(queries, keys, keys)[1]
    with torch.no_grad():
        attention.W_q.bias.copy_(torch.randn(6) * 2)
    biased = attention(queries, keys, keys)[1]
    # w_vᵀ tanh(W_q q + W_k k + b): the bias acts before the nonlinearity, so it moves weights.
    W_q, W_k, w_v, b = (
        attention.W_q.weight,
        attention.W_k.weight,
        attention.w_v.weight[0],
        attention.W_q.bias,
    )
    scores = torch.einsum(
        "a,bqka->bqk",
        w_v,
        torch.tanh((queries @ W_q.T)[:, :, None, :] + (keys @ W_k.T)[:, None, :, :] + b),
    )
    torch.testing.assert_close(biased, torch.softmax(scores, -1))
    assert float((biased - unbiased).abs().max()) > 0.05


def test_default_additive_has_no_bias_and_no_layer_norm() -> None:
    attention = AdditiveAttention(5, 7, num_hiddens=6)
    assert set(attention.state_dict()) == {"W_q.weight", "W_k.weight", "w_v.weight"}


# ---- claim 4: only the ratio of the score's scale to the temperature is identifiable -----------


@pytest.mark.parametrize("alpha", [0.1, 3.0, 20.0])
@pytest.mark.parametrize("name", ["additive", "general"])
def test_scale_and_temperature_are_identifiable_only_as_a_ratio(name: str, alpha: float) -> None:
    attention = make_tempered(name, "learnable")
    queries, keys = torch.randn(2, 3, 6), torch.randn(2, 5, 6)
    valid_lens = torch.tensor([4, 5])
    weights = attention(queries, keys, keys, valid_lens)[1]
    # (v, T) -> (αv, αT) for additive, (W, T) -> (αW, αT) for bilinear.
    scale = attention.w_v.weight if isinstance(attention, AdditiveAttention) else attention.W.weight
    assert attention.log_temperature is not None
    with torch.no_grad():
        scale.mul_(alpha)
        attention.log_temperature.add_(math.log(alpha))
    torch.testing.assert_close(attention(queries, keys, keys, valid_lens)[1], weights)
    # ... while scaling only one of them changes the weights.
    with torch.no_grad():
        attention.log_temperature.zero_()
    assert float((attention(queries, keys, keys, valid_lens)[1] - weights).abs().max()) > 1e-3


# ---- claim 1: dot-product score variance grows with d, scaled scores keep variance 1 -----------


@pytest.mark.parametrize("d", [8, 32, 128, 512])
def test_scaled_dot_product_scores_have_unit_variance(d: int) -> None:
    generator = torch.Generator().manual_seed(d)
    queries = torch.randn(64, 16, d, generator=generator)  # unit-variance entries
    keys = torch.randn(64, 16, d, generator=generator)
    # q·k is a sum of d independent products of variance 1: variance d, or 1 after dividing by √d.
    # 16,384 scores estimate a variance to within about 2% (one standard error).
    unscaled = DotProductAttention(scaled=False).logits(queries, keys)
    scaled = DotProductAttention(scaled=True).logits(queries, keys)
    assert float(unscaled.var()) / d == pytest.approx(1.0, rel=0.1)
    assert float(scaled.var()) == pytest.approx(1.0, rel=0.1)


# ---- claim 2: additive scores are bounded; LayerNorm keeps tanh out of saturation --------------


def test_additive_scores_are_bounded_by_the_l1_norm_of_w_v() -> None:
    torch.manual_seed(0)
    attention = AdditiveAttention(8, 8, num_hiddens=16)
    bound = float(attention.w_v.weight.abs().sum())
    queries, keys = 1e4 * torch.randn(4, 3, 8), 1e4 * torch.randn(4, 6, 8)
    scores = attention.score(queries, attention.project_keys(keys))
    assert float(scores.abs().max()) <= bound
    # With such inputs every tanh is at ±1, so scores sit at ±w_v's entries summed: near the bound.
    assert float(scores.abs().max()) > 0.5 * bound


def test_layer_norm_is_applied_to_the_preactivations() -> None:
    torch.manual_seed(0)
    attention = AdditiveAttention(5, 7, num_hiddens=6, layer_norm=True, bias=True)
    assert attention.layer_norm is not None
    with torch.no_grad():  # a gain and shift that are not the identity, so both are checked
        attention.layer_norm.weight.uniform_(0.5, 2.0)
        attention.layer_norm.bias.normal_()
    queries, keys = torch.randn(2, 3, 5), torch.randn(2, 4, 7)
    summed = attention.W_q(queries)[:, :, None, :] + attention.W_k(keys)[:, None, :, :]
    mean = summed.mean(-1, keepdim=True)
    variance = summed.var(-1, keepdim=True, correction=0)
    normed = (summed - mean) / torch.sqrt(variance + 1e-5)
    normed = normed * attention.layer_norm.weight + attention.layer_norm.bias
    expected = torch.tanh(normed) @ attention.w_v.weight[0]  # (B, Tq, Tk)
    torch.testing.assert_close(attention.score(queries, attention.project_keys(keys)), expected)


@pytest.mark.parametrize("input_norm", [30.0, 300.0])
def test_layer_norm_reduces_tanh_saturation_at_large_input_norm(input_norm: float) -> None:
    torch.manual_seed(0)
    size = 32
    plain = AdditiveAttention(size, size, num_hiddens=size)
    normed = AdditiveAttention(size, size, num_hiddens=size, layer_norm=True)
    normed.load_state_dict(plain.state_dict(), strict=False)  # the same W_q, W_k, w_v
    directions_q, directions_k = torch.randn(8, 4, size), torch.randn(8, 10, size)
    queries = input_norm * F.normalize(directions_q, dim=-1)
    keys = input_norm * F.normalize(directions_k, dim=-1)
    valid_lens = torch.tensor([10, 7, 3, 10, 1, 10, 5, 8])
    is_valid = valid_pairs(valid_lens, None, torch.Size([8, 4, 10]))
    saturation = {
        name: tanh_saturation(
            attention.preactivations(queries, attention.project_keys(keys)), is_valid
        )
        for name, attention in [("plain", plain), ("normed", normed)]
    }
    # Without LayerNorm the pre-activations grow with the input norm (std ≈ norm·√(2/(3·size)) at
    # PyTorch's initialisation); with it they have unit variance per pair, so a Gaussian's ≈ 5%
    # lies beyond ±2 whatever the norm.
    assert saturation["plain"] > 0.5
    assert saturation["normed"] < 0.1


# ---- the knobs travel through checkpoints and bundles ------------------------------------------


@pytest.mark.parametrize(
    "knobs",
    [
        [
            "attention=additive",
            "attention.temperature=learnable",
            "attention.bias=true",
            "attention.layer_norm=true",
        ],
        ["attention=scaled_dot", "attention.temperature=learnable"],
    ],
    ids=["additive", "scaled_dot"],
)
def test_knobs_round_trip_through_checkpoint_and_bundle(tmp_path: Path, knobs: list[str]) -> None:
    overrides = [
        f"run_dir={tmp_path / 'run'}",
        "data.train_size=200",
        "data.val_size=10",
        "data.test_size=10",
        "data.batch_size=32",
        "model.hidden_size=16",
        "model.embedding_size=8",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
        *knobs,
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        result = train(compose("config", overrides=overrides))
    from_checkpoint = load(result["last_checkpoint"])
    from_bundle = load(export_bundle(from_checkpoint, tmp_path / "bundle"))
    attention = from_bundle.model.decoder.attention
    if "attention.temperature=learnable" in knobs:
        # Trained, so it moved off its initial value: a rebuilt-but-not-loaded model would not.
        assert attention.log_temperature is not None
        assert float(attention.log_temperature.detach()) != 0.0
    if "attention.layer_norm=true" in knobs:
        assert isinstance(attention, AdditiveAttention) and attention.layer_norm is not None
        assert attention.W_q.bias is not None
        assert not torch.equal(
            attention.layer_norm.weight, torch.ones_like(attention.layer_norm.weight)
        )
    expected = from_checkpoint.model.state_dict()
    actual = from_bundle.model.state_dict()
    assert actual.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name
    src, src_lens = torch.tensor([[5, 6, 7, 8]]), torch.tensor([4])
    tgt_in = torch.tensor([[2, 5, 6]])
    torch.testing.assert_close(
        from_bundle.model(src, src_lens, tgt_in)[0], from_checkpoint.model(src, src_lens, tgt_in)[0]
    )


@pytest.mark.parametrize("name", SCORING_FUNCTIONS)
def test_a_learnable_temperature_starts_at_initial_temperature(name: str) -> None:
    settings = {"num_hiddens": 8, "temperature": "learnable", "initial_temperature": 0.25}
    attention = scoring_factory(name, settings)(query_size=6, key_size=6)
    with torch.no_grad():
        assert float(attention.temperature) == pytest.approx(0.25)
    queries, keys = torch.randn(2, 3, 6), torch.randn(2, 5, 6)
    scores = attention.score(queries, attention.project_keys(keys))
    torch.testing.assert_close(attention(queries, keys, keys)[1], torch.softmax(scores / 0.25, -1))
    fixed = {**settings, "temperature": 1.0}
    with pytest.raises(ConfigError, match=r"initial_temperature=0\.25 is where a learned"):
        scoring_factory(name, fixed)(query_size=6, key_size=6)
