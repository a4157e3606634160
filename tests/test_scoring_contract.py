"""``score`` is the contract: training (the loss and its gradients), validation and decoding
compute the weights of the scoring function's own ``score``, for every scoring function in
``conf/attention/`` and for a user's subclass that overrides ``score``, with the C kernels on and
off, in each model family.

The faster paths (``F.scaled_dot_product_attention``, the C kernels) compute a built-in formula
another way; the reference they are held to here is the model run through ``Attention.forward``
(which calls ``score``) with the kernels off. The subclass is also held to a model whose scoring
function derives from ``Attention`` itself, so that no fast path can mistake it for a built-in:
that comparison does not depend on how the fast paths decide whether they apply.
"""

from __future__ import annotations

import copy
import logging
import types
from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.attention import (
    AdditiveAttention,
    Attention,
    AttentionParts,
    DotProductAttention,
    MultiHeadAttention,
    own_formula,
)
from seq2seq.data.tokenization import BOS_ID, EOS_ID, PAD_ID
from seq2seq.inference.bundle import build_model
from seq2seq.kernels import accelerate, is_accelerated, say_once
from seq2seq.kernels.modules import FastDecoder
from seq2seq.models import EncoderDecoder, LuongDecoder
from seq2seq.models.model import Seq2Seq
from seq2seq.normalizers import Entmax
from seq2seq.search import greedy_search
from seq2seq.training.loss import DecoderLoss, teacher_forced_loss
from tests.scoring import (
    MODEL_OVERRIDES,
    SCORING_FUNCTIONS,
    assert_attention_follows_score,
    model_config,
)
from tests.test_model import randomize_coverage


def cosine(queries: Tensor, projected_keys: Tensor) -> Tensor:
    """cos(q, k) for every pair: (B,Tq,D) @ (B,D,Tk) -> (B,Tq,Tk)."""
    unit_keys = F.normalize(projected_keys, dim=-1)
    return torch.bmm(F.normalize(queries, dim=-1), unit_keys.transpose(1, 2))


class CosineDot(DotProductAttention):
    """What a user writes first: dot-product attention with its own ``score``."""

    def score(self, queries: Tensor, projected_keys: Tensor) -> Tensor:
        return cosine(queries, projected_keys) * 4.0


class CosineByHand(Attention):
    """The same formula on a class no fast path knows: the reference for ``CosineDot``."""

    needs_equal_sizes = True

    def __init__(
        self,
        dropout: float = 0.0,
        scaled: bool = True,
        temperature: float | str = 1.0,
        initial_temperature: float = 1.0,
        *,
        query_size: int | None = None,
        key_size: int | None = None,
    ) -> None:
        super().__init__(dropout, temperature, initial_temperature)

    def score(self, queries: Tensor, projected_keys: Tensor) -> Tensor:
        return cosine(queries, projected_keys) * 4.0


SUBCLASS = "subclass overriding score"
CASES = [*SCORING_FUNCTIONS, SUBCLASS]


def configs(
    family: str, scoring: str, overrides: Sequence[str] = ()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the model's config, its reference's config): for a built-in scoring function the same;
    for the subclass, the scaled-dot config with ``CosineDot`` and with ``CosineByHand``."""
    if scoring != SUBCLASS:
        config = model_config(family, scoring, overrides)
        return config, config
    config = model_config(family, "scaled_dot", overrides)
    own, by_hand = (
        {**config, "attention": {**config["attention"], "_target_": f"{__name__}.{name}"}}
        for name in ("CosineDot", "CosineByHand")
    )
    return own, by_hand


def models(
    family: str, scoring: str, kernels: str, overrides: Sequence[str] = ()
) -> tuple[EncoderDecoder, EncoderDecoder]:
    """The model (kernels as given) and its reference (kernels off), with the same weights."""
    config, reference_config = configs(family, scoring, overrides)
    torch.manual_seed(0)
    model = build_model(config, kernels=kernels, trust_modules=[__name__])
    randomize_coverage(model)  # coverage starts at 0, where it changes nothing
    reference = build_model(reference_config, kernels="off", trust_modules=[__name__])
    reference.load_state_dict(model.state_dict())
    return model, reference


@pytest.mark.parametrize("kernels", ["auto", "off"])
@pytest.mark.parametrize("scoring", CASES)
@pytest.mark.parametrize("family", sorted(MODEL_OVERRIDES))
def test_training_validation_and_decoding_use_the_scoring_functions_score(
    family: str, scoring: str, kernels: str
) -> None:
    model, reference = models(family, scoring, kernels)
    assert_attention_follows_score(model, reference, family)


# The attention's other parts, one at a time (a Transformer takes the normalizers only). Small
# windows, so that they cut into the test batch's sentences (lengths 3 to 7).
PARTS = {
    "sparsemax": ["attention.normalizer=sparsemax"],
    "entmax15": ["attention.normalizer=entmax15"],
    "learned entmax": [
        "attention.normalizer=entmax",
        "attention.alpha=learnable",
        "attention.initial_alpha=1.3",
    ],
    "local_m": ["attention.window=local_m", "attention.window_size=1"],
    "local_p": ["attention.window=local_p", "attention.window_size=1"],
    "key_bias": ["attention.key_bias=true", "attention.key_bias_positions=5"],
    "coverage": ["attention.coverage=true"],
    "coverage with sparsemax and local_p": [
        "attention.coverage=true",
        "attention.normalizer=sparsemax",
        "attention.window=local_p",
        "attention.window_size=1",
    ],
}


def in_default_suite(family: str, scoring: str, kernels: str) -> bool:
    """The cases the default suite runs (the slow set runs all): both kernel choices where the C
    kernels have a loop of their own to stand aside from (additive scoring of an RNN decoder),
    one elsewhere."""
    if family == "transformer":
        return scoring != "additive"
    return kernels == "auto" or scoring == "additive"


PART_CASES = [
    pytest.param(
        part, family, scoring, kernels,
        marks=[] if in_default_suite(family, scoring, kernels) else [pytest.mark.slow],
    )
    for part in PARTS
    for family in sorted(MODEL_OVERRIDES)
    if family != "transformer" or PARTS[part][0].startswith("attention.normalizer")
    for scoring in ("additive", "scaled_dot", SUBCLASS)
    for kernels in ("auto", "off")
]  # fmt: skip


@pytest.mark.parametrize(("part", "family", "scoring", "kernels"), PART_CASES)
def test_every_path_computes_the_attentions_parts_too(
    part: str, family: str, scoring: str, kernels: str
) -> None:
    """The normalizer, window and key bias are one formula in training (the loss and its
    gradients without the weights), validation, greedy and beam search (a local-m window's step
    count reordered with the beams), whatever the scoring function and the kernels' choice."""
    model, reference = models(family, scoring, kernels, PARTS[part])
    assert any(module.normalization is not None for module in attentions(model))
    assert_attention_follows_score(model, reference, family)


@pytest.mark.parametrize("part", ["none", "sparsemax", "local_m", "coverage"])
@pytest.mark.parametrize("kernels", ["auto", "off"])
@pytest.mark.parametrize("scoring", ["additive", "scaled_dot", "general", SUBCLASS])
def test_an_input_fed_decoder_computes_the_score_and_parts_on_every_path(
    scoring: str, kernels: str, part: str
) -> None:
    """Input feeding (the Luong decoder's cell reads the last attentional vector): training,
    validation, greedy and beam search (the vector reordered with the beams) compute the scoring
    function's own weights; with the kernels on, the decoder steps its cell as the reference does
    and attends through the C parts, or stands aside whole where a part has no twin (a scoring
    function's own formula with other parts)."""
    overrides = ["model.input_feeding=true", *PARTS.get(part, [])]
    model, reference = models("luong", scoring, kernels, overrides)
    assert model.decoder.input_feeding
    stands_aside = kernels == "off" or (scoring == SUBCLASS and part != "none")
    assert (type(model.decoder) is LuongDecoder) is stands_aside
    assert_attention_follows_score(model, reference, "luong")


def attentions(model: EncoderDecoder) -> list[Attention | MultiHeadAttention]:
    return [m for m in model.modules() if isinstance(m, Attention | MultiHeadAttention)]


@pytest.mark.parametrize("heads", [1, 2])
def test_a_subclass_with_its_own_score_trains_on_it_by_hand(heads: int) -> None:
    """The failure this contract prevents: ``context`` (training's path, no weights) of a
    ``DotProductAttention`` subclass went through its parent's q·k (SDPA). Checked against the
    formula by hand, softmax(4 cos(q, k)) v over the real keys, and its gradients."""
    torch.manual_seed(0)
    queries, keys, values = (torch.randn(3, 5, 8, requires_grad=True) for _ in range(3))
    valid_lens = torch.tensor([5, 2, 4])
    attention: Attention | MultiHeadAttention = CosineDot()
    if heads > 1:
        attention = MultiHeadAttention(CosineDot(), heads, 8, 8, 8, 8)
        # With the projections W_q, W_k, W_v as the identity and W_o as well, by hand below.
        for linear in (attention.W_q, attention.W_k, attention.W_v, attention.W_o):
            torch.nn.init.eye_(linear.weight)
            torch.nn.init.zeros_(linear.bias)
    attention.train()
    context = attention.context(queries, keys, values, valid_lens)
    context.square().sum().backward()
    ours = [tensor.grad.clone() for tensor in (queries, keys, values)]

    expected = torch.zeros(3, 5, 8)
    for b, length in enumerate(valid_lens.tolist()):
        for head in range(heads):
            part = slice(head * 8 // heads, (head + 1) * 8 // heads)
            q, k, v = queries[b, :, part], keys[b, :length, part], values[b, :length, part]
            scores = 4.0 * F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).T  # (Tq, Tk)
            expected[b, :, part] = torch.softmax(scores, dim=-1) @ v
    for tensor in (queries, keys, values):
        tensor.grad = None
    expected.square().sum().backward()
    torch.testing.assert_close(context, expected, rtol=1e-5, atol=1e-6)
    for got, tensor in zip(ours, (queries, keys, values), strict=True):
        torch.testing.assert_close(got, tensor.grad, rtol=1e-4, atol=1e-6)


def test_the_kernels_say_once_why_they_stand_aside(caplog: pytest.LogCaptureFixture) -> None:
    say_once.cache_clear()
    with caplog.at_level(logging.INFO, logger="seq2seq.kernels"):
        for _ in range(2):
            for config in configs("bahdanau", SUBCLASS):
                build_model(config, kernels="auto", trust_modules=[__name__])
    messages = [record.getMessage() for record in caplog.records if "stand" in record.message]
    assert len([m for m in messages if "CosineDot overrides DotProductAttention.score" in m]) == 1
    assert any("CosineByHand is not one of this package's scoring functions" in m for m in messages)


def test_the_kernels_say_that_attention_dropout_trains_on_the_reference_path(
    caplog: pytest.LogCaptureFixture,
) -> None:
    say_once.cache_clear()
    model = Seq2Seq(
        13, 11, attention=lambda query_size, key_size: AdditiveAttention(
            query_size, key_size, 16, dropout=0.1
        ), embedding_size=8, hidden_size=16,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="seq2seq.kernels"):
        accelerate(model)
    assert any("attention.dropout=0.1 drops" in record.getMessage() for record in caplog.records)


def test_the_kernels_say_how_an_input_fed_decoder_steps(
    caplog: pytest.LogCaptureFixture,
) -> None:
    say_once.cache_clear()
    with caplog.at_level(logging.INFO, logger="seq2seq.kernels"):
        model, _ = models("luong", "dot", "auto", ["model.input_feeding=true"])
    assert is_accelerated(model.encoder) and is_accelerated(model.decoder)
    assert any("input_feeding=true" in record.getMessage() for record in caplog.records)


def test_own_formula_names_the_overridden_methods() -> None:
    assert own_formula(DotProductAttention()) is None
    assert own_formula(CosineDot()) == "CosineDot overrides DotProductAttention.score"
    # With parts, still the score: the parts have C twins, the user's score has none.
    with_parts = CosineDot().use_parts(AttentionParts(normalizer="sparsemax"), 16)
    assert own_formula(with_parts) == "CosineDot overrides DotProductAttention.score"


class UniformWeights(DotProductAttention):
    """Overrides only how the logits become weights: every real key the same weight."""

    def normalize(
        self,
        logits: torch.Tensor,
        queries: torch.Tensor,
        valid_lens: torch.Tensor | None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return super().normalize(torch.zeros_like(logits), queries, valid_lens, positions)


def test_a_normalize_of_ones_own_keeps_the_reference_path() -> None:
    """A fast path computing scaled dot products with softmax would ignore the override."""
    assert own_formula(UniformWeights()) == "UniformWeights overrides DotProductAttention.normalize"
    model = accelerate(
        Seq2Seq(
            13,
            11,
            attention=lambda query_size, key_size: UniformWeights(),
            embedding_size=8,
            hidden_size=16,
        )
    )
    src, src_lens = torch.randint(4, 13, (3, 5)), torch.tensor([5, 3, 1])
    with torch.no_grad():
        _, weights = model(src, src_lens, torch.full((3, 4), 2))  # (B, T, V), (B, T, S)
    real = torch.arange(5)[None, None, :] < src_lens[:, None, None]
    expected = real / src_lens[:, None, None]
    torch.testing.assert_close(weights, expected.expand_as(weights).to(weights.dtype))


class DoubledPreactivations(AdditiveAttention):
    """Overrides a helper of ``score`` rather than ``score`` itself: tanh(2 (W_q q + W_k k))."""

    def preactivations(self, queries: Tensor, projected_keys: Tensor) -> Tensor:
        return 2.0 * super().preactivations(queries, projected_keys)


class TripledHeads(MultiHeadAttention):
    """A multi-head block whose own ``forward`` scales the context."""

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        valid_lens: Tensor | None = None,
        *,
        projected_keys: Tensor | None = None,
        projected_values: Tensor | None = None,
        need_weights: bool = True,
        positions: Tensor | None = None,
        coverage: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        context, weights = super().forward(
            queries, keys, values, valid_lens, projected_keys=projected_keys,
            projected_values=projected_values, need_weights=need_weights, positions=positions,
            coverage=coverage,
        )  # fmt: skip
        return 3.0 * context, weights


class DoubledEntmax(Entmax):
    """α-entmax of 2z: the built-in's α, another function."""

    def forward(self, logits: Tensor, is_valid: Tensor | None) -> Tensor:
        return super().forward(2.0 * logits, is_valid)


class ReversedLinear(nn.Linear):
    """A linear map of its own inside a built-in scoring function (its W_q): W x + b with its
    features in reverse order."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x).flip(-1)


class ScaledProjection(nn.Module):
    """Not a subclass of anything the kernels know, with a linear map's ``weight`` and ``bias``
    (which a fast path could read): 5 (W x + b) + 1."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: Tensor) -> Tensor:
        return 5.0 * F.linear(x, self.weight, self.bias) + 1.0


def own_module(kind: str, own: bool = True) -> Seq2Seq:
    """A reference model (hidden size 16) with one module of a user's own inside its attention:
    ``kind`` names which (the scoring function's helper, the multi-head block, the normalizer,
    a linear map); without ``own`` the same model with the built-in module."""
    torch.manual_seed(0)
    heads = 2 if kind == "heads" else 1
    parts = AttentionParts(normalizer="entmax", alpha=1.3) if kind == "normalizer" else None
    model = Seq2Seq(
        13, 11, attention=lambda query_size, key_size: AdditiveAttention(query_size, key_size, 16),
        embedding_size=8, hidden_size=16, dropout=0.0, num_heads=heads, attention_parts=parts,
    )  # fmt: skip
    attention = model.decoder.attention
    if not own:
        return model
    if kind == "preactivations":
        attention.__class__ = DoubledPreactivations
    elif kind == "heads":
        attention.__class__ = TripledHeads
    elif kind == "normalizer":
        attention.normalization.normalizer.__class__ = DoubledEntmax
    elif kind == "linear":
        attention.W_q.__class__ = ReversedLinear
    else:
        attention.W_q = ScaledProjection(attention.W_q)
    return model


OWN_MODULES = {
    "preactivations": "DoubledPreactivations overrides AdditiveAttention.preactivations",
    "heads": "TripledHeads overrides MultiHeadAttention.forward",
    "normalizer": "DoubledEntmax overrides Entmax.forward",
    "linear": "ReversedLinear overrides Linear.forward",
    "foreign": "ScaledProjection is a module of your own inside the attention",
}


@pytest.mark.parametrize("kind", list(OWN_MODULES))
def test_a_module_of_ones_own_anywhere_in_the_attention_keeps_the_reference_path(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Not only ``score``: a helper it calls, the multi-head block, the normalizer or a linear
    map redefined by a subclass is what the model computes with the kernels on (the C twins
    would compute the built-in's), and the message names it."""
    reference = own_module(kind)
    assert own_formula(reference.decoder.attention) == OWN_MODULES[kind]
    say_once.cache_clear()
    with caplog.at_level(logging.INFO, logger="seq2seq.kernels"):
        fast = accelerate(copy.deepcopy(reference))
    assert any(OWN_MODULES[kind] in record.getMessage() for record in caplog.records)
    assert_computes_as_the_reference(reference, fast, own_module(kind, False))


def assert_computes_as_the_reference(reference: Seq2Seq, fast: Seq2Seq, unchanged: Seq2Seq) -> None:
    """``fast`` (accelerated) trains, attends and decodes as ``reference`` does, on the
    reference path (no C parts for its attention), and ``unchanged`` (the built-in model)
    attends differently: what the user changed is what is computed."""
    decoder = fast.decoder  # the reference's own where its parts have no fast path at all
    assert not isinstance(decoder, FastDecoder) or decoder.step_parts() is None
    src, src_lens = torch.randint(4, 13, (3, 5)), torch.tensor([5, 3, 1])
    tgt = torch.randint(4, 11, (3, 4))
    tgt_lens = torch.tensor([4, 2, 3])
    tgt_out = tgt.masked_fill(torch.arange(4)[None] >= tgt_lens[:, None], 0)
    losses = [
        teacher_forced_loss(model, DecoderLoss(model.decoder), src, src_lens, tgt, tgt_out)
        for model in (reference, fast)
    ]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        weights = [model(src, src_lens, tgt)[1] for model in (reference, fast, unchanged)]
    torch.testing.assert_close(weights[1], weights[0], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(weights[2], weights[0])  # the change changes what is computed
    with torch.no_grad():  # the C greedy loop too stands aside
        searches = [
            greedy_search(model, src, src_lens, BOS_ID, EOS_ID, PAD_ID, max_len_b=3)
            for model in (reference, fast)
        ]
    assert torch.equal(searches[1].tokens, searches[0].tokens)
    torch.testing.assert_close(searches[1].attention, searches[0].attention, rtol=1e-5, atol=1e-6)


def doubled_score(self: Attention, queries: Tensor, projected_keys: Tensor) -> Tensor:
    """A function of a user's own for an instance's ``score``: twice the class's."""
    return 2.0 * type(self).score(self, queries, projected_keys)


def plain_model(decoder: str) -> Seq2Seq:
    """A built-in reference model (hidden size 16): the Bahdanau decoder with additive
    attention, or the Luong decoder with dot products (its own C product paths)."""
    if decoder == "bahdanau":
        return own_module("preactivations", False)
    torch.manual_seed(0)
    return Seq2Seq(
        13, 11, attention=lambda query_size, key_size: DotProductAttention(),
        embedding_size=8, hidden_size=16, dropout=0.0, decoder=LuongDecoder,
    )  # fmt: skip


def change_in_place(model: Seq2Seq, kind: str) -> None:
    """What a notebook does to a built model's attention: assign its ``score``, or hook its
    W_q (the hook's output, 2 W_q s, replaces the call's)."""
    attention = model.decoder.attention
    if kind == "assigned":
        attention.score = types.MethodType(doubled_score, attention)
    else:
        attention.W_q.register_forward_hook(lambda module, inputs, output: 2.0 * output)


IN_PLACE = {
    ("bahdanau", "assigned"): "a function of your own is assigned to AdditiveAttention.score "
    "on the instance",
    ("bahdanau", "hook"): "W_q (Linear) inside the attention has a forward hook of your own",
    ("luong", "assigned"): "a function of your own is assigned to DotProductAttention.score on "
    "the instance",
}


@pytest.mark.parametrize(("decoder", "kind"), list(IN_PLACE))
def test_a_function_assigned_or_a_hook_after_building_keeps_the_reference_path(
    decoder: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Changed after the model was built and accelerated, as a notebook would: the C kernels
    would skip an instance's own ``score`` or a hook, so the next call runs on the reference
    path, says so once and names the change."""
    reference = plain_model(decoder)
    fast = accelerate(copy.deepcopy(reference))
    assert isinstance(fast.decoder, FastDecoder) and fast.decoder.step_parts() is not None
    for model in (reference, fast):
        change_in_place(model, kind)
    message = IN_PLACE[decoder, kind]
    assert own_formula(fast.decoder.attention) == message
    say_once.cache_clear()
    with caplog.at_level(logging.INFO, logger="seq2seq.kernels"):
        assert_computes_as_the_reference(reference, fast, plain_model(decoder))
    assert len([record for record in caplog.records if message in record.getMessage()]) == 1
