"""seq2seq.kernels.bahdanau: the Bahdanau recurrence as one node computes the decoder's function
and its gradients.

References: the recurrence written out in float64 from the formulas (Bahdanau et al.'s
``w_vᵀ tanh(W_q s + W_k k)``, ``masked_softmax``, ``torch.gru_cell``), and the decoder's own
step loop through autograd (the reference), also in float64, so that the comparisons
measure the fused float32 path's error.

Shape legend: B batch, S source length, T target length, H hidden size, M memory size, A
attention hidden size, G gates (3H).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from allpairspy import AllPairs
from torch import Tensor, nn

from seq2seq.attention import (
    AdditiveAttention,
    AttentionParts,
    DotProductAttention,
    GeneralAttention,
    masked_softmax,
)
from seq2seq.kernels import accelerate, library
from seq2seq.kernels import reference as to_reference
from seq2seq.kernels.attention_parts import StepAttention, attend
from seq2seq.kernels.bahdanau import Recurrence
from seq2seq.kernels.modules import FastBahdanauDecoder, FastDecoder
from seq2seq.models.decoder import BahdanauDecoder, LuongDecoder
from seq2seq.models.model import Seq2Seq
from seq2seq.search import beam_search, greedy_search
from seq2seq.training.loss import alignment_loss, coverage_loss, loss_with_weights
from tests.test_model import BOS, EOS, PAD, make_batch

pytestmark = pytest.mark.skipif(
    library.library() is None, reason=f"no fused kernels here: {library.unavailable_reason()}"
)
ADDITIVE = StepAttention("additive", 1.0)


def fused_additive(*inputs: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """``Recurrence`` with plain additive attention and softmax, as ``reference`` computes."""
    query_weight, query_bias, score_weight, context_weight, weight_hh, bias_hh = inputs[5:]
    return Recurrence.apply(
        *inputs[:5],
        query_weight,
        query_bias,
        None,  # no heads' W_q
        None,
        score_weight,
        *[None] * 7,  # no key bias, α, T, coverage or local-p
        context_weight,
        weight_hh,
        bias_hh,
        ADDITIVE,
    )


def reference(
    input_gates: Tensor,
    initial: Tensor,
    keys: Tensor,
    memory: Tensor,
    src_lens: Tensor,
    query_weight: Tensor,
    query_bias: Tensor | None,
    score_weight: Tensor,
    context_weight: Tensor,
    weight_hh: Tensor,
    bias_hh: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The T steps from the formulas: states (B, T, H), contexts (B, T, M), weights (B, T, S)."""
    state, states, contexts, weights = initial, [], [], []
    for t in range(input_gates.shape[1]):
        query = F.linear(state, query_weight, query_bias)  # (B, A)
        scores = torch.tanh(query[:, None, :] + keys) @ score_weight[0]  # (B, S)
        step_weights = masked_softmax(scores[:, None, :], src_lens)[:, 0]  # (B, S)
        context = torch.bmm(step_weights[:, None, :], memory)[:, 0]  # (B, M)
        # W_ie e + b_ih comes in input_gates, so the cell's own input bias is that row.
        state = torch.gru_cell(
            context, state, context_weight, weight_hh, input_gates[:, t], bias_hh
        )
        states.append(state)
        contexts.append(context)
        weights.append(step_weights)
    return torch.stack(states, 1), torch.stack(contexts, 1), torch.stack(weights, 1)


def random_inputs(
    batch: int, keys: int, steps: int, size: int, memory_size: int, attention_size: int,
    biases: bool, seed: int = 0,
) -> list[Tensor | None]:  # fmt: skip
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 1.0) -> Tensor:
        return torch.randn(*shape, generator=generator) * scale

    gates = 3 * size
    # Lengths from 0 (an empty source: zero weights and context) to S; longer is clamped to S.
    src_lens = torch.tensor([0, keys, 1, keys + 3, *range(2, batch - 2)])[:batch] % (keys + 4)
    return [
        rand(batch, steps, gates),
        rand(batch, size, scale=0.5),
        rand(batch, keys, attention_size),
        rand(batch, keys, memory_size),
        src_lens,
        rand(attention_size, size, scale=0.5),
        rand(attention_size) if biases else None,
        rand(1, attention_size),
        rand(gates, memory_size, scale=0.3),
        rand(gates, size, scale=0.3),
        rand(gates) if biases else None,
    ]


def outputs_and_grads(
    function: object, inputs: list[Tensor | None], use_contexts: bool = True
) -> list[Tensor]:
    """The outputs and the gradient of a loss of them with respect to every float input."""
    leaves = [x.requires_grad_() for x in inputs if x is not None and x.is_floating_point()]
    states, contexts, weights = function(*inputs)  # type: ignore[operator]
    ramp = torch.linspace(-1, 1, states.numel(), dtype=states.dtype).view(states.shape)
    loss = (states.sin() * ramp).sum()
    if use_contexts:
        loss = loss + (contexts * contexts.cos()).sum()
    # A loss that reads the weights too (alignment, coverage): exp, so that no row's
    # gradient is constant (a softmax ignores that).
    loss = loss + weights.exp().sum()
    grads = torch.autograd.grad(loss, leaves)
    return [states.detach(), contexts.detach(), weights.detach(), *grads]


def as_float64(inputs: list[Tensor | None]) -> list[Tensor | None]:
    return [x.detach().double() if x is not None and x.is_floating_point() else x for x in inputs]


@pytest.mark.parametrize("biases", [True, False])
@pytest.mark.parametrize("use_contexts", [True, False])  # contexts unused: no gradient for them
def test_recurrence_matches_the_formulas_and_their_gradients(
    biases: bool, use_contexts: bool
) -> None:
    inputs = random_inputs(
        6, keys=5, steps=4, size=7, memory_size=6, attention_size=9, biases=biases
    )
    got = outputs_and_grads(fused_additive, inputs, use_contexts)
    want = outputs_and_grads(reference, as_float64(inputs), use_contexts)
    for fused, expected in zip(got, want, strict=True):
        torch.testing.assert_close(fused, expected.float(), rtol=1e-4, atol=1e-5)
    contexts, weights = got[1:3]
    # Row 0 has no valid key: zero weights and contexts, finite everything.
    assert (weights[0] == 0).all() and (contexts[0] == 0).all()
    assert all(torch.isfinite(tensor).all() for tensor in got)
    # Padding keys get weight exactly 0, and the other weights of a step sum to 1.
    assert (weights[2, :, 1:] == 0).all()
    torch.testing.assert_close(weights[1:].sum(-1), torch.ones(5, 4))


@pytest.mark.usefixtures("two_threads")
def test_rows_split_over_threads_compute_the_same() -> None:
    """B·S·A large enough for the C passes to split the sentences over two threads."""
    inputs = random_inputs(
        64, keys=16, steps=3, size=8, memory_size=8, attention_size=32, biases=True
    )
    got = outputs_and_grads(fused_additive, inputs)
    want = outputs_and_grads(reference, as_float64(inputs))
    for fused, expected in zip(got, want, strict=True):
        torch.testing.assert_close(fused, expected.float(), rtol=1e-4, atol=1e-5)


def make_bahdanau(bias: bool = False, cell_bias: bool = True, **attention: object) -> Seq2Seq:
    """An accelerated Bahdanau model with additive attention, in training mode."""
    torch.manual_seed(0)
    model = Seq2Seq(
        src_vocab_size=13,
        tgt_vocab_size=11,
        attention=partial(AdditiveAttention, num_hiddens=12, bias=bias, **attention),
        embedding_size=8,
        hidden_size=16,
        dropout=0.0,
        cell=partial(nn.GRUCell, bias=cell_bias),
        decoder=BahdanauDecoder,
    ).train()
    accelerate(model)
    return model


@pytest.mark.parametrize(("bias", "cell_bias"), [(False, True), (True, False)])
def test_the_decoder_trains_as_its_step_loop_does(bias: bool, cell_bias: bool) -> None:
    """Seq2Seq's teacher-forced loss and every parameter's gradient: the fused recurrence in
    float32 against the decoder's own step loop through autograd in float64."""
    src, src_lens, tgt_in = make_batch()
    model = make_bahdanau(bias, cell_bias)
    reference_model = to_reference(copy.deepcopy(model).double())
    results = []
    source, state = model.encode(src, src_lens)
    assert isinstance(model.decoder, FastBahdanauDecoder)
    assert model.decoder.fused_recurrence_applies(source, state[0])
    for candidate in (model, reference_model):
        logits, weights = candidate(src, src_lens, tgt_in, need_weights=False)
        assert weights is None
        loss = logits.log_softmax(-1).sum()
        grads = torch.autograd.grad(loss, list(candidate.parameters()))
        results.append([loss.detach(), *grads])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=1e-5)


def test_without_autograd_the_weights_come_from_the_fused_pass() -> None:
    """Validation (no_grad, weights wanted) takes the fused path; weights and logits agree."""
    src, src_lens, tgt_in = make_batch()
    model = make_bahdanau().eval()
    results = []
    with torch.no_grad():
        for fused in (True, False):
            if not fused:
                to_reference(model)
            source, state = model.encode(src, src_lens)
            if fused:
                assert isinstance(model.decoder, FastBahdanauDecoder)
                assert model.decoder.fused_recurrence_applies(source, state[0])
            results.append(model(src, src_lens, tgt_in))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("change", "applies"),
    [
        ({}, True),
        ({"layer_norm": True}, True),
        ({"temperature": "learnable"}, True),
        ({"temperature": 2.0}, True),
        ({"dropout": 0.2}, False),  # in training; evaluation has no dropout to apply
    ],
)
def test_the_fused_path_applies_only_to_the_plain_form(change: dict, applies: bool) -> None:
    src, src_lens, _ = make_batch()
    model = make_bahdanau(**change)
    assert isinstance(model.decoder, FastBahdanauDecoder)
    source, state = model.encode(src, src_lens)
    assert model.decoder.fused_recurrence_applies(source, state[0]) is applies
    model.eval()
    assert model.decoder.fused_recurrence_applies(source, state[0])
    double = make_bahdanau(**change).double()
    assert isinstance(double.decoder, FastBahdanauDecoder)
    source, state = double.encode(src, src_lens)
    assert not double.decoder.fused_recurrence_applies(source, state[0])


@pytest.mark.parametrize("group", [1, 3])  # one query per sentence (greedy), three (beam search)
@pytest.mark.parametrize("bias", [True, False])
def test_decoding_attention_matches_the_formulas(group: int, bias: bool) -> None:
    """``attend``: each of the R = B·group queries against its own sentence's keys."""
    inputs = random_inputs(6, keys=5, steps=1, size=7, memory_size=6, attention_size=9, biases=bias)
    _, _, keys, memory, src_lens, query_weight, query_bias, score_weight = inputs[:8]
    assert keys is not None and memory is not None and src_lens is not None
    assert query_weight is not None and score_weight is not None
    queries = torch.randn(6 * group, 7)
    contexts, weights = attend(
        ADDITIVE, queries, keys, memory, src_lens, query_weight, query_bias, score_weight
    )
    rows = torch.arange(6 * group) // group  # each query's sentence
    scores = torch.tanh(F.linear(queries, query_weight, query_bias)[:, None] + keys[rows])
    want = masked_softmax((scores @ score_weight[0])[:, None], src_lens[rows])[:, 0]
    torch.testing.assert_close(weights, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(contexts, torch.bmm(want[:, None], memory[rows])[:, 0])


def test_searches_decode_the_same_with_and_without_the_kernels() -> None:
    """Greedy and beam search on one model, with the fused attention step and the module's own."""
    model = make_bahdanau(bias=True).eval()
    decoder = model.decoder
    assert isinstance(decoder, FastBahdanauDecoder)
    assert_searches_agree(model, lambda source, state: decoder.fused_attention_applies(source, 12))


def assert_searches_agree(model: Seq2Seq, uses_kernels: Callable[[Any, Tensor], bool]) -> None:
    """Greedy and beam 5 with the accelerated ``model`` and its reference: the same tokens and
    lengths, beam scores and attention within float rounding. ``uses_kernels(source, state)``
    must hold for the accelerated one."""
    src, src_lens, _ = make_batch()
    results = []
    with torch.no_grad():
        for fused in (True, False):
            if fused:
                source, state = model.encode(src, src_lens)
                assert uses_kernels(source, state[0])
            else:
                to_reference(model)
            greedy = greedy_search(model, src, src_lens, BOS, EOS, PAD, max_len_a=1.0, max_len_b=3)
            beam = beam_search(model, src, src_lens, BOS, EOS, PAD, beam_size=5, n_best=2)
            results.append((greedy, beam))
    (greedy, beam), (greedy_aten, beam_aten) = results
    for got, want in ((greedy, greedy_aten), (beam, beam_aten)):
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.lengths, want.lengths)
        # Within float32 rounding, which coverage sums over the steps.
        torch.testing.assert_close(got.attention, want.attention, rtol=1e-4, atol=5e-5)
    torch.testing.assert_close(beam.scores, beam_aten.scores, rtol=1e-5, atol=1e-5)


SCORING = {
    "additive": partial(AdditiveAttention, num_hiddens=12, bias=True),
    "dot": partial(DotProductAttention, scaled=False),
    "scaled_dot": DotProductAttention,
    "general": GeneralAttention,
    "additive_T2": partial(AdditiveAttention, num_hiddens=12, temperature=2.0),
    "scaled_dot_T0.5": partial(DotProductAttention, temperature=0.5),
    "additive_learned_T": partial(
        AdditiveAttention, num_hiddens=12, temperature="learnable", initial_temperature=0.7
    ),
    "additive_layer_norm": partial(AdditiveAttention, num_hiddens=12, bias=True, layer_norm=True),
    "general_learned_T": partial(
        GeneralAttention, temperature="learnable", initial_temperature=1.5
    ),
}


# The parts with C twins, each alone and in pairs: the key bias covers 4 of the batch's 5
# source positions (the 5th gets none, as past the table in the reference).
PARTS = {
    "softmax": AttentionParts(),
    "sparsemax": AttentionParts(normalizer="sparsemax"),
    "entmax15": AttentionParts(normalizer="entmax15"),
    "key_bias": AttentionParts(key_bias=True, key_bias_positions=4),
    "sparsemax+key_bias": AttentionParts("sparsemax", key_bias=True, key_bias_positions=4),
    "entmax15+key_bias": AttentionParts("entmax15", key_bias=True, key_bias_positions=4),
    "entmax_1.3": AttentionParts("entmax", alpha=1.3),
    "learned_alpha+key_bias": AttentionParts(
        "entmax", alpha="learnable", initial_alpha=1.6, key_bias=True, key_bias_positions=4
    ),
    "local_m": AttentionParts(window="local_m", window_size=1),
    "sparsemax+local_m": AttentionParts("sparsemax", window="local_m", window_size=1),
    "local_m+key_bias": AttentionParts(
        window="local_m", window_size=1, key_bias=True, key_bias_positions=4
    ),
    "learned_alpha+local_m": AttentionParts(
        "entmax", alpha="learnable", window="local_m", window_size=1
    ),
    "local_p": AttentionParts(window="local_p", window_size=1),
    "entmax15+local_p+key_bias": AttentionParts(
        "entmax15", window="local_p", window_size=2, key_bias=True, key_bias_positions=4
    ),
    "coverage": AttentionParts(coverage=True),
    "coverage+sparsemax": AttentionParts("sparsemax", coverage=True),
    "coverage+local_m+key_bias": AttentionParts(
        window="local_m", window_size=1, key_bias=True, key_bias_positions=4, coverage=True
    ),
    "coverage+learned_alpha": AttentionParts("entmax", alpha="learnable", coverage=True),
}


DECODERS = {"bahdanau": BahdanauDecoder, "luong": LuongDecoder}


def make_composed(
    scoring: str,
    parts: AttentionParts,
    decoder: str = "bahdanau",
    input_feeding: bool = False,
    num_heads: int = 1,
) -> Seq2Seq:
    """An accelerated model (hidden and memory size 16, so that dot products need no key
    projection) with ``scoring``, ``parts``, ``decoder`` and ``num_heads``, in training mode,
    its parts composed; a key bias and coverage weight start random (at 0 they would not show
    in the forward pass)."""
    torch.manual_seed(0)
    model = Seq2Seq(
        src_vocab_size=13, tgt_vocab_size=11, attention=SCORING[scoring], embedding_size=8,
        hidden_size=16, encoder_hidden_size=8, dropout=0.0, decoder=DECODERS[decoder],
        attention_parts=parts, input_feeding=input_feeding, num_heads=num_heads,
    ).train()  # fmt: skip
    for name, parameter in model.named_parameters():
        if name.endswith(("key_bias.bias", "coverage_weight")):
            torch.nn.init.normal_(parameter)
    accelerate(model)
    assert isinstance(model.decoder, FastDecoder) and model.decoder.step_parts()
    return model


@pytest.mark.parametrize("decoder", list(DECODERS))
@pytest.mark.parametrize("parts", list(PARTS))
@pytest.mark.parametrize("scoring", list(SCORING))
def test_every_scoring_and_part_trains_and_decodes_as_the_reference(
    scoring: str, parts: str, decoder: str
) -> None:
    """Each part with each scoring function, in both decoders."""
    assert_composed_matches_the_reference(make_composed(scoring, PARTS[parts], decoder))


def pairwise_parts() -> list[Any]:
    """A covering set of every pair of the attention's choices (allpairspy): decoder, scoring,
    normalizer, window, key bias, coverage and input feeding (the Luong decoder's only) ->
    (decoder, scoring, parts, input_feeding) cases."""
    normalizers: dict[str, dict[str, Any]] = {
        "softmax": {},
        "sparsemax": {"normalizer": "sparsemax"},
        "entmax15": {"normalizer": "entmax15"},
        "entmax_1.3": {"normalizer": "entmax", "alpha": 1.3},
        "learned_alpha": {"normalizer": "entmax", "alpha": "learnable", "initial_alpha": 1.6},
    }
    choices = [
        list(DECODERS), list(SCORING), list(normalizers), ["global", "local_m", "local_p"],
        [False, True], [False, True], [False, True],
    ]  # fmt: skip

    def valid(row: list[Any]) -> bool:
        return not (len(row) > 6 and row[6] and row[0] != "luong")

    cases = []
    for decoder, scoring, normalizer, window, key_bias, coverage, feeding in AllPairs(
        choices, filter_func=valid
    ):
        parts = AttentionParts(
            **normalizers[normalizer], window=window, window_size=1 if window != "global" else None,
            key_bias=key_bias, key_bias_positions=4 if key_bias else None, coverage=coverage,
        )  # fmt: skip
        named = (key_bias, "key_bias"), (coverage, "coverage"), (feeding, "input_feeding")
        name = "-".join([decoder, scoring, normalizer, window, *(n for on, n in named if on)])
        cases.append(pytest.param(decoder, scoring, parts, feeding, id=name))
    return cases


@pytest.mark.parametrize(("decoder", "scoring", "parts", "input_feeding"), pairwise_parts())
def test_every_pair_of_choices_trains_and_decodes_as_the_reference(
    decoder: str, scoring: str, parts: AttentionParts, input_feeding: bool
) -> None:
    """Every pair of choices at least once (a generated covering set, not a hand-picked one)."""
    model = make_composed(scoring, parts, decoder, input_feeding)
    assert_composed_matches_the_reference(model)


# Several heads (model.num_heads = 2, heads of size 8): each scoring function with the parts
# a head treats its own way (coverage per head, local-p's centre from the query before its
# projection, a learned α shared by the heads).
HEAD_PARTS = ["softmax", "sparsemax+key_bias", "learned_alpha+local_m", "local_p", "coverage"]


@pytest.mark.parametrize("decoder", list(DECODERS))
@pytest.mark.parametrize("parts", HEAD_PARTS)
@pytest.mark.parametrize("scoring", ["additive", "scaled_dot", "general_learned_T"])
def test_several_heads_train_and_decode_as_the_reference(
    scoring: str, parts: str, decoder: str
) -> None:
    model = make_composed(scoring, PARTS[parts], decoder, num_heads=2)
    assert model.decoder.step_parts().heads == 2
    assert_composed_matches_the_reference(model)


@pytest.mark.parametrize("parts", ["softmax", "coverage"])
def test_several_heads_with_input_feeding_train_and_decode_as_the_reference(parts: str) -> None:
    model = make_composed("scaled_dot", PARTS[parts], "luong", input_feeding=True, num_heads=2)
    assert_composed_matches_the_reference(model)


@pytest.mark.parametrize(
    ("decoder", "parts", "input_feeding", "num_heads"),
    [
        ("bahdanau", "softmax", False, 1),
        ("bahdanau", "coverage+sparsemax", False, 1),
        ("bahdanau", "local_p", False, 2),
        ("luong", "coverage", False, 1),
        ("luong", "sparsemax", True, 1),
        ("luong", "key_bias", False, 1),
    ],
)
def test_the_losses_on_the_weights_train_from_the_packed_pass(
    decoder: str, parts: str, input_feeding: bool, num_heads: int
) -> None:
    """The guided-alignment and coverage losses read the weights: the C loops give them from the
    pass over the real tokens only (zeros at the padded steps, which those losses skip). The
    token, alignment and coverage losses and every gradient equal the reference's whole-grid
    pass, in float32 against float64."""
    model = make_composed("additive", PARTS[parts], decoder, input_feeding, num_heads)
    reference_model = to_reference(copy.deepcopy(model).double())
    src, src_lens, tgt_in = make_batch()
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full((3, 1), EOS)], dim=1)
    tgt_out[1, 3:] = PAD  # sentences of mixed lengths
    gold = torch.zeros(3, tgt_in.shape[1], src.shape[1])
    gold[0, 0, 1] = gold[0, 2, 0] = gold[1, 1, 1] = gold[2, 3, 2] = 1.0
    results = []
    for candidate in (model, reference_model):
        token_loss, weights = loss_with_weights(candidate, src, src_lens, tgt_in, tgt_out)
        total = token_loss + alignment_loss(weights, gold) + coverage_loss(weights, tgt_out != PAD)
        grads = torch.autograd.grad(total, list(candidate.parameters()))
        results.append([total.detach(), *grads])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=5e-5)


def assert_composed_matches_the_reference(model: Seq2Seq) -> None:
    """Kernels auto against off from the same weights: the teacher-forced loss (over the real
    tokens, as training computes it) and every parameter's gradient in float32 against the
    reference in float64; validation's weights, exactly 0 where the reference's are; greedy
    and beam search's tokens."""
    src, src_lens, tgt_in = make_batch()
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full((3, 1), EOS)], dim=1)
    tgt_out[1, 3:] = PAD  # sentences of mixed lengths
    reference_model = to_reference(copy.deepcopy(model).double())
    decoder = model.decoder
    assert isinstance(decoder, FastDecoder)
    results = []
    for candidate in (model, reference_model):
        source, state = candidate.encode(src, src_lens)
        if candidate is model:
            assert decoder.fused_attention_applies(source, len(src))
            if isinstance(decoder, FastBahdanauDecoder):
                assert decoder.fused_recurrence_applies(source, state[0])
        logits, targets = candidate.decoder.teacher_forced_logits(tgt_in, tgt_out, state, source)
        if candidate is model:  # the attention ran through the parts' C twins
            fused = ("PartsAttention", "Recurrence", "PackedProductAttention")
            if getattr(decoder, "is_sequential", False):  # input feeding or coverage in Luong
                # coverage alone: the cell first, then only the attention step by step
                fused = ("SequentialRecurrence",) if decoder.input_feeding else ("AttentionLoop",)
            assert graph_has(logits, fused)
        loss = F.cross_entropy(logits, targets, ignore_index=PAD, reduction="sum")
        grads = torch.autograd.grad(loss, list(candidate.parameters()))
        results.append([loss.detach(), *grads])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=1e-5)
    # Training with the weights in the loss (the alignment and coverage losses read them).
    results = []
    for candidate in (model, reference_model):
        logits, weights = candidate(src, src_lens, tgt_in)
        loss = logits.log_softmax(-1).sum() + (weights * weights.new_tensor(0.3).exp()).sum()
        loss = loss + weights.square().sum()
        results.append(torch.autograd.grad(loss, list(candidate.parameters())))
    # The weights' own loss adds float32 rounding through every step's weights (and, with
    # coverage, through their running sum): 1.1e-5 was seen on a gradient entry of 5e-3.
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=5e-5)
    model.eval()
    with torch.no_grad():
        _, weights = model(src, src_lens, tgt_in)
        _, want_weights = reference_model.eval()(src, src_lens, tgt_in)
    torch.testing.assert_close(weights, want_weights.float(), rtol=1e-4, atol=1e-5)
    # The masking contract: exact zeros where the reference has them (a sparse normalizer's,
    # a window's), at sentence 1's padding, and within local-m's window 1 around
    # p_t = min(t, S_b - 1) (step 4 of sentence 0).
    assert torch.equal(weights == 0, want_weights == 0) or not has_exact_zeros(model)
    assert (weights[1, :, 2:] == 0).all()
    window = getattr(model.decoder.attention.normalization, "window", None)
    if window is not None and window.kind == "local_m" and window.size == 1:
        assert (weights[0, 4, :3] == 0).all() and (weights[0, 4, 3:] > 0).any()
    assert_searches_agree(model, lambda source, state: decoder.fused_attention_applies(source, 3))


def has_exact_zeros(model: Seq2Seq) -> bool:
    """Whether the weights' zeros are exact by construction (a sparse normalizer or a window)
    rather than a softmax's underflow, which float32 and float64 reach at different logits."""
    parts = model.decoder.attention.normalization
    return parts is not None and (parts.window is not None or parts.alpha != 1.0)


def graph_has(output: Tensor, names: tuple[str, ...]) -> bool:
    """Whether ``output``'s autograd graph has a node whose class name starts with one of
    ``names``."""
    seen, pending = set(), [output.grad_fn]
    while pending:
        node = pending.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__.startswith(names):
            return True
        pending.extend(next_node for next_node, _ in node.next_functions)
    return False
