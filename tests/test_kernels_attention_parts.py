"""csrc/attention.c's parts, each against the Python function it is the twin of: the scores
(``AdditiveAttention.score``, ``DotProductAttention.score``), the normalizers
(``seq2seq.normalizers.softmax``, ``sparsemax``, ``entmax15``) and the context, forward and
backward (autograd through the reference, in float64), with the masking contract: weight
exactly 0 at padding and outside a sparse support, an empty row all zeros, never NaN.

Shape legend: R rows (queries), S keys, A additive size, D product size, V value size.
"""

from __future__ import annotations

import ctypes

import pytest
import torch
from torch import Tensor

from seq2seq import normalizers
from seq2seq.attention import (
    AdditiveAttention,
    AttentionParts,
    DotProductAttention,
    GeneralAttention,
    valid_key_mask,
)
from seq2seq.kernels import library
from seq2seq.kernels.attention_parts import (
    NORMALIZER_TWINS,
    StepAttention,
    attend,
    step_attention,
)
from seq2seq.normalizers import Entmax15, Softmax, Sparsemax
from seq2seq.positions import KeyBias, LocalWindow

pytestmark = pytest.mark.skipif(
    library.library() is None, reason=f"no fused kernels here: {library.unavailable_reason()}"
)
NORMALIZERS = ["softmax", "sparsemax", "entmax15"]
ALPHA = {name: alpha for name, alpha in NORMALIZER_TWINS.values()}
ROWS, KEYS = 6, 7
# Row 0 has no valid key, row 1 all of them, row 3 more than S (clamped), the rest a few.
LENS = torch.tensor([0, KEYS, 1, KEYS + 2, 3, 5])
# The keys each row reads, [first, end): its sentence's real ones (global attention).
SPANS = torch.stack([torch.zeros_like(LENS), LENS.clamp(max=KEYS)], dim=1).contiguous()


def kernels() -> ctypes.CDLL:
    loaded = library.library()
    assert loaded is not None
    return loaded


def mask() -> Tensor:
    return valid_key_mask(LENS.clamp(max=KEYS), 1, KEYS)[:, 0]  # (R, S)


def random(*shape: int, scale: float = 1.0, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def normalize(name: str, logits: Tensor) -> Tensor:
    """What the C twin writes: the weights (R, S) of ``logits`` (R, S) over LENS."""
    weights = torch.empty(ROWS, KEYS)
    getattr(kernels(), f"seq2seq_{name}")(
        ROWS, KEYS, SPANS.data_ptr(), logits.contiguous().data_ptr(), weights.data_ptr(), KEYS
    )
    return weights


@pytest.mark.parametrize("name", NORMALIZERS)
@pytest.mark.parametrize("scale", [0.3, 3.0])  # dense and sparse rows
def test_each_normalizer_matches_its_python_twin(name: str, scale: float) -> None:
    logits = random(ROWS, KEYS, scale=scale)
    got = normalize(name, logits)
    python = getattr(normalizers, name)
    want = python(logits.double()[:, None], mask()[:, None])[:, 0].float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)
    assert torch.isfinite(got).all()
    assert (got[~mask()] == 0).all()  # exact zeros at padding
    assert (got[0] == 0).all()  # the row with no key
    assert torch.equal(got[1:] == 0, want[1:] == 0) or name == "softmax"  # the same support
    torch.testing.assert_close(got[1:].sum(-1), torch.ones(ROWS - 1))


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.5])
@pytest.mark.parametrize("scale", [0.3, 3.0])
def test_entmax_bisect_and_its_gradients_match_the_python_twin(alpha: float, scale: float) -> None:
    """``seq2seq_entmax_bisect`` against ``entmax_bisect``; ``seq2seq_entmax_backward`` at α
    and ``seq2seq_entmax_alpha_backward`` against autograd through it with a learned α."""
    logits = random(ROWS, KEYS, scale=scale)
    weights = torch.empty(ROWS, KEYS)
    kernels().seq2seq_entmax_bisect(
        ROWS, KEYS, SPANS.data_ptr(), alpha, normalizers.BISECTION_ITERATIONS,
        logits.data_ptr(), weights.data_ptr(), KEYS,
    )  # fmt: skip
    leaf, alpha_leaf = logits.double().requires_grad_(), torch.tensor(alpha).double()
    alpha_leaf.requires_grad_()
    want = normalizers.entmax_bisect(leaf[:, None], mask()[:, None], alpha_leaf)[:, 0]
    torch.testing.assert_close(weights, want.detach().float(), rtol=1e-4, atol=1e-5)
    assert (weights[~mask()] == 0).all() and (weights[0] == 0).all()
    d_weights = random(ROWS, KEYS, seed=1)
    want_logits, want_alpha = torch.autograd.grad(
        (want * d_weights.double()).sum(), [leaf, alpha_leaf]
    )
    d_logits, d_alpha = torch.empty(ROWS, KEYS), torch.zeros(ROWS)
    kernels().seq2seq_entmax_backward(
        ROWS, KEYS, alpha, SPANS.data_ptr(), weights.data_ptr(), KEYS, d_weights.data_ptr(),
        d_logits.data_ptr(),
    )  # fmt: skip
    kernels().seq2seq_entmax_alpha_backward(
        ROWS, KEYS, alpha, SPANS.data_ptr(), weights.data_ptr(), KEYS, d_weights.data_ptr(),
        d_alpha.data_ptr(),
    )  # fmt: skip
    torch.testing.assert_close(d_logits, want_logits.float(), rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(d_alpha.sum(), want_alpha.float(), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("alpha", [1.05, 1.5, 2.0, 4.0])
def test_entmax_bisects_powers_keep_it_as_close_to_float64_as_float32(alpha: float) -> None:
    """``pow_vec`` and ``log_vec`` (csrc/vector_math.h), read through ``seq2seq_entmax_bisect``
    on rows of 1 to 40 keys (whole vectors of 8 and remainders) from nearly uniform to one-hot,
    against the Python twin in float64: no further from it than the twin run in float32."""
    lengths = torch.arange(1, 41).repeat(6)  # (R,)
    rows, keys = lengths.numel(), int(lengths.max())
    scales = torch.tensor([0.01, 0.3, 1.0, 3.0, 10.0, 30.0]).repeat_interleave(40)[:, None]
    logits = (random(rows, keys) * scales).contiguous()  # (R, S)
    spans = torch.stack([torch.zeros_like(lengths), lengths], dim=1).contiguous()
    valid = valid_key_mask(lengths, 1, keys)  # (R, 1, S)
    weights = torch.empty(rows, keys)
    kernels().seq2seq_entmax_bisect(
        rows, keys, spans.data_ptr(), alpha, normalizers.BISECTION_ITERATIONS,
        logits.data_ptr(), weights.data_ptr(), keys,
    )  # fmt: skip
    want = normalizers.entmax_bisect(logits.double()[:, None], valid, alpha)[:, 0]
    float32 = normalizers.entmax_bisect(logits[:, None], valid, alpha)[:, 0]
    error, float32_error = (weights.double() - want).abs(), (float32.double() - want).abs()
    assert error.max() <= 2 * float32_error.max() + 1e-7
    assert (weights[~valid[:, 0]] == 0).all() and torch.isfinite(weights).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(rows))


@pytest.mark.parametrize("name", NORMALIZERS)
def test_entmax_backward_is_each_normalizers_gradient(name: str) -> None:
    """``seq2seq_entmax_backward`` at the normalizer's α against autograd through the Python
    normalizer in float64 (its own backward, and softmax's torch one)."""
    logits = random(ROWS, KEYS, scale=2.0)
    weights = normalize(name, logits)
    d_weights = random(ROWS, KEYS, seed=1)
    d_logits = torch.empty(ROWS, KEYS)
    kernels().seq2seq_entmax_backward(
        ROWS, KEYS, ALPHA[name], SPANS.data_ptr(), weights.data_ptr(), KEYS,
        d_weights.data_ptr(), d_logits.data_ptr(),
    )  # fmt: skip
    leaf = logits.double().requires_grad_()
    python = getattr(normalizers, name)
    (want,) = torch.autograd.grad(
        (python(leaf[:, None], mask()[:, None])[:, 0] * d_weights.double()).sum(), leaf
    )
    torch.testing.assert_close(d_logits, want.float(), rtol=1e-4, atol=1e-5)
    assert (d_logits[~mask()] == 0).all() and torch.isfinite(d_logits).all()


def test_key_bias_and_its_backward_against_the_module() -> None:
    """``seq2seq_key_bias`` adds ``KeyBias``'s b_s at positions below its size (here 4 of 7)
    and nothing past it; its backward sums the rows' logit gradients per position."""
    module = KeyBias(4)
    torch.nn.init.normal_(module.bias)
    logits = random(ROWS, KEYS)
    got = logits.clone()
    bias = module.bias.detach()
    kernels().seq2seq_key_bias(ROWS, KEYS, 4, bias.data_ptr(), SPANS.data_ptr(), got.data_ptr())
    valid = mask()
    torch.testing.assert_close(got[valid], module(logits).detach()[valid])
    d_logits = random(ROWS, KEYS, seed=1) * valid
    d_bias = torch.zeros(4)
    kernels().seq2seq_key_bias_backward(
        ROWS, KEYS, 4, SPANS.data_ptr(), d_logits.data_ptr(), d_bias.data_ptr()
    )
    (want,) = torch.autograd.grad((module(logits) * d_logits).sum(), module.bias)
    torch.testing.assert_close(d_bias, want)


@pytest.mark.parametrize("size", [0, 1, 2])
def test_windows_give_the_keys_of_the_modules_mask(size: int) -> None:
    """``seq2seq_global_window`` and ``seq2seq_local_window`` against ``LocalWindow``'s
    in_window mask and the padding (``Normalization.parts``), at local-m's centres
    p_t = min(t, S_b - 1) for every t, past the sentence's end included; then a normalizer over
    the local spans against the Python one over that mask."""
    spans = torch.empty(ROWS, 2, dtype=torch.int64)
    kernels().seq2seq_global_window(ROWS, 1, KEYS, LENS.data_ptr(), spans.data_ptr())
    assert torch.equal(spans, SPANS)
    window = LocalWindow("local_m", size, 4)
    queries = torch.zeros(ROWS, 1, 4)
    for t in range(KEYS + 2):
        positions = torch.full((ROWS, 1), t)
        in_window, _ = window(queries, LENS.clamp(max=KEYS), positions, KEYS)
        want = mask() & in_window[:, 0]  # (R, S)
        centres = window.centres(queries, LENS.clamp(max=KEYS), positions)[:, 0].contiguous()
        kernels().seq2seq_local_window(
            ROWS, 1, KEYS, size, LENS.data_ptr(), centres.data_ptr(), spans.data_ptr()
        )
        keys = torch.arange(KEYS)
        got = (keys >= spans[:, :1]) & (keys < spans[:, 1:])
        assert torch.equal(got, want), t
        logits, weights = random(ROWS, KEYS, scale=2.0, seed=t), torch.empty(ROWS, KEYS)
        kernels().seq2seq_sparsemax(
            ROWS, KEYS, spans.data_ptr(), logits.data_ptr(), weights.data_ptr(), KEYS
        )
        expected = normalizers.sparsemax(logits.double()[:, None], want[:, None])[:, 0]
        torch.testing.assert_close(weights, expected.float(), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("heads", [1, 2])
def test_local_p_centres_and_their_backward_against_the_module(heads: int) -> None:
    """``seq2seq_local_p_centres`` after the caller's W_p h GEMM against
    ``LocalWindow.centres`` (eq. 9), a row's sentence read directly and through sentence_of;
    its backward, from each head's centre gradient (summed), against autograd in float64: the
    gradient of W_p h, and dz, whose product with tanh(W_p h) is v_p's."""
    size = 5
    window = LocalWindow("local_p", 2, size)
    assert window.W_p is not None and window.v_p is not None
    queries = random(ROWS, size, scale=2.0)
    want = window.centres(queries[:, None], LENS, None)[:, 0].detach()  # (R,)
    features = (queries @ window.W_p.weight.t()).detach().contiguous()  # (R, H): W_p h
    vector = window.v_p.weight.detach().contiguous()  # (1, H)
    gates, centres = torch.empty(ROWS), torch.empty(ROWS)
    kernels().seq2seq_local_p_centres(
        ROWS, size, vector.data_ptr(), LENS.data_ptr(), None, features.data_ptr(),
        gates.data_ptr(), centres.data_ptr(),
    )  # fmt: skip
    torch.testing.assert_close(centres, want, rtol=1e-5, atol=1e-5)
    reversed_rows = torch.arange(ROWS - 1, -1, -1)  # row r reads sentence R - 1 - r
    projected, through = (queries @ window.W_p.weight.t()).detach().flip(0), torch.empty(ROWS)
    kernels().seq2seq_local_p_centres(
        ROWS, size, vector.data_ptr(), LENS.data_ptr(), reversed_rows.data_ptr(),
        projected.contiguous().data_ptr(), None, through.data_ptr(),
    )  # fmt: skip
    torch.testing.assert_close(through, want.flip(0), rtol=1e-5, atol=1e-5)
    leaf = (queries.double() @ window.W_p.weight.double().t()).detach().requires_grad_()
    last = (LENS - 1).clamp(min=0).double()
    predicted = torch.tanh(leaf) @ vector.double()[0]  # (R,): z = v_p · u
    d_centres = random(ROWS, heads, seed=1)  # each head's, (R, h)
    (d_leaf,) = torch.autograd.grad(
        (last * torch.sigmoid(predicted) * d_centres.double().sum(1)).sum(), leaf
    )
    d_predicted, d_projected = torch.empty(ROWS), torch.empty(ROWS, size)
    kernels().seq2seq_local_p_centres_backward(
        ROWS, heads, size, vector.data_ptr(), LENS.data_ptr(), features.data_ptr(),
        gates.data_ptr(), d_centres.contiguous().data_ptr(), d_predicted.data_ptr(),
        d_projected.data_ptr(),
    )  # fmt: skip
    torch.testing.assert_close(d_projected, d_leaf.float(), rtol=1e-4, atol=1e-5)
    gate = torch.sigmoid(predicted).detach()
    want_dz = d_centres.double().sum(1) * last * gate * (1 - gate)
    torch.testing.assert_close(d_predicted, want_dz.float(), rtol=1e-4, atol=1e-5)


def test_coverage_terms_and_their_backward_against_autograd() -> None:
    """``seq2seq_additive_coverage`` (keys k_s + c_s w_c, AdditiveAttention.preactivations) and
    ``seq2seq_coverage`` (logits + γ c_s, Attention.covered_logits), with their backward
    passes, against autograd."""
    size, valid = 5, mask()
    keys, coverage = random(ROWS, KEYS, size), random(ROWS, KEYS, seed=1).abs()
    w_c, gamma = random(size, seed=2), 0.7
    covered = torch.zeros(ROWS, KEYS, size)
    kernels().seq2seq_additive_coverage(
        ROWS, 1, KEYS, size, SPANS.data_ptr(), keys.data_ptr(), coverage.data_ptr(),
        w_c.data_ptr(), covered.data_ptr(),
    )  # fmt: skip
    leaves = [x.double().requires_grad_() for x in (keys, coverage, w_c)]
    want = leaves[0] + leaves[1][:, :, None] * leaves[2]  # (R, S, A)
    torch.testing.assert_close(covered[valid], want.detach().float()[valid])
    d_covered = random(ROWS, KEYS, size, seed=3) * valid[:, :, None]
    grads = torch.autograd.grad((want * d_covered.double()).sum(), leaves)
    d_keys, d_coverage = torch.zeros(ROWS, KEYS, size), torch.empty(ROWS, KEYS)
    d_w_c = torch.zeros(ROWS, size)
    kernels().seq2seq_additive_coverage_backward(
        ROWS, 1, KEYS, size, SPANS.data_ptr(), coverage.data_ptr(), w_c.data_ptr(),
        d_covered.data_ptr(), d_keys.data_ptr(), d_coverage.data_ptr(), d_w_c.data_ptr(),
    )  # fmt: skip
    for got, expected in zip((d_keys, d_coverage, d_w_c.sum(0)), grads, strict=True):
        torch.testing.assert_close(got, expected.float(), rtol=1e-5, atol=1e-5)
    logits = random(ROWS, KEYS, seed=4)
    got_logits = logits.clone()
    kernels().seq2seq_coverage(
        ROWS, KEYS, SPANS.data_ptr(), gamma, coverage.data_ptr(), got_logits.data_ptr()
    )
    torch.testing.assert_close(got_logits[valid], (logits + gamma * coverage)[valid])
    d_logits = random(ROWS, KEYS, seed=5) * valid
    d_gamma = torch.zeros(ROWS)
    kernels().seq2seq_coverage_backward(
        ROWS, KEYS, SPANS.data_ptr(), gamma, coverage.data_ptr(), d_logits.data_ptr(),
        d_coverage.data_ptr(), d_gamma.data_ptr(),
    )  # fmt: skip
    torch.testing.assert_close(d_coverage, gamma * d_logits)
    torch.testing.assert_close(d_gamma.sum(), (coverage * d_logits).sum())


# Rows per sentence: one (training's steps), or several that read one sentence's keys and add
# into its gradients (all the target steps of a sentence at once, beam search's hypotheses).
GROUPS = [1, 3]


def sentence_of_rows(group: int) -> Tensor:
    """Row r's sentence, r / group: (R,)."""
    return torch.arange(ROWS) // group


@pytest.mark.parametrize("group", GROUPS)
def test_context_and_its_backward(group: int) -> None:
    weights = normalize("sparsemax", random(ROWS, KEYS, scale=3.0))
    values, d_context = random(ROWS // group, KEYS, 5, seed=2), random(ROWS, 5, seed=3)
    context, d_weights = torch.empty(ROWS, 5), torch.empty(ROWS, KEYS)
    d_values = torch.zeros(ROWS // group, KEYS, 5)
    kernels().seq2seq_attention_context(
        ROWS, group, KEYS, 5, weights.data_ptr(), KEYS, SPANS.data_ptr(), values.data_ptr(),
        context.data_ptr(), 5,
    )  # fmt: skip
    rows_values = values[sentence_of_rows(group)]  # (R, S, V)
    torch.testing.assert_close(context, torch.bmm(weights[:, None], rows_values)[:, 0])
    d_weights_out = random(ROWS, KEYS, seed=4)  # the weights' own gradient, from a loss
    kernels().seq2seq_attention_context_backward(
        ROWS, group, KEYS, 5, weights.data_ptr(), KEYS, SPANS.data_ptr(), values.data_ptr(),
        d_context.data_ptr(), 5, d_weights_out.data_ptr(), KEYS, d_weights.data_ptr(),
        d_values.data_ptr(),
    )  # fmt: skip
    want_d_weights = torch.bmm(rows_values, d_context[:, :, None])[:, :, 0] + d_weights_out
    torch.testing.assert_close(d_weights, want_d_weights * mask())
    want_d_values = torch.zeros_like(d_values).index_add_(
        0, sentence_of_rows(group), weights[:, :, None] * d_context[:, None, :]
    )  # (B, S, V): each sentence's rows added
    torch.testing.assert_close(d_values, want_d_values)


@pytest.mark.parametrize("saves", [True, False], ids=["saved", "recomputed"])
@pytest.mark.parametrize("group", GROUPS)
def test_additive_score_and_its_backward_against_autograd(group: int, saves: bool) -> None:
    """scale · w_v · tanh(q + k) and its gradients, the backward pass reading the forward's
    tanh or (saved NULL) recomputing it from the queries and keys."""
    size, scale, sentences = 9, 0.5, ROWS // group
    q, w_v = random(ROWS, size), random(size, seed=2)
    keys = random(sentences, KEYS, size, seed=1)
    logits, saved = torch.empty(ROWS, KEYS), torch.empty(ROWS, KEYS, size)
    saved_address = saved.data_ptr() if saves else None
    kernels().seq2seq_additive_score(
        ROWS, group, KEYS, size, scale, q.data_ptr(), keys.data_ptr(), w_v.data_ptr(),
        SPANS.data_ptr(), saved_address, logits.data_ptr(),
    )  # fmt: skip
    leaves = [x.double().requires_grad_() for x in (q, keys, w_v)]
    rows_keys = leaves[1][sentence_of_rows(group)]  # (R, S, A)
    want = scale * torch.tanh(leaves[0][:, None] + rows_keys) @ leaves[2]  # (R, S)
    valid = mask()
    torch.testing.assert_close(logits[valid], want.detach().float()[valid])
    d_logits = random(ROWS, KEYS, seed=3) * valid
    grads = torch.autograd.grad((want * d_logits.double()).sum(), leaves)
    d_q, d_keys, d_w_v = (
        torch.empty(ROWS, size),
        torch.zeros(sentences, KEYS, size),
        torch.zeros(ROWS, size),
    )
    kernels().seq2seq_additive_score_backward(
        ROWS, group, KEYS, size, scale, saved_address, q.data_ptr(), keys.data_ptr(),
        w_v.data_ptr(), SPANS.data_ptr(), d_logits.data_ptr(), d_q.data_ptr(), d_keys.data_ptr(),
        d_w_v.data_ptr(),
    )  # fmt: skip
    for got, expected in zip((d_q, d_keys, d_w_v.sum(0)), grads, strict=True):
        torch.testing.assert_close(got, expected.float(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("saves", [True, False], ids=["saved", "recomputed"])
@pytest.mark.parametrize("group", GROUPS)
def test_layer_normed_additive_score_and_its_backward_against_autograd(
    group: int, saves: bool
) -> None:
    """scale · w_v · tanh(LayerNorm(q + k)) (nn.LayerNorm's γ, β and eps) and its gradients,
    the backward pass reading the forward's features or recomputing them."""
    size, scale, eps, sentences = 9, 0.5, 1e-5, ROWS // group
    q, keys = random(ROWS, size), random(sentences, KEYS, size, seed=1)
    params = torch.stack([random(size, seed=2), 1 + random(size, seed=4), random(size, seed=5)])
    logits = torch.empty(ROWS, KEYS)
    saved = [torch.empty(ROWS, KEYS, size), torch.empty(ROWS, KEYS, size), torch.empty(ROWS, KEYS)]
    addresses = [t.data_ptr() if saves else None for t in saved]
    kernels().seq2seq_additive_layer_norm_score(
        ROWS, group, KEYS, size, scale, eps, q.data_ptr(), keys.data_ptr(), params.data_ptr(),
        SPANS.data_ptr(), *addresses, logits.data_ptr(),
    )  # fmt: skip
    leaves = [x.double().requires_grad_() for x in (q, keys, params)]
    x = leaves[0][:, None] + leaves[1][sentence_of_rows(group)]  # (R, S, A)
    w_v, gamma, beta = leaves[2]
    normed = torch.nn.functional.layer_norm(x, (size,), gamma, beta, eps)
    want = scale * torch.tanh(normed) @ w_v  # (R, S)
    valid = mask()
    torch.testing.assert_close(logits[valid], want.detach().float()[valid])
    d_logits = random(ROWS, KEYS, seed=3) * valid
    grads = torch.autograd.grad((want * d_logits.double()).sum(), leaves)
    d_q, d_keys = torch.empty(ROWS, size), torch.zeros(sentences, KEYS, size)
    d_params = torch.zeros(ROWS, 3 * size)
    kernels().seq2seq_additive_layer_norm_score_backward(
        ROWS, group, KEYS, size, scale, eps, *addresses, q.data_ptr(), keys.data_ptr(),
        params.data_ptr(), SPANS.data_ptr(), d_logits.data_ptr(), d_q.data_ptr(),
        d_keys.data_ptr(), d_params.data_ptr(),
    )  # fmt: skip
    got = (d_q, d_keys, d_params.sum(0).view(3, size))
    for value, expected in zip(got, grads, strict=True):
        torch.testing.assert_close(value, expected.float(), rtol=1e-4, atol=1e-5)


def test_the_additive_scores_tanh_is_within_3e_7_of_tanh() -> None:
    """``tanh_rational`` (csrc/vector_math.h), read through a one-feature additive score
    (w_v = 1, k = 0: e = tanh(q)) on a dense grid past its clamp, against float64's tanh."""
    x = torch.linspace(-12.0, 12.0, 240_001)
    rows = x.numel()
    logits, spans = torch.empty(rows, 1), torch.tensor([[0, 1]]).repeat(rows, 1)
    keys, w_v = torch.zeros(rows, 1, 1), torch.ones(1)
    kernels().seq2seq_additive_score(
        rows, 1, 1, 1, 1.0, x.data_ptr(), keys.data_ptr(), w_v.data_ptr(), spans.data_ptr(),
        None, logits.data_ptr(),
    )  # fmt: skip
    want = torch.tanh(x.double())
    error = (logits[:, 0].double() - want).abs()
    assert error.max() < 3e-7
    assert (error / want.abs().clamp(min=1e-30)).max() < 3e-7


@pytest.mark.parametrize("group", GROUPS)
def test_product_score_and_its_backward_against_autograd(group: int) -> None:
    size, scale = 8, 8**-0.5
    q, keys = random(ROWS, size), random(ROWS // group, KEYS, size, seed=1)
    logits = torch.empty(ROWS, KEYS)
    kernels().seq2seq_product_score(
        ROWS, group, KEYS, size, scale, q.data_ptr(), keys.data_ptr(), SPANS.data_ptr(),
        logits.data_ptr(),
    )  # fmt: skip
    leaves = [x.double().requires_grad_() for x in (q, keys)]
    rows_keys = leaves[1][sentence_of_rows(group)]  # (R, S, D)
    want = scale * torch.bmm(rows_keys, leaves[0][:, :, None])[:, :, 0]  # (R, S)
    valid = mask()
    torch.testing.assert_close(logits[valid], want.detach().float()[valid])
    d_logits = random(ROWS, KEYS, seed=3) * valid
    grads = torch.autograd.grad((want * d_logits.double()).sum(), leaves)
    d_q, d_keys = torch.empty(ROWS, size), torch.zeros(ROWS // group, KEYS, size)
    kernels().seq2seq_product_score_backward(
        ROWS, group, KEYS, size, scale, q.data_ptr(), keys.data_ptr(), SPANS.data_ptr(),
        d_logits.data_ptr(), d_q.data_ptr(), d_keys.data_ptr(),
    )  # fmt: skip
    for got, expected in zip((d_q, d_keys), grads, strict=True):
        torch.testing.assert_close(got, expected.float(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "parts",
    [
        StepAttention("additive", 1.0, "sparsemax"),
        StepAttention("additive", 1.0, layer_norm_eps=1e-5),
        StepAttention("product", 1.0, "entmax15", 1.5, window="local_m", window_size=1),
    ],
    ids=["additive-sparsemax", "layer-normed", "product-local-m"],
)
def test_attend_skips_the_rows_live_leaves_out(parts: StepAttention) -> None:
    """``attend`` with ``live`` (a Luong decoder's padded grid): the rows it names get what
    attending every row gives them, and so do the gradients of a loss on those rows; every
    other row gets exactly zero weights and context, and its query no gradient."""
    sentences, group, size, memory_size = 4, 5, 7, 5
    rows = sentences * group
    additive = parts.score == "additive"
    key_size = 9 if additive else size  # a product's keys have the query's size
    src_lens = torch.tensor([KEYS, 0, 3, 5])  # sentence 1 has no key
    live = torch.tensor([0, 1, 2, 3, 4, 5, 6, 10, 11, 12, 13, 15])  # b·group + t, t < T_b
    dead = torch.ones(rows, dtype=torch.bool).index_fill_(0, live, False)
    positions = torch.arange(rows) % group if parts.window == "local_m" else None  # t
    score_rows = 3 if parts.layer_norm_eps is not None else 1  # [w_v; γ; β] or w_v
    inputs = [
        random(rows, size),  # queries
        random(sentences, KEYS, key_size, seed=1),  # projected keys
        random(sentences, KEYS, memory_size, seed=2),  # memory
    ]
    if additive:  # W_q, b_q and the score's weights
        inputs += [random(key_size, size, seed=3), random(key_size, seed=4)]
        inputs += [random(score_rows, key_size, seed=5) + (torch.arange(score_rows) == 1)[:, None]]
    d_contexts, d_weights = random(rows, memory_size, seed=6), random(rows, KEYS, seed=7)

    def attended(given: Tensor | None) -> tuple[Tensor, Tensor, list[Tensor]]:
        leaves = [x.clone().requires_grad_() for x in inputs]
        queries, keys, memory, *weights = leaves
        query_weight, query_bias, score_weight = weights if additive else (None, None, None)
        contexts, weights = attend(
            parts, queries, keys, memory, src_lens, query_weight, query_bias, score_weight,
            positions=positions, live=given,
        )  # fmt: skip
        return contexts, weights, leaves

    def loss(contexts: Tensor, weights: Tensor, chosen: Tensor | slice) -> Tensor:
        return (contexts * d_contexts)[chosen].sum() + (weights * d_weights)[chosen].sum()

    contexts, weights, leaves = attended(None)
    grads = torch.autograd.grad(loss(contexts, weights, live), leaves)
    live_contexts, live_weights, live_leaves = attended(live)
    live_grads = torch.autograd.grad(
        loss(live_contexts, live_weights, slice(None)), live_leaves
    )  # every row's loss: the padding's add nothing
    torch.testing.assert_close(live_contexts[live], contexts[live])
    torch.testing.assert_close(live_weights[live], weights[live])
    assert not live_contexts[dead].any() and not live_weights[dead].any()
    assert not live_grads[0][dead].any()  # the padding's queries
    for got, want in zip(live_grads, grads, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    ("attention", "parts", "want"),
    [
        (AdditiveAttention(4, 4, 6), AttentionParts(), StepAttention("additive", 1.0)),
        (
            AdditiveAttention(4, 4, 6, temperature=2.0),
            AttentionParts(normalizer="sparsemax"),
            StepAttention("additive", 0.5, "sparsemax", 2.0),
        ),
        (DotProductAttention(scaled=False), AttentionParts(), StepAttention("product", 1.0)),
        (
            DotProductAttention(),
            AttentionParts(normalizer="entmax15"),
            StepAttention("product", 0.5, "entmax15", 1.5),
        ),
        (GeneralAttention(4, 4, temperature=4.0), AttentionParts(), StepAttention("product", 0.25)),
        (
            AdditiveAttention(4, 4, 6, layer_norm=True),
            AttentionParts(),
            StepAttention("additive", 1.0, layer_norm_eps=1e-5),
        ),
        (
            DotProductAttention(temperature="learnable"),  # T = exp(0) = 1 to start
            AttentionParts(),
            StepAttention("product", 0.5, learned_temperature=True),
        ),
        (
            DotProductAttention(scaled=False),
            AttentionParts(window="local_m", window_size=2),
            StepAttention("product", 1.0, window="local_m", window_size=2),
        ),
        (
            DotProductAttention(),
            AttentionParts(window="local_p", window_size=2),
            StepAttention("product", 0.5, window="local_p", window_size=2),
        ),
        (
            DotProductAttention(scaled=False),
            AttentionParts(key_bias=True, key_bias_positions=5),
            StepAttention("product", 1.0, key_bias=True),
        ),
        (
            DotProductAttention(),
            AttentionParts(coverage=True),
            StepAttention("product", 0.5, coverage="logits"),
        ),
        (
            AdditiveAttention(4, 4, 6),
            AttentionParts(coverage=True),
            StepAttention("additive", 1.0, coverage="additive"),
        ),
        (
            DotProductAttention(scaled=False),
            AttentionParts(normalizer="entmax", alpha=1.3),
            StepAttention("product", 1.0, "entmax_bisect", 1.3),
        ),
    ],
)
def test_step_attention_names_the_twins_of_the_built_parts(
    attention: AdditiveAttention, parts: AttentionParts, want: StepAttention | None
) -> None:
    """Which parts have C twins (the query size 4: a scaled dot product's 1 / √4)."""
    assert step_attention(attention.use_parts(parts, 4), 4) == want


def test_every_normalizer_with_a_twin_is_named() -> None:
    assert set(NORMALIZER_TWINS) == {Softmax, Sparsemax, Entmax15}
    assert {name for name, _ in NORMALIZER_TWINS.values()} == set(NORMALIZERS)
