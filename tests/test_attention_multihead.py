"""MultiHeadAttention: torch's nn.MultiheadAttention with the same weights, the masking contract
per head with every scoring function, and multi-head cross-attention in both RNN decoders.

Shape legend: B batch, Tq queries, Tk keys, h heads, D model size.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from seq2seq.attention import (
    AdditiveAttention,
    DotProductAttention,
    MultiHeadAttention,
    head_size,
)
from seq2seq.errors import ConfigError
from seq2seq.models import Seq2Seq
from tests.scoring import SCORING_FUNCTIONS, scoring_factory
from tests.test_model import DECODERS, make_batch
from tests.test_search import assert_beam_one_is_greedy

SCORINGS = {name: scoring_factory(name, {"num_hiddens": 6}) for name in SCORING_FUNCTIONS}


def multi_head(name: str, heads: int = 4, size: int = 16, **sizes: int) -> MultiHeadAttention:
    torch.manual_seed(0)
    scoring = SCORINGS[name](query_size=size // heads, key_size=size // heads)
    return MultiHeadAttention(
        scoring,
        heads,
        sizes.get("query_size", size),
        sizes.get("key_size", size),
        sizes.get("value_size", size),
        size,
    )


def torch_twin(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    """``nn.MultiheadAttention(batch_first=True)`` with ``ours``'s weights."""
    size = ours.W_o.out_features
    twin = nn.MultiheadAttention(size, ours.num_heads, batch_first=True)
    with torch.no_grad():
        twin.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
        twin.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
        twin.out_proj.weight.copy_(ours.W_o.weight)
        twin.out_proj.bias.copy_(ours.W_o.bias)
    return twin


@pytest.mark.parametrize("heads", [1, 2, 4])
def test_scaled_dot_heads_are_torchs_multihead_attention(heads: int) -> None:
    ours = multi_head("scaled_dot", heads)
    twin = torch_twin(ours)
    queries, keys, values = torch.randn(3, 5, 16), torch.randn(3, 7, 16), torch.randn(3, 7, 16)
    valid_lens = torch.tensor([7, 3, 5])
    padding = torch.arange(7)[None, :] >= valid_lens[:, None]  # torch's mask: True = ignore
    want, want_weights = twin(
        queries, keys, values, key_padding_mask=padding, average_attn_weights=False
    )
    context, weights = ours(queries, keys, values, valid_lens)
    assert weights is not None and weights.shape == (3, heads, 5, 7)
    torch.testing.assert_close(context, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, want_weights, atol=1e-5, rtol=1e-5)
    # Without the weights, F.scaled_dot_product_attention computes the same context.
    fast, none = ours(queries, keys, values, valid_lens, need_weights=False)
    assert none is None
    torch.testing.assert_close(fast, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(SCORINGS))
def test_every_head_keeps_the_masking_contract(name: str) -> None:
    """Exact zeros at padding, rows of valid keys summing to 1, an empty row all zeros (and its
    context W_o's bias alone), for every scoring function inside the heads; per-query lengths
    (B, Tq) give the causal mask."""
    attention = multi_head(name).eval()
    queries, keys = torch.randn(3, 4, 16), torch.randn(3, 6, 16)
    valid_lens = torch.tensor([6, 2, 0])
    context, weights = attention(queries, keys, keys, valid_lens)
    assert weights is not None
    assert (weights[1, :, :, 2:] == 0).all() and (weights[2] == 0).all()
    torch.testing.assert_close(weights[:2].sum(-1), torch.ones(2, 4, 4))
    torch.testing.assert_close(context[2], attention.W_o.bias.expand(4, -1))
    causal = torch.arange(1, 5).expand(3, 4)  # query t reads keys 1..t
    _, weights = attention(queries, keys[:, :4], keys[:, :4], causal)
    assert weights is not None
    assert (weights.triu(diagonal=1) == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 4))


def test_bfloat16_heads_stay_finite_with_an_empty_row() -> None:
    attention = multi_head("additive").to(torch.bfloat16)
    queries, keys = torch.randn(2, 3, 16, dtype=torch.bfloat16), torch.randn(2, 5, 16)
    context, weights = attention(queries, keys.bfloat16(), keys.bfloat16(), torch.tensor([5, 0]))
    assert weights is not None and torch.isfinite(weights).all() and (weights[1] == 0).all()
    assert torch.isfinite(context).all()


def test_the_scoring_function_is_shared_by_the_heads() -> None:
    """Additive scoring has one W_q, W_k and w_v of the head's size, whatever the head count."""
    two, eight = (multi_head("additive", heads, size=32) for heads in (2, 8))
    for attention, width in ((two, 16), (eight, 4)):
        assert isinstance(attention.scoring, AdditiveAttention)
        assert attention.scoring.W_q.in_features == width
    assert two.W_q.weight.shape == eight.W_q.weight.shape == (32, 32)


def test_projections_computed_once_are_those_computed_inside() -> None:
    attention = multi_head("general", size=16, key_size=10, value_size=12)
    queries, keys, values = torch.randn(2, 3, 16), torch.randn(2, 5, 10), torch.randn(2, 5, 12)
    lens = torch.tensor([5, 4])
    inside = attention(queries, keys, values, lens)
    once = attention(
        queries, keys, values, lens,
        projected_keys=attention.project_keys(keys),
        projected_values=attention.project_values(values),
    )  # fmt: skip
    for got, want in zip(once, inside, strict=True):
        torch.testing.assert_close(got, want)


def test_heads_must_divide_the_size() -> None:
    with pytest.raises(
        ConfigError, match=r"model\.num_heads=3 must be a positive integer that div"
    ):
        MultiHeadAttention(DotProductAttention(), 3, 16, 16, 16, 16)


@pytest.mark.parametrize(
    ("size", "heads", "given", "suggested"),
    [
        (250, 4, "4", "model.num_heads=2 or model.num_heads=5."),
        (256, 3, "3", "model.num_heads=2 or model.num_heads=4."),
        (32, 0, "0", "model.num_heads=4."),
        (32, True, "true", "model.num_heads=4."),
        (32, None, "null", "model.num_heads=4."),
        (7, 4, "4", "model.num_heads=7."),
    ],
)
def test_a_wrong_head_count_is_told_counts_that_divide_the_size(
    size: int, heads: object, given: str, suggested: str
) -> None:
    with pytest.raises(ConfigError) as info:
        head_size(size, heads, f"the size {size}")
    message = str(info.value)
    assert message.startswith(f"model.num_heads={given} must be") and message.endswith(suggested)
    for count in map(int, re.findall(r"num_heads=(\d+)", message.split("E.g.")[1])):
        assert size % count == 0


def make_multi_head_model(attention: str, decoder: str, lstm: bool = False) -> Seq2Seq:
    torch.manual_seed(0)
    return Seq2Seq(
        src_vocab_size=13,
        tgt_vocab_size=11,
        attention=SCORINGS[attention],
        embedding_size=8,
        hidden_size=16,
        rnn=nn.LSTM if lstm else nn.GRU,
        cell=nn.LSTMCell if lstm else nn.GRUCell,
        decoder=DECODERS[decoder],
        num_heads=4,
    ).eval()


@pytest.mark.parametrize("decoder", list(DECODERS))
@pytest.mark.parametrize("attention", list(SCORINGS))
def test_rnn_decoders_with_four_heads_step_as_they_teacher_force(
    attention: str, decoder: str
) -> None:
    """``model.num_heads=4`` in either RNN decoder: stepping equals teacher forcing (logits
    and the heads' average weights), beam 1 is greedy."""
    model = make_multi_head_model(attention, decoder)
    assert isinstance(model.decoder.attention, MultiHeadAttention)
    src, src_lens, tgt_in = make_batch()
    logits, weights = model(src, src_lens, tgt_in)
    assert weights is not None
    with torch.no_grad():
        source, state = model.encode(src, src_lens)
        for t in range(tgt_in.shape[1]):
            step_logits, state, step_weights = model.decode_step(tgt_in[:, t], state, source)
            torch.testing.assert_close(step_logits, logits[:, t])
            torch.testing.assert_close(step_weights, weights[:, t])
    assert_beam_one_is_greedy(model, src, src_lens)
