"""The scoring functions as the config defines them: every ``conf/attention/*.yaml``, found there
(no test lists them by hand), and models built around one the way ``train.py`` builds them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.utils import instantiate

from seq2seq.attention import Attention
from seq2seq.pipeline import build_model_config, scoring_config
from tests.configs import ROOT, compose_config

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
    "transformer": [
        "model=transformer",
        "model.d_model=16",
        "model.num_heads=2",
        "model.d_ff=32",
        "model.encoder_layers=1",
        "model.decoder_layers=1",
        "model.dropout=0.0",
        "model.attention_dropout=0.0",
    ],
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
