"""The encoder, both decoders and Seq2Seq: teacher forcing equals stepping, padding changes nothing.

Shape legend: B batch, S source length, T target length, H hidden size, V vocabulary.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from seq2seq.attention import AdditiveAttention, AttentionParts, GeneralAttention
from seq2seq.errors import ConfigError
from seq2seq.models.decoder import AttentionFactory, BahdanauDecoder, EncodedSource, LuongDecoder
from seq2seq.models.model import DecoderFactory, Seq2Seq
from seq2seq.search import greedy_search
from tests.scoring import SCORING_FUNCTIONS, scoring_factory
from tests.test_search import assert_beam_one_is_greedy

# Every scoring function of conf/attention/, additive attention's hidden size made small.
ATTENTIONS: dict[str, AttentionFactory] = {
    name: scoring_factory(name, {"num_hiddens": 12}) for name in SCORING_FUNCTIONS
}
DECODERS: dict[str, DecoderFactory] = {"bahdanau": BahdanauDecoder, "luong": LuongDecoder}
# Names of decoder settings the tests run: each of DECODERS, Luong's with input feeding, and
# either with coverage ("+coverage"; its weights drawn at random, so that it changes the scores).
VARIANTS = [
    *DECODERS, "luong+feed", "bahdanau+coverage", "luong+coverage", "luong+feed+coverage",
]  # fmt: skip
BOS, EOS, PAD = 2, 3, 0


def make_model(
    attention: str = "additive",
    lstm: bool = False,
    decoder: str = "bahdanau",
    dropout: float = 0.3,
    **sizes: int,
) -> Seq2Seq:
    torch.manual_seed(0)
    name, *switches = decoder.split("+")
    model = Seq2Seq(
        src_vocab_size=13,
        tgt_vocab_size=11,
        attention=ATTENTIONS[attention],
        embedding_size=sizes.get("embedding_size", 8),
        hidden_size=sizes.get("hidden_size", 16),
        encoder_hidden_size=sizes.get("encoder_hidden_size"),
        dropout=dropout,
        rnn=nn.LSTM if lstm else nn.GRU,
        cell=nn.LSTMCell if lstm else nn.GRUCell,
        decoder=DECODERS[name],
        input_feeding="feed" in switches,
        attention_parts=AttentionParts(coverage="coverage" in switches),
    ).eval()
    randomize_coverage(model)
    return model


def randomize_coverage(model: nn.Module) -> None:
    """Coverage weights start at 0 (no effect); draw them, so that tests see coverage act."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("coverage_weight"):
                parameter.normal_()


def make_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    src_lens = torch.tensor([5, 2, 4])
    src = torch.randint(4, 13, (3, 5))
    src[torch.arange(5)[None, :] >= src_lens[:, None]] = PAD
    tgt_in = torch.cat([torch.full((3, 1), BOS), torch.randint(4, 11, (3, 5))], dim=1)
    return src, src_lens, tgt_in


@pytest.mark.parametrize("decoder", VARIANTS)
@pytest.mark.parametrize("lstm", [False, True], ids=["gru", "lstm"])
@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_teacher_forcing_equals_stepping_decode_step(
    attention: str, lstm: bool, decoder: str
) -> None:
    model = make_model(attention, lstm, decoder)
    src, src_lens, tgt_in = make_batch()
    logits, weights = model(src, src_lens, tgt_in)  # (B, T, V), (B, T, S)
    assert logits.shape == (3, 6, 11) and weights.shape == (3, 6, 5)

    source, state = model.encode(src, src_lens)
    for t in range(tgt_in.shape[1]):
        step_logits, state, step_weights = model.decode_step(tgt_in[:, t], state, source)
        torch.testing.assert_close(step_logits, logits[:, t])
        torch.testing.assert_close(step_weights, weights[:, t])
    # Attention never reads source padding.
    assert (weights[1, :, 2:] == 0).all() and (weights[2, :, 4:] == 0).all()


@pytest.mark.parametrize("decoder", VARIANTS)
@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_appended_source_padding_changes_nothing(attention: str, decoder: str) -> None:
    model = make_model(attention, decoder=decoder)
    src, src_lens, tgt_in = make_batch()
    logits, weights = model(src, src_lens, tgt_in)
    longer_src = torch.cat([src, torch.full((3, 3), PAD)], dim=1)
    longer_logits, longer_weights = model(longer_src, src_lens, tgt_in)
    torch.testing.assert_close(longer_logits, logits)
    torch.testing.assert_close(longer_weights[..., :5], weights)


@pytest.mark.parametrize("decoder", VARIANTS)
def test_each_sentence_is_independent_of_its_batch(decoder: str) -> None:
    model = make_model("general", decoder=decoder)
    src, src_lens, tgt_in = make_batch()
    logits, _ = model(src, src_lens, tgt_in)
    for b in range(3):
        n = int(src_lens[b])
        alone, _ = model(src[b : b + 1, :n], src_lens[b : b + 1], tgt_in[b : b + 1])
        torch.testing.assert_close(alone[0], logits[b], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["scaled_dot", "dot"])
def test_dot_product_projects_keys_when_encoder_and_decoder_sizes_differ(attention: str) -> None:
    model = make_model(attention, hidden_size=16, encoder_hidden_size=5)  # memory 10, queries 16
    projection = model.decoder.key_projection
    assert isinstance(projection, nn.Linear) and projection.weight.shape == (16, 10)
    src, src_lens, tgt_in = make_batch()
    logits, _ = model(src, src_lens, tgt_in)
    assert torch.isfinite(logits).all()


def test_matching_sizes_need_no_key_projection() -> None:
    model = make_model("scaled_dot", hidden_size=16)  # encoder 2 x 8 = 16
    assert isinstance(model.decoder.key_projection, nn.Identity)


def test_dropout_is_active_only_in_training() -> None:
    model = make_model("additive")
    src, src_lens, tgt_in = make_batch()
    eval_logits, _ = model(src, src_lens, tgt_in)
    model.train()
    torch.manual_seed(1)
    train_logits, _ = model(src, src_lens, tgt_in)
    assert not torch.allclose(train_logits, eval_logits)


@pytest.mark.parametrize("decoder", VARIANTS)
@pytest.mark.parametrize("attention", ["additive", "scaled_dot"])
def test_greedy_batch_equals_one_by_one(attention: str, decoder: str) -> None:
    model = make_model(attention, decoder=decoder)
    src, src_lens, _ = make_batch()
    batch = greedy_search(model, src, src_lens, BOS, EOS, PAD, max_len_a=1.0, max_len_b=3)
    for b in range(3):
        n = int(src_lens[b])
        alone = greedy_search(model, src[b : b + 1, :n], src_lens[b : b + 1], BOS, EOS, PAD, 1.0, 3)
        length = int(alone.lengths[0])
        assert int(batch.lengths[b]) == length <= n + 3
        assert batch.tokens[b, :length].tolist() == alone.tokens[0, :length].tolist()
        assert (batch.tokens[b, length:] == PAD).all()
        torch.testing.assert_close(
            batch.attention[b, :length, :n], alone.attention[0, :length], atol=1e-5, rtol=1e-5
        )


def test_greedy_follows_the_argmax_of_decode_step() -> None:
    model = make_model("general")
    src, src_lens, _ = make_batch()
    hypotheses = greedy_search(model, src, src_lens, BOS, EOS, PAD, max_len_a=0.0, max_len_b=4)
    source, state = model.encode(src, src_lens)
    prev = torch.full((3,), BOS)
    for t in range(4):
        logits, state, _ = model.decode_step(prev, state, source)
        prev = logits.argmax(-1)
        for b in range(3):
            if t < int(hypotheses.lengths[b]):
                assert int(hypotheses.tokens[b, t]) == int(prev[b])


@pytest.mark.parametrize("decoder", VARIANTS)
@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_skipping_the_weights_changes_no_logit(attention: str, decoder: str) -> None:
    model = make_model(attention, decoder=decoder)
    src, src_lens, tgt_in = make_batch()
    logits, weights = model(src, src_lens, tgt_in)
    fast_logits, no_weights = model(src, src_lens, tgt_in, need_weights=False)
    assert weights is not None and no_weights is None
    torch.testing.assert_close(fast_logits, logits)


def stepwise_luong_reference(
    model: Seq2Seq, src: torch.Tensor, src_lens: torch.Tensor, tgt_in: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Luong et al. (2015) written out one step at a time, from the model's own parameters:
    h_0 = the encoder's summary if it has the size H, else tanh(W_b summary + b_b);
    h_t = GRUCell(e_{t-1}, h_{t-1}); weights_t = softmax over real keys of score(h_t, keys);
    c_t = weights_t · memory; logits_t = W_s tanh(W_c [c_t; h_t]) + b_s. With input feeding
    (section 3.3), h~_0 = 0 and h_t = GRUCell([e_{t-1}; h~_{t-1}], h_{t-1}), where h~_t =
    tanh(W_c [c_t; h_t])."""
    decoder = model.decoder
    memory, summary = model.encoder(src, src_lens)  # (B, S, M), (B, M)
    keys = decoder.key_projection(memory)  # (B, S, H)
    if summary.shape[-1] == decoder.cell.hidden_size:
        hidden = summary  # (B, H)
    else:
        assert decoder.bridge is not None
        hidden = torch.tanh(decoder.bridge(summary))  # (B, H)
    is_real = torch.arange(src.shape[1])[None, :] < src_lens[:, None]  # (B, S)
    all_logits, all_weights = [], []
    attentional = torch.zeros_like(hidden)  # h~_0 (B, H)
    for t in range(tgt_in.shape[1]):
        embedded = decoder.embedding(tgt_in[:, t])  # (B, E)
        if decoder.input_feeding:
            embedded = torch.cat([embedded, attentional], dim=-1)  # (B, E + H)
        hidden = decoder.cell(embedded, hidden)  # (B, H)
        scores = decoder.attention.logits(hidden[:, None], decoder.attention.project_keys(keys))[
            :, 0
        ]  # (B, S)
        weights = scores.masked_fill(~is_real, float("-inf")).softmax(-1)  # (B, S)
        context = torch.bmm(weights[:, None], memory)[:, 0]  # (B,1,S) @ (B,S,M) -> (B, M)
        attentional = torch.tanh(decoder.attentional(torch.cat([context, hidden], dim=-1)))
        all_logits.append(decoder.output_layer(attentional))  # (B, H) -> (B, V)
        all_weights.append(weights)
    return torch.stack(all_logits, 1), torch.stack(all_weights, 1)  # (B, T, V), (B, T, S)


@pytest.mark.parametrize("decoder", ["luong", "luong+feed"])
@pytest.mark.parametrize(
    "encoder_hidden_size", [None, 5], ids=["summary-is-h0", "bridge-and-key-projection"]
)
@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_luong_parallel_path_equals_a_stepwise_reference(
    attention: str, encoder_hidden_size: int | None, decoder: str
) -> None:
    # 5: the memory (10) is bridged and, for dot products, its keys projected to 16.
    model = make_model(attention, decoder=decoder, encoder_hidden_size=encoder_hidden_size)
    src, src_lens, tgt_in = make_batch()
    logits, weights = model(src, src_lens, tgt_in)  # one RNN call, one batched attention
    ref_logits, ref_weights = stepwise_luong_reference(model, src, src_lens, tgt_in)
    torch.testing.assert_close(logits, ref_logits)
    assert weights is not None
    torch.testing.assert_close(weights, ref_weights)


@pytest.mark.parametrize(
    "knobs",
    [{"temperature": 0.5}, {"temperature": "learnable"}, {"bias": True}, {"layer_norm": True}],
    ids=["temperature", "learnable", "bias", "layer_norm"],
)
def test_luong_decoder_keeps_the_attention_knobs(knobs: dict[str, object]) -> None:
    factory = partial(AdditiveAttention, num_hiddens=12, **knobs)
    if set(knobs) == {"temperature"}:  # every scoring function has a temperature; try another
        factory = partial(GeneralAttention, **knobs)
    torch.manual_seed(0)
    model = Seq2Seq(13, 11, factory, embedding_size=8, hidden_size=16, decoder=LuongDecoder).eval()
    src, src_lens, tgt_in = make_batch()
    logits, _ = model(src, src_lens, tgt_in)
    ref_logits, _ = stepwise_luong_reference(model, src, src_lens, tgt_in)
    torch.testing.assert_close(logits, ref_logits)


def test_each_decoder_has_the_parts_of_its_paper() -> None:
    bahdanau, luong = make_model(decoder="bahdanau"), make_model(decoder="luong")
    assert bahdanau.decoder.cell.input_size == 8 + 16  # [e; c]
    assert luong.decoder.cell.input_size == 8  # e only: no input feeding
    # Bahdanau: a bridge s_0 = tanh(W_b summary), an output layer over [s; c; e].
    assert bahdanau.decoder.bridge is not None and not hasattr(bahdanau.decoder, "attentional")
    assert bahdanau.decoder.output_layer.in_features == 16 + 16 + 8
    # Luong: the summary (16 = H) is h_0, and the logits read tanh(W_c [c; h]) (no bias in W_c).
    assert luong.decoder.bridge is None
    attentional = luong.decoder.attentional
    assert isinstance(attentional, nn.Linear) and attentional.bias is None
    assert (attentional.in_features, attentional.out_features) == (16 + 16, 16)
    assert luong.decoder.output_layer.in_features == 16
    # Every other parameter is shared, so one config switches between them.
    own = ("decoder.cell.weight_ih", "decoder.bridge.", "decoder.attentional.")
    own += ("decoder.output_layer.weight",)

    def shared(model: Seq2Seq) -> dict[str, torch.Size]:
        return {name: p.shape for name, p in model.named_parameters() if not name.startswith(own)}

    assert shared(luong) == shared(bahdanau)


@pytest.mark.parametrize("lstm", [False, True], ids=["gru", "lstm"])
def test_luong_starts_from_the_summary_or_a_bridge_when_sizes_differ(lstm: bool) -> None:
    src, src_lens, _ = make_batch()
    same = make_model(lstm=lstm, decoder="luong")  # encoder 2 x 8 = decoder 16
    _, summary = same.encoder(src, src_lens)
    _, state = same.encode(src, src_lens)
    assert torch.equal(state[0], summary)
    if lstm:
        assert torch.equal(state[1], torch.zeros_like(summary))  # the cell starts empty
    other = make_model(lstm=lstm, decoder="luong", encoder_hidden_size=5)  # 10 -> 16
    assert other.decoder.bridge is not None
    _, state = other.encode(src, src_lens)
    assert all(tensor.shape == (3, 16) for tensor in state)


@pytest.mark.parametrize("decoder", ["luong", "luong+feed"])
@pytest.mark.parametrize("lstm", [False, True], ids=["gru", "lstm"])
@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_luong_beam_one_is_greedy(attention: str, lstm: bool, decoder: str) -> None:
    model = make_model(attention, lstm, decoder=decoder)
    src, src_lens, _ = make_batch()
    assert_beam_one_is_greedy(model, src, src_lens)


@pytest.mark.parametrize("decoder", ["luong", "luong+feed"])
def test_luong_gradients_match_the_stepwise_reference(decoder: str) -> None:
    model = make_model("general", decoder=decoder).train()
    model.apply(
        lambda module: setattr(module, "p", 0.0) if isinstance(module, nn.Dropout) else None
    )
    src, src_lens, tgt_in = make_batch()
    logits, _ = model(src, src_lens, tgt_in, need_weights=False)
    grads = torch.autograd.grad(logits.square().sum(), list(model.decoder.parameters()))
    ref_logits, _ = stepwise_luong_reference(model, src, src_lens, tgt_in)
    ref_grads = torch.autograd.grad(ref_logits.square().sum(), list(model.decoder.parameters()))
    for grad, ref_grad in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-4)


def test_source_rows_are_selected_once_per_distinct_tensor() -> None:
    memory = torch.randn(3, 4, 8)
    projected = torch.randn(3, 4, 5)
    source = EncodedSource(memory, memory, projected, torch.tensor([4, 2, 3]))
    rows = torch.tensor([2, 2, 0])
    picked = source.index_select(rows)
    assert picked.keys is picked.memory  # still one tensor, selected once
    assert torch.equal(picked.memory, memory[rows])
    assert torch.equal(picked.projected_keys, projected[rows])
    assert picked.src_lens.tolist() == [3, 3, 4]


@pytest.mark.parametrize("decoder", VARIANTS)
@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_hypotheses_sharing_their_sentences_source_equal_a_source_copied_per_row(
    attention: str, decoder: str
) -> None:
    """Beam search steps B·K rows against B sentences (row b·K + k is hypothesis k of sentence
    b): the same logits, states and weights as with the source repeated for every row."""
    model = make_model(attention, decoder=decoder)
    src, src_lens, _ = make_batch()
    num_beams = 4
    with torch.no_grad():
        source, state = model.encode(src, src_lens)
        rows = torch.arange(len(src_lens)).repeat_interleave(num_beams)  # (B·K,)
        state = tuple(tensor.index_select(0, rows) for tensor in state)
        prev_tokens = torch.randint(4, 11, (len(rows),))  # a different token in every row
        for _ in range(3):
            shared = model.decode_step(prev_tokens, state, source)
            copied = model.decode_step(prev_tokens, state, source.index_select(rows))
            for got, expected in zip(shared, copied, strict=True):  # logits, state, weights
                torch.testing.assert_close(got, expected)
            state, prev_tokens = shared[1], shared[0].argmax(-1)


def test_query_rows_that_are_not_whole_hypotheses_per_sentence_are_refused() -> None:
    model = make_model()
    src, src_lens, _ = make_batch()
    with torch.no_grad():
        source, state = model.encode(src, src_lens)
        rows = torch.tensor([0, 0, 1, 1, 2])  # 5 rows for 3 sentences
        state = tuple(tensor.index_select(0, rows) for tensor in state)
        with pytest.raises(ValueError, match="5 query rows for 3 source sentences"):
            model.decode_step(torch.full((5,), BOS), state, source)


def test_input_feeding_feeds_the_attentional_vector_and_only_to_luong() -> None:
    fed = make_model(decoder="luong+feed")
    assert fed.decoder.cell.input_size == 8 + 16  # [e; h~]
    assert fed.decoder.state_names() == ["h", "feed"]
    src, src_lens, _ = make_batch()
    _, state = fed.encode(src, src_lens)
    assert torch.equal(state[1], torch.zeros(3, 16))  # h~_0 = 0: nothing attended yet
    with pytest.raises(ConfigError, match=r"model\.input_feeding=true is for the Luong decoder"):
        make_model(decoder="bahdanau+feed")


def test_input_feeding_state_is_what_the_next_step_reads() -> None:
    """The state's h~ after a step is the step's own attentional vector: feeding a different one
    changes the next logits (so beam search must reorder it with its beams)."""
    model = make_model("general", lstm=True, decoder="luong+feed")
    assert model.decoder.state_names() == ["h", "c", "feed"]
    src, src_lens, tgt_in = make_batch()
    source, state = model.encode(src, src_lens)
    _, state, _ = model.decode_step(tgt_in[:, 0], state, source)
    logits, _, _ = model.decode_step(tgt_in[:, 1], state, source)
    shuffled = (state[0], state[1], state[2].flip(0))
    other, _, _ = model.decode_step(tgt_in[:, 1], shuffled, source)
    assert not torch.allclose(logits, other)


def stepwise_coverage_reference(
    model: Seq2Seq, src: torch.Tensor, src_lens: torch.Tensor, tgt_in: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Bahdanau decoder with coverage written out one step at a time from the model's own
    parameters: c_0 = 0; additive scores e_ti = w_vᵀ tanh(W_q s_{t-1} + W_k m_i + w_c c_ti)
    (See et al. 2017, eq. 11), any other score(s_{t-1}, m_i) / T + γ c_ti; a_t = softmax over
    the real keys; c_{t+1} = c_t + a_t; context_t = a_t · memory; s_t = GRUCell([e_{t-1};
    context_t], s_{t-1}); logits_t = W_o [s_t; context_t; e_{t-1}] + b_o."""
    decoder = model.decoder
    attention = decoder.attention
    memory, summary = model.encoder(src, src_lens)  # (B, S, M), (B, M)
    keys = decoder.key_projection(memory)  # (B, S, K)
    hidden = torch.tanh(decoder.bridge(summary))  # (B, H)
    coverage = torch.zeros(src.shape)  # (B, S)
    is_real = torch.arange(src.shape[1])[None, :] < src_lens[:, None]  # (B, S)
    all_logits, all_weights = [], []
    for t in range(tgt_in.shape[1]):
        if isinstance(attention, AdditiveAttention):
            summed = (
                attention.W_q(hidden)[:, None, :]  # (B, 1, A)
                + attention.W_k(keys)  # (B, S, A)
                + coverage[:, :, None] * attention.coverage_weight  # (B, S, 1) · (A,)
            )
            scores = attention.w_v(torch.tanh(summed))[:, :, 0]  # (B, S)
        else:
            scores = attention.logits(hidden[:, None], attention.project_keys(keys))[:, 0]
            scores = scores + attention.coverage_weight * coverage  # (B, S)
        weights = scores.masked_fill(~is_real, float("-inf")).softmax(-1)  # (B, S)
        coverage = coverage + weights
        context = torch.bmm(weights[:, None], memory)[:, 0]  # (B,1,S) @ (B,S,M) -> (B, M)
        embedded = decoder.embedding(tgt_in[:, t])  # (B, E)
        hidden = decoder.cell(torch.cat([embedded, context], dim=-1), hidden)  # (B, H)
        features = torch.cat([hidden, context, embedded], dim=-1)  # (B, H + M + E)
        all_logits.append(decoder.output_layer(features))  # (B, V)
        all_weights.append(weights)
    return torch.stack(all_logits, 1), torch.stack(all_weights, 1)  # (B, T, V), (B, T, S)


@pytest.mark.parametrize("attention", ["additive", "scaled_dot", "general"])
def test_coverage_enters_the_score_as_written_out(attention: str) -> None:
    model = make_model(attention, decoder="bahdanau+coverage")
    weight = model.decoder.attention.coverage_weight
    assert weight is not None and weight.shape == ((12,) if attention == "additive" else ())
    src, src_lens, tgt_in = make_batch()
    logits, weights = model(src, src_lens, tgt_in)
    ref_logits, ref_weights = stepwise_coverage_reference(model, src, src_lens, tgt_in)
    torch.testing.assert_close(logits, ref_logits)
    assert weights is not None
    torch.testing.assert_close(weights, ref_weights)
    # The state's coverage after T steps is the weights summed, 0 at padding.
    source, state = model.encode(src, src_lens)
    for t in range(tgt_in.shape[1]):
        _, state, _ = model.decode_step(tgt_in[:, t], state, source)
    coverage = model.decoder.coverage_of(state)
    torch.testing.assert_close(coverage, weights.sum(dim=1))
    assert (coverage[1, 2:] == 0).all() and (coverage[2, 4:] == 0).all()


def test_coverage_starts_as_the_model_without_it() -> None:
    """w_c and γ start at 0: an untrained model with coverage computes what one without does."""
    src, src_lens, tgt_in = make_batch()
    plain = make_model("additive")
    covered = make_model("additive", decoder="bahdanau+coverage")
    with torch.no_grad():
        covered.decoder.attention.coverage_weight.zero_()
    covered.load_state_dict(plain.state_dict(), strict=False)
    torch.testing.assert_close(covered(src, src_lens, tgt_in), plain(src, src_lens, tgt_in))


def test_multi_head_coverage_scales_each_heads_logits() -> None:
    def two_heads(coverage: bool) -> Seq2Seq:
        torch.manual_seed(0)
        return Seq2Seq(
            13, 11, ATTENTIONS["additive"], embedding_size=8, hidden_size=16, num_heads=2,
            attention_parts=AttentionParts(coverage=coverage),
        ).eval()  # fmt: skip

    model = two_heads(coverage=True)
    randomize_coverage(model)
    assert model.decoder.attention.coverage_weight.shape == (2,)  # one γ per head
    src, src_lens, tgt_in = make_batch()
    logits, weights = model(src, src_lens, tgt_in)
    source, state = model.encode(src, src_lens)
    for t in range(tgt_in.shape[1]):
        step_logits, state, step_weights = model.decode_step(tgt_in[:, t], state, source)
        torch.testing.assert_close(step_logits, logits[:, t])
        torch.testing.assert_close(step_weights, weights[:, t])
    without = two_heads(coverage=False)
    without.load_state_dict(model.state_dict(), strict=False)
    assert not torch.allclose(without(src, src_lens, tgt_in)[0], logits)
