"""seq2seq.kernels.greedy: the Luong decoder's greedy loop in one C call decodes as greedy_search's
Python loop over decode_step does (the reference: the same model with the call switched off).

Shape legend: B batch, S source length, L output length.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from seq2seq.attention import AttentionParts
from seq2seq.kernels import accelerate, library, reference
from seq2seq.kernels.modules import FastSeq2Seq
from seq2seq.models.decoder import DecoderState, EncodedSource
from seq2seq.models.model import Seq2Seq
from seq2seq.search import FusedGreedyModel, GreedyTask, Hypotheses, greedy_search
from tests.scoring import scoring_factory
from tests.test_model import ATTENTIONS, BOS, DECODERS, EOS, PAD

# The scoring functions the loop composes: the model tests', and additive with its layer norm.
GREEDY_ATTENTIONS = {
    **ATTENTIONS,
    "additive+layer_norm": scoring_factory("additive", {"num_hiddens": 12, "layer_norm": True}),
}
needs_sgemm = pytest.mark.skipif(
    library.blas_sgemm() is None, reason="no torch sgemm_ here: greedy steps in Python"
)


def make_luong(
    attention: str,
    lstm: bool = False,
    vocabulary: int = 7,
    hidden_size: int = 16,
    parts: AttentionParts | None = None,
    num_heads: int = 1,
    input_feeding: bool = False,
) -> Seq2Seq:
    """A small random Luong model whose greedy outputs end at many different steps: its
    matrices scaled up 3x (so that the outputs depend on the source) and EOS favoured by the
    output bias, about half the sentences of a batch end at EOS, at different steps, and the
    rest at their limits."""
    torch.manual_seed(0)
    model = Seq2Seq(
        src_vocab_size=13,
        tgt_vocab_size=vocabulary,
        attention=GREEDY_ATTENTIONS[attention],
        embedding_size=8,
        hidden_size=hidden_size,
        rnn=nn.LSTM if lstm else nn.GRU,
        cell=nn.LSTMCell if lstm else nn.GRUCell,
        decoder=DECODERS["luong"],
        attention_parts=parts,
        num_heads=num_heads,
        input_feeding=input_feeding,
    ).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() > 1:
                parameter.mul_(3.0)
            if name.endswith(("key_bias.bias", "coverage_weight")):  # at 0 they would not show
                torch.nn.init.normal_(parameter)
        model.decoder.output_layer.bias[EOS] += 2.0
    return accelerate_model(model)


def accelerate_model(model: Seq2Seq) -> FastSeq2Seq:
    accelerate(model)
    assert isinstance(model, FastSeq2Seq)
    return model


def make_sources(batch: int, seed: int) -> tuple[Tensor, Tensor]:
    """src (B, S) longest first, as the translator batches them, and their lengths (B,)."""
    generator = torch.Generator().manual_seed(seed)
    src_lens = torch.randint(1, 9, (batch,), generator=generator).sort(descending=True).values
    src = torch.randint(4, 13, (batch, int(src_lens[0])), generator=generator)
    src[torch.arange(src.shape[1])[None, :] >= src_lens[:, None]] = PAD
    return src, src_lens


def both_ways(
    model: Seq2Seq, src: Tensor, src_lens: Tensor, max_len_b: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[Hypotheses, Hypotheses]:
    """greedy_search with the C loop, and with it switched off (decode_step in Python)."""
    fused = greedy_search(model, src, src_lens, BOS, EOS, PAD, max_len_a=1.0, max_len_b=max_len_b)
    with monkeypatch.context() as patch:
        patch.setattr(FastSeq2Seq, "fused_greedy", lambda *args: None)
        stepped = greedy_search(
            model, src, src_lens, BOS, EOS, PAD, max_len_a=1.0, max_len_b=max_len_b
        )
    return fused, stepped


@needs_sgemm
@pytest.mark.parametrize("attention", ["dot", "scaled_dot", "general"])
@pytest.mark.parametrize(("batch", "max_len_b"), [(1, 3), (9, 0), (40, 4)])
def test_the_c_loop_decodes_as_greedy_search_steps(
    attention: str, batch: int, max_len_b: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make_luong(attention)
    for seed in range(3):
        src, src_lens = make_sources(batch, seed)
        with torch.no_grad():  # the C loop does apply here: both ways below differ
            source, state = model.encode(src, src_lens)
            limits = src_lens + max_len_b
            task = GreedyTask(limits, int(limits.max()), BOS, EOS, PAD)
            assert model.fused_greedy(source, state, task)
        fused, stepped = both_ways(model, src, src_lens, max_len_b, monkeypatch)
        assert torch.equal(fused.tokens, stepped.tokens)
        assert torch.equal(fused.lengths, stepped.lengths)
        torch.testing.assert_close(fused.attention, stepped.attention, rtol=1e-6, atol=1e-7)


# The attention's parts the C loop composes (csrc/gru.c's parts_row), each with a product and an
# additive score.
GREEDY_PARTS = {
    "sparsemax": AttentionParts("sparsemax"),
    "entmax15+key_bias": AttentionParts("entmax15", key_bias=True, key_bias_positions=5),
    "entmax_1.3": AttentionParts("entmax", alpha=1.3),
    "learned_alpha": AttentionParts("entmax", alpha="learnable", initial_alpha=1.7),
    "local_m": AttentionParts(window="local_m", window_size=1),
    "sparsemax+local_m": AttentionParts("sparsemax", window="local_m", window_size=2),
    "key_bias": AttentionParts(key_bias=True, key_bias_positions=3),
    "coverage": AttentionParts(coverage=True),
    "coverage+sparsemax+local_m": AttentionParts(
        "sparsemax", window="local_m", window_size=1, coverage=True
    ),
    "local_p": AttentionParts(window="local_p", window_size=1),
    "local_p+entmax15+coverage": AttentionParts(
        "entmax15", window="local_p", window_size=2, coverage=True
    ),
}


@needs_sgemm
@pytest.mark.parametrize("input_feeding", [False, True], ids=["", "input_feeding"])
@pytest.mark.parametrize("attention", ["scaled_dot", "additive", "additive+layer_norm"])
@pytest.mark.parametrize("parts", [*GREEDY_PARTS, "softmax"])
def test_the_c_loop_composes_the_attentions_parts(
    attention: str, parts: str, input_feeding: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every part of the Luong decoder's attention, composed in the C loop from the C twins
    (coverage, with γ c on a product's logits or w_c c inside the additive score; local-p's
    centre predicted from the state and its Gaussian; the additive score's layer norm; input
    feeding as state the loop carries): the tokens, lengths and weights greedy_search's steps
    give."""
    parts_chosen = GREEDY_PARTS.get(parts)
    model = make_luong(attention, parts=parts_chosen, input_feeding=input_feeding)
    for seed in range(3):
        src, src_lens = make_sources(23, seed)
        inputs = decoder_inputs(model, src=src, src_lens=src_lens)
        with torch.no_grad():
            assert model.fused_greedy(*inputs) is not None
        fused, stepped = both_ways(model, src, src_lens, 3, monkeypatch)
        assert torch.equal(fused.tokens, stepped.tokens)
        assert torch.equal(fused.lengths, stepped.lengths)
        torch.testing.assert_close(fused.attention, stepped.attention, rtol=1e-5, atol=1e-6)
        assert torch.equal(fused.attention == 0, stepped.attention == 0)


@needs_sgemm
@pytest.mark.parametrize("input_feeding", [False, True], ids=["", "input_feeding"])
@pytest.mark.parametrize("attention", ["scaled_dot", "additive", "general"])
@pytest.mark.parametrize(
    "parts", ["softmax", "sparsemax+local_m", "learned_alpha", "coverage", "local_p"]
)
def test_the_c_loop_composes_several_heads(
    attention: str, parts: str, input_feeding: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """model.num_heads = 2: each head scored in the loop as a sentence of its own, the block's
    W_q and W_o folded into the loop's GEMMs; the weights are the heads' average, which the
    coverage sums (each head's γ weighing it) and every head shares the row's local-p centre."""
    model = make_luong(
        attention, parts=GREEDY_PARTS.get(parts), num_heads=2, input_feeding=input_feeding
    )
    for seed in range(2):
        src, src_lens = make_sources(17, seed)
        with torch.no_grad():
            assert model.fused_greedy(*decoder_inputs(model, src=src, src_lens=src_lens))
        fused, stepped = both_ways(model, src, src_lens, 3, monkeypatch)
        assert torch.equal(fused.tokens, stepped.tokens)
        assert torch.equal(fused.lengths, stepped.lengths)
        torch.testing.assert_close(fused.attention, stepped.attention, rtol=1e-5, atol=1e-6)


@needs_sgemm
@pytest.mark.usefixtures("two_threads")
def test_rows_split_over_threads_decode_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch large enough that the gate and attention passes split their rows over torch's
    threads (csrc/gru.c's PARALLEL_MIN)."""
    model = make_luong("general", hidden_size=64)
    src, src_lens = make_sources(64, 2)
    fused, stepped = both_ways(model, src, src_lens, 3, monkeypatch)
    assert torch.equal(fused.tokens, stepped.tokens)
    torch.testing.assert_close(fused.attention, stepped.attention, rtol=1e-6, atol=1e-7)


@needs_sgemm
def test_sentences_leave_at_eos_or_at_their_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The random model's outputs end at EOS in some rows and at the length limit in others,
    so the C loop's removal of finished rows is exercised both ways."""
    model = make_luong("dot")
    src, src_lens = make_sources(40, 1)
    fused, _ = both_ways(model, src, src_lens, 2, monkeypatch)
    ends = fused.tokens.gather(1, (fused.lengths - 1)[:, None])[:, 0]  # (B,) each last token
    assert (ends == EOS).any() and (ends != EOS).any()
    assert len(set(fused.lengths.tolist())) > 3
    for row, length in enumerate(fused.lengths.tolist()):
        assert (fused.tokens[row, length:] == PAD).all()
        assert (fused.attention[row, length:] == 0).all()
        assert (fused.attention[row, :length, int(src_lens[row]) :] == 0).all()


@needs_sgemm
def test_nan_logits_pick_the_token_torch_argmax_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A diverged model's NaN logits: torch.argmax ranks NaN above every number, the first one."""
    model = make_luong("dot")
    with torch.no_grad():
        model.decoder.output_layer.bias[[4, 6]] = float("nan")
    src, src_lens = make_sources(5, 0)
    fused, stepped = both_ways(model, src, src_lens, 1, monkeypatch)
    assert torch.equal(fused.tokens, stepped.tokens)
    assert (fused.tokens[:, 0] == 4).all()


def decoder_inputs(
    model: FastSeq2Seq,
    batch: int = 4,
    src: Tensor | None = None,
    src_lens: Tensor | None = None,
) -> tuple[EncodedSource, DecoderState, GreedyTask]:
    """fused_greedy's arguments for a batch (``src`` and ``src_lens``, or random ones), encoded
    for decoding (eval mode, no gradients)."""
    if src is None or src_lens is None:
        src, src_lens = make_sources(batch, 0)
    training = model.training
    with torch.no_grad():
        source, state = model.eval().encode(src, src_lens)
    model.train(training)
    limits = src_lens + 2
    return source, state, GreedyTask(limits, int(limits.max()), BOS, EOS, PAD)


@needs_sgemm
@pytest.mark.parametrize(
    "case", ["lstm", "dropout", "gradients", "large vocabulary", "bahdanau", "off"]
)
def test_the_c_loop_is_used_only_where_every_step_would_take_the_c_paths(case: str) -> None:
    """Elsewhere fused_greedy answers None and greedy_search steps decode_step."""
    model = make_luong(
        "dot",
        lstm=case == "lstm",
        vocabulary=4 * 8 + 1 if case == "large vocabulary" else 7,  # > 8 x the batch of 4
    )
    if case == "bahdanau":
        torch.manual_seed(0)
        model = Seq2Seq(
            src_vocab_size=13,
            tgt_vocab_size=7,
            attention=ATTENTIONS["dot"],
            embedding_size=8,
            hidden_size=16,
            decoder=DECODERS["bahdanau"],
        ).eval()
        model = accelerate_model(model)
    inputs = decoder_inputs(model)
    if case == "dropout":  # the output layer's dropout active while decoding
        model.decoder.dropout.train()
    if case == "off":  # the reference model has no C loop to offer
        assert not isinstance(reference(model), FusedGreedyModel)
        model = accelerate_model(model)
    else:
        with torch.set_grad_enabled(case == "gradients"):
            assert model.fused_greedy(*inputs) is None
    if case in ("dropout", "off", "gradients"):  # the same inputs do take the C loop
        model.decoder.dropout.eval()
        with torch.no_grad():
            assert model.fused_greedy(*inputs) is not None


@needs_sgemm
def test_without_torchs_sgemm_the_steps_run_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_luong("dot")
    inputs = decoder_inputs(model)
    monkeypatch.setitem(library._state, "sgemm", None)
    with torch.no_grad():
        assert model.fused_greedy(*inputs) is None
