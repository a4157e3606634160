"""The training loss: summed token cross-entropy, with label smoothing as its formula says,
guided alignment's cross-entropy to the gold attention, and the coverage loss."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from seq2seq.training.loss import (
    alignment_loss,
    coverage_loss,
    decoder_loss,
    gold_attention,
    guided_loss,
)
from tests.test_model import make_batch, make_model
from tests.test_transformer import make_transformer


def smoothed_cross_entropy(logits: Tensor, targets: Tensor, epsilon: float) -> Tensor:
    """Σ over real tokens of -(1 - ε) log p(y) - (ε / V) Σ_v log p(v), written out."""
    log_probs = logits.log_softmax(-1)  # (N, V)
    real = targets != 0
    nll = -log_probs.gather(1, targets[:, None])[:, 0]  # (N,)
    uniform = -log_probs.mean(-1)  # (N,): (1 / V) Σ_v -log p(v)
    return ((1 - epsilon) * nll + epsilon * uniform)[real].sum()


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("kind", ["rnn", "transformer"])
def test_label_smoothing_is_its_formula(epsilon: float, kind: str) -> None:
    model = make_model("dot", decoder="luong", dropout=0.0) if kind == "rnn" else make_transformer()
    src, src_lens, tgt_in = make_batch()
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full((3, 1), 3)], dim=1)
    tgt_out[2, 4:] = 0  # padding the loss must skip
    memory, summary = model.encoder(src, src_lens)
    state = model.initial_state(summary, memory)
    loss = decoder_loss(model.decoder, tgt_in, tgt_out, memory, src_lens, *state,
                        label_smoothing=epsilon)  # fmt: skip
    logits, _ = model(src, src_lens, tgt_in)
    expected = smoothed_cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), epsilon)
    torch.testing.assert_close(loss, expected, atol=1e-4, rtol=1e-5)


# ---- guided alignment --------------------------------------------------------------------------


def test_gold_attention_spreads_each_target_words_mass_over_its_links() -> None:
    links = [((0, 0), (2, 0), (1, 1)), None, ((3, 2), (9, 9))]  # (source, target)
    gold = gold_attention(links, src_steps=4, tgt_steps=3)  # (B, T, S)
    assert gold.shape == (3, 3, 4)
    torch.testing.assert_close(gold[0, 0], torch.tensor([0.5, 0.0, 0.5, 0.0]))  # two links
    torch.testing.assert_close(gold[0, 1], torch.tensor([0.0, 1.0, 0.0, 0.0]))
    assert (gold[0, 2] == 0).all()  # an unaligned target word: no target at all
    assert (gold[1] == 0).all()  # no gold alignment
    torch.testing.assert_close(gold[2, 2], torch.tensor([0.0, 0.0, 0.0, 1.0]))  # (9, 9) cut


def test_alignment_loss_is_the_cross_entropy_to_the_gold_attention() -> None:
    weights = torch.softmax(torch.randn(2, 3, 4), dim=-1)
    weights[1, :, 3] = 0.0  # a padded key: weight exactly 0, never gold
    gold = gold_attention([((0, 0), (1, 0), (2, 2)), ((2, 1),)], src_steps=4, tgt_steps=3)
    expected = -(
        0.5 * weights[0, 0, 0].log() + 0.5 * weights[0, 0, 1].log()
        + weights[0, 2, 2].log() + weights[1, 1, 2].log()
    )  # fmt: skip
    torch.testing.assert_close(alignment_loss(weights, gold), expected)


@pytest.mark.parametrize("kind", ["rnn", "transformer"])
def test_guided_loss_is_the_token_loss_plus_nothing_hidden(kind: str) -> None:
    """One pass gives the token loss of decoder_loss and the alignment loss of forward's map."""
    model = make_model("additive", dropout=0.0) if kind == "rnn" else make_transformer()
    src, src_lens, tgt_in = make_batch()
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full((3, 1), 3)], dim=1)
    gold = gold_attention([((0, 0), (1, 1)), ((1, 0),), None], src.shape[1], tgt_in.shape[1])
    token_loss, aligned = guided_loss(model, src, src_lens, tgt_in, tgt_out, gold, 0.1)
    memory, summary = model.encoder(src, src_lens)
    state = model.initial_state(summary, memory)
    expected = decoder_loss(model.decoder, tgt_in, tgt_out, memory, src_lens, *state,
                            label_smoothing=0.1)  # fmt: skip
    torch.testing.assert_close(token_loss, expected, atol=1e-4, rtol=1e-5)
    _, weights = model(src, src_lens, tgt_in)
    torch.testing.assert_close(aligned, alignment_loss(weights, gold))


def test_coverage_loss_is_see_et_al_eq_12_written_out() -> None:
    """Σ over real target steps t and source words i of min(a_ti, Σ_{t'<t} a_t'i)."""
    torch.manual_seed(0)
    weights = torch.rand(2, 4, 3).softmax(-1)  # (B, T, S)
    is_target = torch.tensor([[True, True, True, True], [True, True, False, False]])
    expected = 0.0
    for b in range(2):
        for t in range(4):
            if not is_target[b, t]:
                continue
            for i in range(3):
                before = sum(float(weights[b, u, i]) for u in range(t))
                expected += min(float(weights[b, t, i]), before)
    assert float(coverage_loss(weights, is_target)) == pytest.approx(expected, rel=1e-6)
    # The first step has nothing before it; attending the same word twice costs the smaller.
    once = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])  # each word once: no loss
    twice = torch.tensor([[[1.0, 0.0], [0.6, 0.4]]])  # 0.6 of word 0 again
    all_steps = torch.ones(1, 2, dtype=torch.bool)
    assert float(coverage_loss(once, all_steps)) == 0.0
    assert float(coverage_loss(twice, all_steps)) == pytest.approx(0.6)
