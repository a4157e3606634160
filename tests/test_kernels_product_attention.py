"""seq2seq.kernels.product_attention: a decoding step's dot-product or bilinear attention in one C
pass, and teacher forcing's over packed rows with its backward pass.

References: the scoring functions' own ``forward`` (scores, ``masked_softmax``, bmm), the
Luong decoder's searches with the pass on and off, and the formula's autograd in float64.

Shape legend: R query rows, B sentences, S source length, D query size, V value size.
"""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from seq2seq.attention import (
    AdditiveAttention,
    Attention,
    DotProductAttention,
    GeneralAttention,
)
from seq2seq.kernels import accelerate, library
from seq2seq.kernels.modules import FastLuongDecoder, product_scale
from seq2seq.kernels.product_attention import PackedProductAttention, product_attend
from seq2seq.models.decoder import LuongDecoder
from seq2seq.models.model import Seq2Seq
from tests.test_kernels_bahdanau import assert_searches_agree
from tests.test_model import make_batch

pytestmark = pytest.mark.skipif(
    library.library() is None, reason=f"no fused kernels here: {library.unavailable_reason()}"
)
SCORINGS = {
    "dot": partial(DotProductAttention, scaled=False),
    "scaled_dot": partial(DotProductAttention, scaled=True),
    "scaled_dot_t2": partial(DotProductAttention, scaled=True, temperature=2.0),
    "general": partial(GeneralAttention, query_size=6, key_size=5),
}


@pytest.mark.parametrize("name", list(SCORINGS))
@pytest.mark.parametrize(("sentences", "group"), [(4, 1), (4, 3), (64, 2)])  # 64: threaded
@pytest.mark.usefixtures("two_threads")
def test_product_attend_is_the_modules_attention(name: str, sentences: int, group: int) -> None:
    """Each of the R = B·group queries against its own sentence's keys, as ``forward`` computes
    it; lengths from 0 (all-zero weights and context) to longer than S (clamped)."""
    torch.manual_seed(0)
    attention: Attention = SCORINGS[name]().eval()
    keys_size = 5 if name == "general" else 6
    keys, values = torch.randn(sentences, 7, keys_size), torch.randn(sentences, 7, 4)
    src_lens = torch.tensor([0, 7, 1, 9, *([3, 5] * 30)])[:sentences]
    queries = torch.randn(sentences * group, 6)
    scale = product_scale(attention, 6)
    assert scale is not None
    contexts, weights = product_attend(
        queries, attention.project_keys(keys), values, src_lens, scale
    )
    rows = torch.arange(sentences * group) // group  # each query's sentence
    want_contexts, want_weights = attention(
        queries[:, None], keys[rows], values[rows], src_lens.clamp(max=7)[rows]
    )
    torch.testing.assert_close(weights, want_weights[:, 0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(contexts, want_contexts[:, 0], rtol=1e-5, atol=1e-6)
    assert (weights[:group] == 0).all() and (contexts[:group] == 0).all()


def test_product_scale_is_the_logits_factor_or_none() -> None:
    assert product_scale(DotProductAttention(scaled=False), 16) == 1.0
    assert product_scale(DotProductAttention(scaled=True, temperature=2.0), 16) == 1 / 8
    assert product_scale(GeneralAttention(4, 4, temperature=0.5), 4) == 2.0
    assert product_scale(DotProductAttention(temperature="learnable"), 16) is None
    assert product_scale(AdditiveAttention(4, 4, num_hiddens=3), 4) is None
    assert math.isclose(product_scale(DotProductAttention(), 9) or 0, 1 / 3)


@pytest.mark.parametrize("name", ["dot", "scaled_dot", "general"])
def test_luong_searches_decode_the_same_with_and_without_the_pass(name: str) -> None:
    torch.manual_seed(0)
    factory = SCORINGS[name] if name != "general" else GeneralAttention
    model = Seq2Seq(
        src_vocab_size=13, tgt_vocab_size=11, attention=factory, embedding_size=8,
        hidden_size=16, decoder=LuongDecoder,
    ).eval()  # fmt: skip
    accelerate(model)
    assert isinstance(model.decoder, FastLuongDecoder)
    decoder = model.decoder
    assert_searches_agree(
        model, lambda source, state: decoder.fused_product_scale(source, state) is not None
    )


def test_not_with_active_dropout_or_a_learnable_temperature() -> None:
    src, src_lens, _ = make_batch()
    for attention, train in (
        (partial(DotProductAttention, dropout=0.3), True),
        (partial(DotProductAttention, temperature="learnable"), False),
    ):
        torch.manual_seed(0)
        model = Seq2Seq(
            src_vocab_size=13, tgt_vocab_size=11, attention=attention, embedding_size=8,
            hidden_size=16, decoder=LuongDecoder,
        ).train(train)  # fmt: skip
        accelerate(model)
        assert isinstance(model.decoder, FastLuongDecoder)
        with torch.no_grad():
            source, state = model.encode(src, src_lens)
            assert model.decoder.fused_product_scale(source, state[0]) is None


@pytest.mark.parametrize("shared", [True, False], ids=["keys-are-values", "own-values"])
def test_packed_rows_attention_and_its_gradients_are_the_formulas(shared: bool) -> None:
    """Rows in any order and any number per sentence (none for the last), against softmax over
    each sentence's valid keys of scale q . k, averaging its values, differentiated by autograd
    in float64; the gradients at padded keys and of a sentence without rows are zero."""
    generator = torch.Generator().manual_seed(0)
    batch, length, size = 4, 6, 5
    value_size = size if shared else 7
    lens = torch.tensor([6, 2, 4, 3])
    sentence_of = torch.tensor([2, 0, 1, 0, 2, 0, 1, 2])  # sentence 3 has no rows
    scale = 0.7
    queries = torch.randn(len(sentence_of), size, generator=generator)
    keys = torch.randn(batch, length, size, generator=generator)
    keys[1, 2:] = 1e4  # padding: must never be read
    values = keys if shared else torch.randn(batch, length, value_size, generator=generator)
    d_contexts = torch.randn(len(sentence_of), value_size, generator=generator)

    def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rows = []
        for r, b in enumerate(sentence_of.tolist()):
            n = int(lens[b])
            weights = torch.softmax(scale * (k[b, :n] @ q[r]), dim=0)  # (n,)
            rows.append(weights @ v[b, :n])  # (V,)
        return torch.stack(rows)

    inputs = [tensor.double().requires_grad_() for tensor in (queries, keys, values)]
    if shared:
        inputs[2] = inputs[1]
    expected = reference(*inputs)
    expected_grads = torch.autograd.grad(expected, inputs, d_contexts.double(), allow_unused=True)

    ours = [tensor.clone().requires_grad_() for tensor in (queries, keys, values)]
    if shared:
        ours[2] = ours[1]
    contexts = PackedProductAttention.apply(*ours, lens, sentence_of, scale)
    grads = torch.autograd.grad(contexts, ours, d_contexts, allow_unused=True)
    torch.testing.assert_close(contexts, expected.float(), rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, expected_grads, strict=True):
        assert got is not None and want is not None
        torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=1e-5)
    d_keys = grads[1]
    assert bool((d_keys[1, 2:] == 0).all()) and bool((d_keys[3] == 0).all())
