"""The scoring functions as the config defines them: every ``conf/attention/*.yaml``, found there
(no test lists them by hand), models built around one the way ``train.py`` builds them, and the
check that every path of such a model computes the attention through ``score``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from torch import Tensor

from seq2seq.attention import Attention
from seq2seq.data.tokenization import BOS_ID, EOS_ID, PAD_ID
from seq2seq.models import EncoderDecoder
from seq2seq.pipeline import build_model_config, scoring_config
from seq2seq.search import beam_search, greedy_search
from seq2seq.training.loss import DecoderLoss, teacher_forced_loss
from tests.configs import ROOT, TINY_TRANSFORMER, compose_config

ATTENTION_CONF = ROOT / "conf" / "attention"

# Every scoring function the config offers: what attention=NAME accepts.
SCORING_FUNCTIONS = sorted(path.stem for path in ATTENTION_CONF.glob("*.yaml"))

# Small models of each family, without dropout, so that two paths can be compared exactly.
MODEL_OVERRIDES = {
    "bahdanau": ["model.hidden_size=16", "model.embedding_size=8", "model.dropout=0.0"],
    "luong": [
        "model.decoder=luong",
        "model.hidden_size=16",
        "model.embedding_size=8",
        "model.dropout=0.0",
    ],
    "transformer": [*TINY_TRANSFORMER, "model.dropout=0.0", "model.attention_dropout=0.0"],
}


def model_config(
    family: str,
    scoring: str,
    overrides: Sequence[str] = (),
    vocab_sizes: tuple[int, int] = (13, 11),
) -> dict[str, Any]:
    """The model config ``python train.py attention=SCORING`` (plus the family's overrides)
    builds, with these vocabulary sizes."""
    cfg = compose_config([f"attention={scoring}", *MODEL_OVERRIDES[family], *overrides])
    return build_model_config(cfg, *vocab_sizes)


def make_scoring(
    name: str, query_size: int, key_size: int, overrides: Sequence[str] = ()
) -> Attention:
    """The scoring function of ``conf/attention/NAME.yaml`` for these sizes."""
    cfg = compose_config([f"attention={name}", *overrides])
    factory = instantiate(scoring_config(cfg.attention))
    scoring = factory(query_size=query_size, key_size=key_size)
    assert isinstance(scoring, Attention)
    return scoring


def batch() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """src (B, S), src_lens (B,), tgt_in, tgt_out (B, T): sentences of different lengths, ids
    below the vocabulary sizes of ``model_config``'s default."""
    generator = torch.Generator().manual_seed(1)
    src_lens = torch.tensor([7, 5, 3, 6])
    src = torch.randint(4, 13, (4, 7), generator=generator)
    src[torch.arange(7)[None, :] >= src_lens[:, None]] = PAD_ID
    tgt_lens = torch.tensor([6, 4, 5, 2])
    tgt = torch.randint(4, 11, (4, 6), generator=generator)
    tgt[torch.arange(6)[None, :] >= tgt_lens[:, None]] = PAD_ID
    tgt_in = torch.cat([torch.full((4, 1), BOS_ID), tgt[:, :-1]], dim=1)  # BOS, then the target
    return src, src_lens, tgt_in, tgt


def loss_through_score(
    model: EncoderDecoder, src: Tensor, src_lens: Tensor, tgt_in: Tensor, tgt_out: Tensor
) -> Tensor:
    """The summed cross-entropy from the model's forward with the weights: every attention
    computed by ``Attention.forward``, i.e. by ``score``."""
    logits, _ = model(src, src_lens, tgt_in, need_weights=True)  # (B, T, V)
    return F.cross_entropy(
        logits.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=PAD_ID, reduction="sum"
    )


def gradients(model: EncoderDecoder) -> dict[str, Tensor]:
    return {
        name: parameter.grad.clone()
        for name, parameter in model.named_parameters()
        if parameter.grad is not None
    }


def assert_attention_follows_score(
    model: EncoderDecoder, reference: EncoderDecoder, family: str
) -> None:
    """Training (the loss as ``LitSeq2Seq`` computes it, without weights, and its gradients),
    validation (the same in eval mode) and decoding (greedy and beam outputs, and each step's
    attention) of ``model`` equal what ``reference`` (the same weights) computes through
    ``score``."""
    src, src_lens, tgt_in, tgt_out = batch()
    model.train()
    reference.train()
    loss = teacher_forced_loss(model, DecoderLoss(model.decoder), src, src_lens, tgt_in, tgt_out)
    loss.backward()
    expected = loss_through_score(reference, src, src_lens, tgt_in, tgt_out)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-4)
    ours, theirs = gradients(model), gradients(reference)
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-4, atol=1e-5, msg=name)

    model.eval()
    reference.eval()
    with torch.no_grad():
        loss = teacher_forced_loss(
            model, DecoderLoss(model.decoder), src, src_lens, tgt_in, tgt_out
        )
        expected = loss_through_score(reference, src, src_lens, tgt_in, tgt_out)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-4)

    # Decoding: the outputs, and the attention each step used, are what the reference computes
    # when it is fed those outputs.
    ids = {"bos_id": BOS_ID, "eos_id": EOS_ID, "pad_id": PAD_ID, "max_len_b": 4}
    greedy = greedy_search(model, src, src_lens, **ids)
    beam = beam_search(model, src, src_lens, beam_size=3, **ids).best
    for hypotheses in (greedy, beam):
        steps = hypotheses.tokens.shape[1]
        fed = torch.cat([torch.full((4, 1), BOS_ID), hypotheses.tokens[:, :-1]], dim=1)  # (B, L)
        with torch.no_grad():
            logits, weights = reference(src, src_lens, fed, need_weights=True)
        assert weights is not None
        real = torch.arange(steps)[None, :] < hypotheses.lengths[:, None]  # (B, L)
        if family == "transformer" and weights.dim() == 4:
            weights = weights.mean(dim=1)  # (B, h, L, S) -> the heads' mean, as search reports
        torch.testing.assert_close(hypotheses.attention[real], weights[real], rtol=1e-4, atol=1e-5)
        if hypotheses is greedy:
            assert torch.equal(logits.argmax(-1)[real], hypotheses.tokens[real])


def scoring_factory(
    name: str, settings: Mapping[str, Any] | None = None
) -> Callable[..., Attention]:
    """``conf/attention/NAME.yaml``'s scoring function as the model gets it (a factory of
    ``query_size`` and ``key_size``), with each of ``settings`` (e.g. ``num_hiddens``,
    ``temperature``) applied where that YAML has the key."""
    config = scoring_config(compose_config([f"attention={name}"]).attention)
    config.update({key: value for key, value in (settings or {}).items() if key in config})
    factory = instantiate(config)
    assert isinstance(factory, functools.partial) and issubclass(factory.func, Attention)
    return factory


def needs_equal_sizes(name: str) -> bool:
    """Whether NAME's scoring function takes only keys of the query's size (dot products)."""
    return bool(scoring_factory(name).func.needs_equal_sizes)
