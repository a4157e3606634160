"""From the config to the objects training runs: the model config, the LightningModule, the
optimizer factory and the Trainer's arguments; which user modules the config trusts."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from seq2seq.attention import AttentionParts
from seq2seq.data.datamodule import Seq2SeqDataModule
from seq2seq.data.tokenization import PAD_ID
from seq2seq.inference.bundle import ALLOWED_TARGETS, build_model
from seq2seq.pipeline.checks import check_label_smoothing, check_loss_weight, check_search
from seq2seq.training.lit_module import LitSeq2Seq


def trusted_by_config(cfg: DictConfig) -> list[str]:
    """The modules whose code training may import: ``trust_modules`` and the modules of a scoring
    function ``attention._target_`` and a normalizer ``attention.normalizer._target_`` name that
    are not built in. The user's own config named them, as it names every class Hydra builds; a
    checkpoint's config is trusted only as far as this command's is (resuming)."""
    trusted = [str(entry) for entry in cfg.get("trust_modules") or []]
    for key in ("attention._target_", "attention.normalizer._target_"):
        target = OmegaConf.select(cfg, key, default=None)
        if isinstance(target, str) and target not in ALLOWED_TARGETS and "." in target:
            trusted.append(target.rpartition(".")[0])
    return trusted


# The attention group's keys that are not the scoring function's: ``AttentionParts``' fields.
PART_KEYS = tuple(field.name for field in dataclasses.fields(AttentionParts))


def scoring_config(attention: DictConfig) -> dict[str, Any]:
    """The ``attention`` group's node as the scoring function's ``_partial_`` config, resolved:
    without ``num_heads`` (renamed ``model.num_heads``: ``check_model_sizes`` refuses it) and
    without the other parts of the attention (``attention_parts_config``)."""
    config = OmegaConf.to_container(attention, resolve=True)
    assert isinstance(config, dict)
    return {
        str(key): value
        for key, value in config.items()
        if key != "num_heads" and key not in PART_KEYS
    }


def attention_parts_config(cfg: DictConfig) -> dict[str, Any]:
    """The ``attention`` group's normalizer, window and key-bias keys as the model's
    ``attention_parts`` (``seq2seq.attention.AttentionParts``), resolved; the key bias covers
    ``data.max_src_len`` positions (``decoding.max_src_len`` for data without that limit) unless
    ``attention.key_bias_positions`` says otherwise."""
    parts = {key: OmegaConf.select(cfg, f"attention.{key}", default=None) for key in PART_KEYS}
    parts = {
        key: OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
        for key, value in parts.items()
    }
    defaults = AttentionParts()
    for key in ("normalizer", "window", "key_bias", "coverage"):
        if parts[key] is None:
            parts[key] = getattr(defaults, key)
    if parts["key_bias"] is True and parts["key_bias_positions"] is None:
        limit = OmegaConf.select(cfg, "data.max_src_len", default=None)
        parts["key_bias_positions"] = limit or OmegaConf.select(cfg, "decoding.max_src_len")
    return {"_target_": "seq2seq.attention.AttentionParts", **parts}


def build_model_config(cfg: DictConfig, src_vocab_size: int, tgt_vocab_size: int) -> dict[str, Any]:
    """The resolved ``Seq2Seq`` config: ``cfg.model`` plus vocabulary sizes and the attention."""
    model_config = OmegaConf.to_container(cfg.model, resolve=True)
    attention_config = scoring_config(cfg.attention)
    assert isinstance(model_config, dict)
    model_config.pop("fused_rnn", None)  # null unless set, and then check_model_sizes refused it
    if model_kind(cfg) == "transformer":
        model_config.pop("input_feeding", None)  # false: check_model_sizes refused true
    heads = model_config.get("num_heads", 1)
    if type(heads) is int and heads == 1 and model_kind(cfg) != "transformer":
        # A single-head RNN model's files never held the key: they stay as they were.
        model_config.pop("num_heads", None)
    model_config.update(
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        padding_idx=PAD_ID,
        attention=attention_config,
        attention_parts=attention_parts_config(cfg),
    )
    return {str(key): value for key, value in model_config.items()}


def model_kind(cfg: DictConfig) -> str:
    """gru, lstm or transformer: the model's recurrent layer, or the Transformer."""
    rnn = OmegaConf.select(cfg, "model.rnn._target_", default=None)
    return str(rnn).rsplit(".", 1)[-1].lower() if rnn else "transformer"


def build_module(
    cfg: DictConfig, datamodule: Seq2SeqDataModule, model_config: dict[str, Any]
) -> LitSeq2Seq:
    """The LightningModule ``cfg`` describes: the model of ``model_config`` (``build_model_config``)
    with ``datamodule``'s vocabularies, and the optimizer, schedule and decoding of ``cfg``."""
    assert datamodule.src_tokenizer is not None and datamodule.tgt_tokenizer is not None
    return LitSeq2Seq(
        model=build_model(
            model_config,
            "the model.* and attention.* settings",
            "Fix them on the command line (the defaults are in conf/model/ and conf/attention/).",
            trust_modules=trusted_by_config(cfg),
        ),
        src_tokenizer=datamodule.src_tokenizer,
        tgt_tokenizer=datamodule.tgt_tokenizer,
        model_config=model_config,
        optimizer=build_optimizer(cfg),
        scheduler=instantiate(cfg.optim.scheduler) if cfg.optim.scheduler else None,
        grad_clip=cfg.optim.grad_clip,
        max_len_a=cfg.decoding.max_len_a,
        max_len_b=cfg.decoding.max_len_b,
        max_src_len=cfg.decoding.max_src_len,
        **check_search(cfg),
        bleu_tokenize=cfg.data.bleu_tokenize,
        cuda_graphs=cfg.cuda_graphs,
        label_smoothing=check_label_smoothing(cfg.optim.get("label_smoothing", 0.0)),
        alignment_loss_weight=check_loss_weight(
            cfg.optim.get("alignment_loss_weight", 0.0), "alignment"
        ),
        coverage_loss_weight=check_loss_weight(
            cfg.optim.get("coverage_loss_weight", 0.0), "coverage"
        ),
    )


# Where ``fused: null`` picks the fused optimizer kernel: float32 training (Lightning's names).
FULL_PRECISIONS = ("32-true", "32")


def build_optimizer(cfg: DictConfig) -> functools.partial[torch.optim.Optimizer]:
    """The optimizer factory of ``cfg.optim.optimizer``, with ``fused: null`` resolved: the fused
    kernel when the optimizer has one and training runs in full precision (``trainer.precision``),
    else the optimizer's default. An explicit true or false is passed on as it is."""
    factory = instantiate(cfg.optim.optimizer)
    keywords = dict(factory.keywords)
    if "fused" in keywords and keywords["fused"] is None:
        del keywords["fused"]
        has_fused = "fused" in inspect.signature(factory.func).parameters
        if has_fused and str(cfg.trainer.precision) in FULL_PRECISIONS:
            keywords["fused"] = True
    return functools.partial(factory.func, *factory.args, **keywords)


# Config keys in cfg.trainer that are ours, not pl.Trainer arguments.
NON_TRAINER_KEYS = ("skip_nonfinite",)


def trainer_config(cfg: DictConfig) -> DictConfig:
    """``cfg.trainer`` without the keys that are not ``pl.Trainer`` arguments."""
    keys = [str(key) for key in cfg.trainer if key not in NON_TRAINER_KEYS]
    return OmegaConf.masked_copy(cfg.trainer, keys)
