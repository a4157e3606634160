"""The seam: accelerated models compute what the reference computes.

The same weights go through the reference model (``seq2seq.models``, plain PyTorch) and through
its accelerated copy (``seq2seq.kernels.accelerate``), for both decoders, every scoring
function, GRU and LSTM cells: the training loss and every gradient, the validation pass's logits
and attention weights, and the tokens greedy and beam search decode. Where the library cannot be
built, the accelerated modules fall back to the reference and the test still compares them.

Shape legend: B batch, S source length, T target length, V vocabulary.
"""

from __future__ import annotations

import copy
import warnings
from functools import partial

import pytest
import torch
from torch import Tensor

from seq2seq.attention import AdditiveAttention
from seq2seq.kernels import accelerate, is_accelerated, reference, reference_path
from seq2seq.kernels.library import blas_sgemm, library, unavailable_reason
from seq2seq.kernels.modules import (
    ACCELERATED,
    DecodingSource,
    FastAdditiveAttention,
    FastBahdanauDecoder,
    FastDecoder,
    FastLuongDecoder,
    FastRNNEncoder,
    FastSeq2Seq,
)
from seq2seq.models.model import Seq2Seq
from seq2seq.search import GreedyTask, beam_search, greedy_search
from seq2seq.training.loss import decoder_loss, teacher_forced_loss
from tests.test_model import ATTENTIONS, BOS, DECODERS, EOS, PAD, make_batch, make_model

CELLS = ["gru", "lstm"]


def training_batch() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """src (4, 7) with lengths 7, 3, 5, 1 and targets of 6, 2, 4 and 3 tokens, padded."""
    generator = torch.Generator().manual_seed(3)
    src_lens, tgt_lens = torch.tensor([7, 3, 5, 1]), torch.tensor([6, 2, 4, 3])
    src = torch.randint(4, 13, (4, 7), generator=generator)
    src[torch.arange(7)[None, :] >= src_lens[:, None]] = PAD
    words = torch.randint(4, 11, (4, 6), generator=generator)
    positions = torch.arange(6)[None, :]
    tgt_out = torch.where(positions < tgt_lens[:, None] - 1, words, PAD)
    tgt_out[torch.arange(4), tgt_lens - 1] = EOS
    tgt_in = torch.cat([torch.full((4, 1), BOS), tgt_out[:, :-1]], dim=1)
    tgt_in[tgt_out == PAD] = PAD
    return src, src_lens, tgt_in, tgt_out


def pair(attention: str, decoder: str, cell: str) -> tuple[Seq2Seq, Seq2Seq]:
    """The reference model and an accelerated copy with the same weights (dropout off, so that
    both compute one function)."""
    plain = make_model(attention, cell == "lstm", decoder, dropout=0.0)
    fast = accelerate(copy.deepcopy(plain))
    assert isinstance(fast, Seq2Seq) and is_accelerated(fast) and not is_accelerated(plain)
    return plain, fast


def assert_close_lists(got: list[Tensor], want: list[Tensor], rtol: float, atol: float) -> None:
    assert len(got) == len(want)
    for got_tensor, want_tensor in zip(got, want, strict=True):
        torch.testing.assert_close(got_tensor, want_tensor, rtol=rtol, atol=atol)


def training_results(model: Seq2Seq) -> list[Tensor]:
    """The loss the training step takes, and every parameter's gradient."""
    model.train()
    src, src_lens, tgt_in, tgt_out = training_batch()
    decode = partial(decoder_loss, model.decoder)
    loss = teacher_forced_loss(model, decode, src, src_lens, tgt_in, tgt_out)
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    return [loss.detach()] + [g if g is not None else torch.zeros(()) for g in grads]


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("attention", list(ATTENTIONS))
@pytest.mark.parametrize("decoder", list(DECODERS))
def test_training_loss_and_gradients_are_the_references(
    decoder: str, attention: str, cell: str
) -> None:
    plain, fast = pair(attention, decoder, cell)
    assert_close_lists(training_results(fast), training_results(plain), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("attention", list(ATTENTIONS))
@pytest.mark.parametrize("decoder", list(DECODERS))
def test_validation_logits_and_weights_are_the_references(
    decoder: str, attention: str, cell: str
) -> None:
    """Teacher forcing in eval mode without autograd, with the weights: the validation pass."""
    plain, fast = pair(attention, decoder, cell)
    src, src_lens, tgt_in, _ = training_batch()
    with torch.no_grad():
        results = [model.eval()(src, src_lens, tgt_in) for model in (fast, plain)]
    (fast_logits, fast_weights), (logits, weights) = results
    torch.testing.assert_close(fast_logits, logits, rtol=1e-5, atol=1e-5)
    assert fast_weights is not None and weights is not None
    torch.testing.assert_close(fast_weights, weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("attention", list(ATTENTIONS))
@pytest.mark.parametrize("decoder", list(DECODERS))
def test_decoded_tokens_are_the_references(decoder: str, attention: str, cell: str) -> None:
    """Greedy and beam 5 over the batch (decoding tables built) and over one sentence (none)."""
    plain, fast = pair(attention, decoder, cell)
    src, src_lens, _, _ = training_batch()
    for rows in (slice(None), slice(1, 2)):
        batch = (src[rows], src_lens[rows])
        greedy = [greedy_search(m.eval(), *batch, BOS, EOS, PAD) for m in (fast, plain)]
        assert torch.equal(greedy[0].tokens, greedy[1].tokens)
        assert torch.equal(greedy[0].lengths, greedy[1].lengths)
        torch.testing.assert_close(greedy[0].attention, greedy[1].attention, atol=1e-6, rtol=1e-5)
        beams = [beam_search(m, *batch, BOS, EOS, PAD, beam_size=5) for m in (fast, plain)]
        assert torch.equal(beams[0].tokens, beams[1].tokens)
        torch.testing.assert_close(beams[0].scores, beams[1].scores, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(library() is None, reason=f"no CPU kernels here: {unavailable_reason()}")
def test_the_kernels_run_where_they_apply() -> None:
    """The comparisons above measure the kernels, not only fallbacks: on this CPU the encoder,
    the Bahdanau recurrence with additive scoring, the Luong cell, its product attention and
    its greedy loop take the C paths."""
    src, src_lens, _, _ = training_batch()
    bahdanau = pair("additive", "bahdanau", "gru")[1].train()
    luong = pair("dot", "luong", "gru")[1].train()
    assert isinstance(luong, FastSeq2Seq)
    for model in (bahdanau, luong):
        assert isinstance(model.encoder, FastRNNEncoder)
        assert model.encoder.runs_fused(model.encoder.embedding.weight)
    source, state = bahdanau.encode(src, src_lens)
    assert isinstance(bahdanau.decoder, FastBahdanauDecoder)
    assert bahdanau.decoder.fused_recurrence_applies(source, state[0])
    source, state = luong.encode(src, src_lens)
    assert isinstance(luong.decoder, FastLuongDecoder)
    assert luong.decoder.cell_runs_fused(*luong.decoder.cell_parameters())
    assert luong.decoder.fused_product_scale(source, state[0]) == 1.0  # dot: unscaled
    with torch.no_grad():
        source, state = luong.eval().encode(src, src_lens)
        limits = torch.full((4,), 9)
        task = GreedyTask(limits, 9, BOS, EOS, PAD)
        assert (luong.fused_greedy(source, state, task) is not None) is (blas_sgemm() is not None)


def test_accelerate_keeps_every_parameter_and_reference_undoes_it() -> None:
    plain = make_model("additive", decoder="luong")
    state = {name: value.clone() for name, value in plain.state_dict().items()}
    fast = accelerate(plain)
    assert fast is plain  # in place
    assert not {type(m) for m in fast.modules()} & set(ACCELERATED)  # every one swapped
    assert fast.state_dict().keys() == state.keys()
    for name, value in fast.state_dict().items():
        assert torch.equal(value, state[name])
    back = reference(fast)
    assert not is_accelerated(back)
    assert {type(m) for m in back.modules()} & set(ACCELERATED.values()) == set()


def test_a_subclass_of_a_reference_module_is_left_alone() -> None:
    """A user's own decoder keeps its own methods: only the exact reference classes swap."""

    class MyBahdanau(DECODERS["bahdanau"]):  # type: ignore[misc, valid-type]
        pass

    model = Seq2Seq(13, 11, ATTENTIONS["dot"], embedding_size=8, hidden_size=16, decoder=MyBahdanau)
    accelerate(model)
    assert type(model.decoder) is MyBahdanau and is_accelerated(model)  # the rest did swap


@pytest.mark.parametrize("lstm", [False, True], ids=["gru", "lstm"])
@pytest.mark.parametrize("attention", ["additive", "general"])
def test_bahdanau_split_input_projection_equals_the_cell(attention: str, lstm: bool) -> None:
    """On the CPU, teacher forcing computes W_ie e for all steps at once and adds W_ic c_t per
    step (or runs the C recurrence); the logits and every gradient equal the reference's cell
    applied to [e; c] step by step."""
    plain, fast = (make_model(attention, lstm, "bahdanau", dropout=0.0) for _ in range(2))
    accelerate(fast)
    assert isinstance(fast.decoder, FastBahdanauDecoder)
    src, src_lens, tgt_in = make_batch()
    results = []
    for model in (fast, plain):
        logits, _ = model.train()(src, src_lens, tgt_in, need_weights=False)
        params = list(model.parameters())
        results.append([logits, *torch.autograd.grad(logits.square().sum(), params)])
    assert_close_lists(results[0], results[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("lstm", [False, True], ids=["gru", "lstm"])
def test_the_cell_from_its_input_projection_is_the_nn_cell(lstm: bool) -> None:
    """Both ways an accelerated step turns W_ie e + b_ih and the context into the next state
    (ATen's CPU cell kernel with a per-row bias, and the gate arithmetic) are the cell."""
    decoder = accelerate(make_model(lstm=lstm)).decoder
    assert isinstance(decoder, FastBahdanauDecoder)
    torch.manual_seed(4)
    embedded, context = torch.randn(3, 8), torch.randn(3, 16)
    state = tuple(torch.randn(3, 16) for _ in range(2 if lstm else 1))
    cell_input = torch.cat([embedded, context], dim=-1)  # (B, E + M)
    expected = decoder.cell(cell_input, state if lstm else state[0])
    expected = tuple(expected) if lstm else (expected,)
    embedding_weight, context_weight = decoder.split_input_weight()
    input_gates = decoder.embedding_gates(embedded, embedding_weight)
    with_kernel = decoder.cpu_cell(context, input_gates, state, context_weight)
    gates = torch.addmm(input_gates, context, context_weight.t())
    with_arithmetic = decoder.cell_gates(gates, state)
    for ours in (with_kernel, with_arithmetic):
        assert_close_lists(list(ours), list(expected), rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("decoder", list(DECODERS))
@pytest.mark.parametrize("lstm", [False, True], ids=["gru", "lstm"])
@pytest.mark.parametrize("attention", ["additive", "dot"])
def test_decoding_with_the_per_batch_tables_equals_teacher_forcing(
    attention: str, lstm: bool, decoder: str
) -> None:
    model = accelerate(make_model(attention, lstm, decoder))
    assert isinstance(model, Seq2Seq) and isinstance(model.decoder, FastDecoder)
    src, src_lens, tgt_in = make_batch()
    logits, weights = model(src, src_lens, tgt_in)  # with autograd: no table
    with torch.no_grad():  # as the searches decode
        source, state = model.encode(src, src_lens)
        assert isinstance(source, DecodingSource) and not source.tables_built
        for t in range(tgt_in.shape[1]):
            step_logits, state, step_weights = model.decode_step(tgt_in[:, t], state, source)
            torch.testing.assert_close(step_logits, logits[:, t])
            torch.testing.assert_close(step_weights, weights[:, t])
        # Built at the first step: each token's gates (V, G); Luong's W_c1 m (B, S, H).
        assert source.token_gates is not None and source.token_gates.shape[0] == 11
        if decoder == "luong":
            assert source.attentional_memory is not None
            assert source.attentional_memory.shape == (3, 5, 16)
        else:
            assert source.attentional_memory is None
        one = model.encode(src[:1], src_lens[:1])[0]
        model.decode_step(tgt_in[:1, 0], model.encode(src[:1], src_lens[:1])[1], one)
        assert isinstance(one, DecodingSource) and one.token_gates is None  # 11 > 8 * 1 rows
    # Teacher forcing and training step nothing, so they get no tables.
    model.train()
    training, state = model.encode(src, src_lens)
    model.decode_step(tgt_in[:, 0], state, training)  # with autograd
    assert isinstance(training, DecodingSource) and not training.tables_built


@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.5, "learnable"])
def test_additive_context_through_the_sigmoid_is_the_references(
    layer_norm: bool, temperature: float | str
) -> None:
    """Training scores additive attention through 2 w_vᵀσ(2x) = w_vᵀtanh(x) + Σw_v: the same
    softmax, so ``context`` and its gradients equal ``forward``'s."""
    torch.manual_seed(5)
    plain = AdditiveAttention(6, 5, num_hiddens=7, layer_norm=layer_norm, temperature=temperature)
    fast = accelerate(copy.deepcopy(plain))
    assert isinstance(fast, FastAdditiveAttention)
    queries = torch.randn(2, 3, 6, requires_grad=True)
    keys, values, valid_lens = torch.randn(2, 4, 5), torch.randn(2, 4, 3), torch.tensor([4, 2])
    results = []
    for attention in (fast, plain):
        context = attention.context(queries, keys, values, valid_lens)
        grads = torch.autograd.grad(context.sin().sum(), [queries, *attention.parameters()])
        results.append([context, *grads])
    assert_close_lists(results[0], results[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attention", ["additive", "general"])
@pytest.mark.parametrize("decoder", list(DECODERS))
def test_the_keys_are_projected_on_the_real_positions_alone(decoder: str, attention: str) -> None:
    """``FastDecoder.packed_source``: a scoring's projected keys (W_k k, general's W k) are the
    reference's at every real source position, and zeros at the padding, with the gradient
    the reference's keys would pass on from there."""
    plain, fast = pair(attention, decoder, "gru")
    src, src_lens, _, _ = training_batch()
    memory = fast.encoder(src, src_lens)[0].detach().requires_grad_()
    real = torch.arange(memory.shape[1])[None, :] < src_lens[:, None]  # (B, S)
    assert isinstance(fast.decoder, FastDecoder)
    assert fast.decoder.packed_source(memory, src_lens) is not None  # it applies here
    results = []
    for model in (fast, plain):
        projected = model.decoder.prepare_source(memory, src_lens).projected_keys  # (B, S, A)
        d_projected = torch.randn(projected.shape, generator=torch.Generator().manual_seed(1))
        (d_memory,) = torch.autograd.grad((projected[real] * d_projected[real]).sum(), memory)
        results.append((projected, d_memory))
    (got, got_grad), (want, want_grad) = results
    torch.testing.assert_close(got[real], want[real])
    assert not got[~real].any()
    torch.testing.assert_close(got_grad, want_grad)


@pytest.mark.parametrize("attention", list(ATTENTIONS))
@pytest.mark.parametrize("decoder", list(DECODERS))
def test_multi_head_models_train_and_decode_as_the_reference(decoder: str, attention: str) -> None:
    """``model.num_heads=4``: the accelerated modules (the encoder's GRU, Luong's cell, the
    split input projection) around multi-head attention compute what the reference does."""
    torch.manual_seed(0)
    plain = Seq2Seq(
        13, 11, ATTENTIONS[attention], embedding_size=8, hidden_size=16, dropout=0.0,
        decoder=DECODERS[decoder], num_heads=4,
    ).eval()  # fmt: skip
    fast = accelerate(copy.deepcopy(plain))
    assert isinstance(fast, Seq2Seq)
    assert_close_lists(training_results(fast), training_results(plain), rtol=1e-4, atol=1e-5)
    src, src_lens, _, _ = training_batch()
    for beam_size in (1, 5):
        results = [
            beam_search(m.eval(), src, src_lens, BOS, EOS, PAD, beam_size=beam_size)
            for m in (fast, plain)
        ]
        assert torch.equal(results[0].tokens, results[1].tokens)
        torch.testing.assert_close(results[0].scores, results[1].scores, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(results[0].attention, results[1].attention, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lstm", [False, True], ids=["gru", "lstm"])
def test_luong_decoder_moves_between_dtypes_on_the_cpu(lstm: bool) -> None:
    """``FastLuongDecoder._apply`` (every ``.to``, ``.double``) lays the cell out for cuDNN only on
    a GPU: on the CPU the parameters stay separate tensors of the new dtype, and the model computes
    what it did."""
    model = accelerate(make_model("dot", lstm=lstm, decoder="luong"))
    src, src_lens, tgt_in = make_batch()
    expected = model(src, src_lens, tgt_in)[0]  # (B, T, V)
    model.double()
    params = model.decoder.cell_parameters()
    assert all(p.dtype == torch.float64 for p in params)
    assert len({p.untyped_storage().data_ptr() for p in params}) == len(params)
    torch.testing.assert_close(model(src, src_lens, tgt_in)[0].float(), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN's weight layout needs a GPU")
@pytest.mark.parametrize("lstm", [False, True], ids=["gru", "lstm"])
def test_luong_cell_is_one_cudnn_buffer_on_the_gpu(
    lstm: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After ``.cuda()`` the Luong cell's parameters are views of one buffer, so cuDNN reads them
    in place (no "not part of single contiguous chunk" warning); the function, the parameters'
    names and values, and a CPU round trip are what they were."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # compare in full fp32
    # Training mode (cuDNN's RNN has no backward otherwise) without dropout, whose masks would
    # differ between the devices.
    model = accelerate(make_model("dot", lstm=lstm, decoder="luong", dropout=0.0)).train()
    src, src_lens, tgt_in = make_batch()
    cpu_state = {name: value.clone() for name, value in model.state_dict().items()}
    expected = model(src, src_lens, tgt_in)[0]
    expected.sum().backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)

    model.cuda()
    cell_params = model.decoder.cell_parameters()
    storage = cell_params[0].untyped_storage().data_ptr()
    assert all(p.untyped_storage().data_ptr() == storage for p in cell_params)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logits = model(src.cuda(), src_lens.cuda(), tgt_in.cuda())[0]
        logits.sum().backward()
    assert not [w for w in caught if "contiguous chunk" in str(w.message)]
    torch.testing.assert_close(logits.cpu(), expected, atol=1e-5, rtol=1e-4)
    for param, grad in zip(model.parameters(), expected_grads, strict=True):
        torch.testing.assert_close(param.grad.cpu(), grad, atol=1e-4, rtol=1e-3)

    state = model.state_dict()
    assert state.keys() == cpu_state.keys()
    for name, value in cpu_state.items():
        torch.testing.assert_close(state[name].cpu(), value)
    model.cpu()  # back on the CPU: plain, separate tensors again
    assert len({p.data_ptr() for p in model.decoder.cell_parameters()}) == len(cell_params)


def test_reference_path_runs_the_reference_modules_and_restores_the_accelerated_ones() -> None:
    """What the explorer's forward hooks need: inside the block, the reference classes; after
    it, the model as it was (accelerated, or not)."""
    model = accelerate(make_model("additive", False, "bahdanau"))
    with reference_path(model) as inside:
        assert inside is model and not is_accelerated(model)
    assert is_accelerated(model)
    plain = make_model("additive", False, "bahdanau")
    with reference_path(plain):
        assert not is_accelerated(plain)
    assert not is_accelerated(plain)
