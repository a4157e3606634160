"""The Transformer: its layers against torch's with the same weights, causality, padding, the
position-wise FFN, and decoding from the key/value caches against recomputing the prefix.

Shape legend: B batch, S source length, T target length, D model size, V vocabulary.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from seq2seq.attention import (
    MultiHeadAttention,
)
from seq2seq.errors import ConfigError
from seq2seq.models.transformer import (
    PositionWiseFFN,
    Transformer,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
    TransformerSource,
)
from seq2seq.search import beam_search, greedy_search
from tests.scoring import SCORING_FUNCTIONS, scoring_factory
from tests.test_model import BOS, EOS, PAD, make_batch

# Every scoring function of conf/attention/, additive attention's hidden size made small.
SCORINGS = {name: scoring_factory(name, {"num_hiddens": 6}) for name in SCORING_FUNCTIONS}
D, HEADS, FF = 16, 4, 32


def make_transformer(
    attention: str = "scaled_dot", norm_first: bool = False, tie: bool = True
) -> Transformer:
    torch.manual_seed(0)
    return Transformer(
        src_vocab_size=13, tgt_vocab_size=11, attention=SCORINGS[attention], d_model=D,
        num_heads=HEADS, d_ff=FF, encoder_layers=2, decoder_layers=2, dropout=0.0,
        norm_first=norm_first, tie_embeddings=tie,
    ).eval()  # fmt: skip


def copy_attention(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
        theirs.out_proj.weight.copy_(ours.W_o.weight)
        theirs.out_proj.bias.copy_(ours.W_o.bias)


def copy_ffn_and_norms(ours: nn.Module, theirs: nn.Module, residuals: list[str]) -> None:
    with torch.no_grad():
        theirs.linear1.load_state_dict(ours.ffn.W_1.state_dict())
        theirs.linear2.load_state_dict(ours.ffn.W_2.state_dict())
        for index, name in enumerate(residuals, start=1):
            getattr(theirs, f"norm{index}").load_state_dict(getattr(ours, name).norm.state_dict())


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_an_encoder_layer_is_torchs(norm_first: bool) -> None:
    torch.manual_seed(1)
    ours = TransformerEncoderLayer(SCORINGS["scaled_dot"], D, HEADS, FF, 0.0, 0.0, norm_first)
    theirs = nn.TransformerEncoderLayer(
        D, HEADS, FF, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    copy_attention(ours.self_attention, theirs.self_attn)
    copy_ffn_and_norms(ours, theirs, ["attention_residual", "ffn_residual"])
    x, src_lens = torch.randn(3, 6, D), torch.tensor([6, 2, 4])
    padding = torch.arange(6)[None, :] >= src_lens[:, None]
    want = theirs.eval()(x, src_key_padding_mask=padding)
    got, weights = ours.eval()(x, src_lens)
    real = ~padding  # torch's fast path may leave padded positions' outputs unspecified
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
    assert weights.shape == (3, HEADS, 6, 6) and (weights[1, :, :, 2:] == 0).all()


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_a_decoder_layer_is_torchs(norm_first: bool) -> None:
    torch.manual_seed(2)
    ours = TransformerDecoderLayer(SCORINGS["scaled_dot"], D, HEADS, FF, 0.0, 0.0, norm_first)
    theirs = nn.TransformerDecoderLayer(
        D, HEADS, FF, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    copy_attention(ours.self_attention, theirs.self_attn)
    copy_attention(ours.cross_attention, theirs.multihead_attn)
    copy_ffn_and_norms(ours, theirs, ["self_residual", "cross_residual", "ffn_residual"])
    x, memory = torch.randn(3, 5, D), torch.randn(3, 6, D)
    src_lens = torch.tensor([6, 2, 4])
    padding = torch.arange(6)[None, :] >= src_lens[:, None]
    causal_mask = nn.Transformer.generate_square_subsequent_mask(5)
    want = theirs.eval()(x, memory, tgt_mask=causal_mask, memory_key_padding_mask=padding)
    cross = ours.cross_attention
    source = TransformerSource(
        memory, src_lens, [cross.project_keys(memory)], [cross.project_values(memory)]
    )
    causal = torch.arange(1, 6).expand(3, 5)
    got, weights, _ = ours.eval()(x, causal, source, 0)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert weights is not None and (weights[1, :, :, 2:] == 0).all()


def test_a_future_target_token_never_changes_an_earlier_output() -> None:
    model = make_transformer()
    src, src_lens, tgt_in = make_batch()
    logits, _ = model(src, src_lens, tgt_in)
    changed = tgt_in.clone()
    changed[:, 3] = (changed[:, 3] + 1) % 11
    changed_logits, _ = model(src, src_lens, changed)
    torch.testing.assert_close(changed_logits[:, :3], logits[:, :3])
    assert not torch.allclose(changed_logits[:, 3:], logits[:, 3:])


@pytest.mark.parametrize("attention", list(SCORINGS))
def test_appended_source_padding_changes_nothing(attention: str) -> None:
    model = make_transformer(attention)
    src, src_lens, tgt_in = make_batch()
    padded = torch.cat([src, torch.full((3, 4), PAD)], dim=1)
    for got, want in zip(
        model(padded, src_lens, tgt_in), model(src, src_lens, tgt_in), strict=True
    ):
        assert got is not None and want is not None
        if got.shape != want.shape:  # weights: the new keys get exactly zero
            assert (got[..., want.shape[-1] :] == 0).all()
            got = got[..., : want.shape[-1]]
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_the_ffn_acts_on_each_position_on_its_own() -> None:
    torch.manual_seed(3)
    ffn = PositionWiseFFN(D, FF)
    x = torch.randn(2, 7, D)
    order = torch.randperm(7)
    torch.testing.assert_close(ffn(x[:, order]), ffn(x)[:, order])


def recompute_greedy(model: Transformer, src: Tensor, src_lens: Tensor, steps: int) -> Tensor:
    """Greedy decoding that runs the whole prefix through the decoder at every step."""
    tokens = torch.full((src.shape[0], 1), BOS)
    for _ in range(steps):
        logits, _ = model(src, src_lens, tokens)
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens[:, 1:]


@pytest.mark.parametrize("attention", list(SCORINGS))
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_cached_decoding_is_recomputing_the_prefix(attention: str, norm_first: bool) -> None:
    """Each step from the caches gives teacher forcing's logits and weights; greedy search gives
    the tokens that recomputing the whole prefix at every step gives."""
    model = make_transformer(attention, norm_first)
    src, src_lens, tgt_in = make_batch()
    logits, weights = model(src, src_lens, tgt_in)
    assert weights is not None
    with torch.no_grad():
        source, state = model.encode(src, src_lens)
        for t in range(tgt_in.shape[1]):
            step_logits, state, step_weights = model.decode_step(tgt_in[:, t], state, source)
            torch.testing.assert_close(step_logits, logits[:, t], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(step_weights, weights[:, t], atol=1e-6, rtol=1e-5)
        assert len(state) == 2 * 2 and state[0].shape[:3] == (3, HEADS, tgt_in.shape[1])
        greedy = greedy_search(model, src, src_lens, BOS, EOS, PAD, max_len_a=0.0, max_len_b=6)
        expected = recompute_greedy(model, src, src_lens, 6)
    for row, length in enumerate(greedy.lengths.tolist()):
        assert torch.equal(greedy.tokens[row, :length], expected[row, :length])


def test_beam_search_shares_each_sentences_source_and_reorders_the_caches() -> None:
    """Beam 1 is greedy; and the beams of a batch are those of each sentence alone."""
    model = make_transformer("additive")
    src, src_lens, _ = make_batch()
    greedy = greedy_search(model, src, src_lens, BOS, EOS, PAD, max_len_a=1.0, max_len_b=3)
    one = beam_search(
        model, src, src_lens, BOS, EOS, PAD, beam_size=1, length_penalty=0.0, max_len_a=1.0,
        max_len_b=3,
    ).best  # fmt: skip
    assert torch.equal(one.tokens, greedy.tokens)
    batch = beam_search(model, src, src_lens, BOS, EOS, PAD, beam_size=4)
    for row in range(3):
        alone = beam_search(model, src[row : row + 1], src_lens[row : row + 1], BOS, EOS, PAD, 4)
        length = int(alone.best.lengths[0])
        assert torch.equal(batch.best.tokens[row, :length], alone.best.tokens[0, :length])
        torch.testing.assert_close(batch.best.scores[row], alone.best.scores[0])


def test_tied_embeddings_are_the_output_layer() -> None:
    tied, untied = make_transformer(tie=True), make_transformer(tie=False)
    assert tied.decoder.output_layer is None and untied.decoder.output_layer is not None
    x = torch.randn(2, D)
    torch.testing.assert_close(
        tied.decoder.logits(x), x @ tied.decoder.embedding.weight.T + tied.decoder.output_bias
    )
    names = dict(tied.named_parameters())
    assert "decoder.output_layer.weight" not in names  # one tensor, saved once


def test_cross_attention_maps_of_every_layer_and_head() -> None:
    model = make_transformer()
    src, src_lens, tgt_in = make_batch()
    source, _ = model.encode(src, src_lens)
    maps = model.decoder.cross_attention_weights(tgt_in, source)  # (B, L, h, T, S)
    assert maps.shape == (3, 2, HEADS, tgt_in.shape[1], src.shape[1])
    _, weights = model(src, src_lens, tgt_in)
    torch.testing.assert_close(maps[:, -1].mean(1), weights)  # the last layer's average


def test_bfloat16_autocast_gives_finite_logits_and_gradients() -> None:
    model = make_transformer("additive").train()
    src, src_lens, tgt_in = make_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, _ = model(src, src_lens, tgt_in)
    logits.float().logsumexp(-1).sum().backward()
    assert torch.isfinite(logits.float()).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_head_divergence_is_zero_for_alike_heads_and_log_2_for_disjoint_ones() -> None:
    from seq2seq.analysis.diagnostics import head_divergence

    alike = torch.softmax(torch.randn(2, 1, 3, 5), -1).expand(2, 4, 3, 5)  # four equal heads
    mask = torch.ones(2, 3, dtype=torch.bool)
    assert float(head_divergence(alike, mask)) == pytest.approx(0.0, abs=1e-12)
    one_hot = torch.eye(2)[None, :, None, :].expand(1, 2, 3, 2)  # head 1 on key 1, head 2 on key 2
    assert float(head_divergence(one_hot, mask[:1])) == pytest.approx(
        float(torch.log(torch.tensor(2.0)))
    )
    # Padded queries are left out: a divergent padded row changes nothing.
    mixed = torch.cat([alike[:1], one_hot.expand(1, 2, 3, 2).new_zeros(1, 4, 3, 5)], 0)
    mixed[1, 0, 2, 0] = 1.0
    mixed[1, 1, 2, 1] = 1.0
    assert float(
        head_divergence(mixed, torch.tensor([[1, 1, 1], [0, 0, 0]]).bool())
    ) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("init", ["pytorch", "xavier"])
def test_linear_layers_start_as_model_init_says(init: str) -> None:
    torch.manual_seed(0)
    model = Transformer(
        src_vocab_size=13, tgt_vocab_size=11, attention=SCORINGS["additive"], d_model=128,
        num_heads=4, d_ff=512, encoder_layers=1, decoder_layers=1, tie_embeddings=False,
        init=init,
    )  # fmt: skip
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    # Three attentions' projections and additive scorers, two FFNs, the untied output layer.
    assert len(linears) == 3 * 4 + 3 * 3 + 2 * 2 + 1
    for layer in linears:
        fan_out, fan_in = layer.weight.shape
        # Xavier-uniform: U(±√(6 / (fan_in + fan_out))); nn.Linear's: U(±1/√fan_in).
        bound = (6 / (fan_in + fan_out)) ** 0.5 if init == "xavier" else fan_in**-0.5
        assert layer.weight.abs().max() <= bound
        if layer.weight.numel() >= 10_000:  # the two differ by ≥ 1.7x in these
            assert layer.weight.std().item() == pytest.approx(bound / 3**0.5, rel=0.03)
        if init == "xavier":
            assert layer.bias is None or not layer.bias.any()
    # The embeddings keep their N(0, 1/D) either way.
    assert model.encoder.embedding.weight.std().item() == pytest.approx(128**-0.5, rel=0.1)


def test_an_unknown_init_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"model.init must be pytorch .* or xavier"):
        Transformer(13, 11, SCORINGS["scaled_dot"], d_model=D, num_heads=HEADS, init="he")
