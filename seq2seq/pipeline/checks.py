"""Config values checked before anything is built: one paragraph per problem, naming the key."""

from __future__ import annotations

import logging
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from seq2seq.errors import ConfigError
from seq2seq.inference.bundle import kernels_choice
from seq2seq.onednn_guard import bf16_error
from seq2seq.onednn_guard import report as onednn_report
from seq2seq.training.distributed import is_nonzero_rank_from_env

log = logging.getLogger("seq2seq.pipeline")


def missing_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    """Keys whose value is ``???``, found without resolving interpolations (which would fail)."""
    missing = []
    for key in map(str, cfg):
        if OmegaConf.is_missing(cfg, key):
            missing.append(f"{prefix}{key}")
            continue
        child = cfg._get_node(key)  # the node itself: reading the value would resolve it
        if isinstance(child, DictConfig) and not OmegaConf.is_interpolation(cfg, key):
            missing.extend(missing_keys(child, f"{prefix}{key}."))
    return missing


def check_model_sizes(cfg: DictConfig) -> None:
    """Sizes that cannot build a working model, named by their config key before torch sees them."""
    problems = []  # sizes and probabilities out of range, each with what it must be
    explained = []  # other settings, each with its own fix
    for key in (
        "model.embedding_size",
        "model.hidden_size",
        "model.encoder_hidden_size",
        "model.encoder_layers",
        "model.decoder_layers",
        "model.d_model",
        "model.d_ff",
        "attention.num_hiddens",
    ):
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None and (type(value) is not int or value < 1):
            problems.append(f"{key}={value} (it must be a positive integer)")
    for key in ("model.dropout", "model.attention_dropout", "attention.dropout"):
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None and (type(value) not in (int, float) or not 0 <= value < 1):
            problems.append(f"{key}={value} (a probability: at least 0, below 1)")
    fused = OmegaConf.select(cfg, "model.fused_rnn", default=None)
    if fused is not None:
        replacement, shown = ("auto", "true") if fused is True else ("off", str(fused).lower())
        explained.append(
            f"model.fused_rnn={shown} (renamed: the C kernels are now chosen with model.kernels, "
            f"auto or off; use model.kernels={replacement})"
        )
    feeding = OmegaConf.select(cfg, "model.input_feeding", default=None)
    if feeding is not None and not isinstance(feeding, bool):
        explained.append(
            f"model.input_feeding={feeding} (it must be true or false: true feeds the Luong "
            "decoder's attentional vector to its next step, Luong et al. 2015, section 3.3)"
        )
    elif feeding and str(OmegaConf.select(cfg, "model._target_")).endswith(".Transformer"):
        explained.append(
            "model.input_feeding=true with model=transformer (input feeding is the Luong RNN "
            "decoder's: a Transformer decoder step already reads every earlier step through its "
            "self-attention; use model=gru model.decoder=luong model.input_feeding=true)"
        )
    heads = OmegaConf.select(cfg, "attention.num_heads", default=None)
    if heads is not None:
        explained.append(
            f"attention.num_heads={heads} (renamed: the heads of every attention, RNN or "
            f"Transformer, are model.num_heads; use model.num_heads={heads}, and leave "
            "attention.num_heads null, as the attention YAMLs in conf/attention have it)"
        )
    kernels_choice({"kernels": OmegaConf.select(cfg, "model.kernels", default="auto")})
    if problems or explained:
        fix = ""
        if problems:  # the sizes' example; the others say what to set
            fix = (
                f" Set {'these' if len(problems) > 1 else 'it'} on the command line, e.g. "
                "seq2seq train model.hidden_size=256 model.encoder_layers=1 model.dropout=0.1."
            )
        raise ConfigError(f"the model cannot be built with {'; '.join(problems + explained)}.{fix}")


# Trainer settings that are counts: Lightning asserts their type deep in its loop, with no
# message, so a word given for one ("trainer.max_epochs=one") is refused here by name.
TRAINER_COUNTS = (
    "max_epochs", "max_steps", "min_epochs", "min_steps", "log_every_n_steps",
    "check_val_every_n_epoch", "accumulate_grad_batches", "num_nodes", "num_sanity_val_steps",
)  # fmt: skip


def check_trainer_counts(cfg: DictConfig) -> None:
    for key in TRAINER_COUNTS:
        value = OmegaConf.select(cfg, f"trainer.{key}", default=None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(
                f"trainer.{key}={value!r}: it must be a whole number, e.g. trainer.{key}=2."
            )


def check_cpu_precision(cfg: DictConfig) -> None:
    """Say what the oneDNN guard decided (``seq2seq.onednn_guard``), and refuse bf16 autocast on
    a CPU where it would die of an illegal instruction."""
    message = onednn_report()
    if message is not None and not is_nonzero_rank_from_env():
        log.info(message)
    precision = str(OmegaConf.select(cfg, "trainer.precision", default="32"))
    on_cpu = OmegaConf.select(cfg, "trainer.accelerator", default="auto") == "cpu" or not (
        torch.cuda.is_available()
    )
    error = bf16_error()
    if precision.startswith("bf16") and on_cpu and error is not None:
        raise ConfigError(error)


def check_label_smoothing(value: Any) -> float:
    if type(value) not in (int, float) or not 0 <= value < 1:
        raise ConfigError(
            f"optim.label_smoothing must be at least 0 and below 1 (the probability mass spread "
            f"over the vocabulary), got {value!r}; e.g. optim.label_smoothing=0.1."
        )
    return float(value)


# The training loss's terms on the attention weights: optim.NAME_loss_weight -> what it weighs.
LOSS_TERMS = {
    "alignment": "alignment cross-entropy",
    "coverage": "coverage loss (attention given again to words already attended)",
}


def check_loss_weight(value: Any, name: str) -> float:
    """``optim.NAME_loss_weight`` (λ of a term of ``LOSS_TERMS``) as a float, or a ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e6:
        raise ConfigError(
            f"optim.{name}_loss_weight must be a number of at least 0 (the weight of the "
            f"{LOSS_TERMS[name]} in the training loss; 0 turns it off), got {value!r}; "
            f"e.g. optim.{name}_loss_weight=0.5."
        )
    return float(value)


def check_search(cfg: DictConfig) -> dict[str, Any]:
    """``decoding.beam_size``, ``length_penalty`` and ``coverage_penalty``, the search of
    validation and test (``LitSeq2Seq``'s arguments), or a ConfigError naming the key."""
    beam = OmegaConf.select(cfg, "decoding.beam_size", default=1)
    alpha = OmegaConf.select(cfg, "decoding.length_penalty", default=0.6)
    beta = OmegaConf.select(cfg, "decoding.coverage_penalty", default=0.0)
    problems = []
    if type(beam) is not int or beam < 1:
        problems.append(f"decoding.beam_size={beam} (an integer of at least 1; 1: greedy)")
    for key, value in (("length_penalty", alpha), ("coverage_penalty", beta)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 10:
            problems.append(f"decoding.{key}={value} (a number from 0 to 10)")
    if problems:
        raise ConfigError(
            f"validation and test cannot decode with {'; '.join(problems)}. Set "
            f"{'them' if len(problems) > 1 else 'it'} on the command line, e.g. seq2seq train "
            "decoding.beam_size=5 decoding.length_penalty=0.6 decoding.coverage_penalty=0.2."
        )
    return {"beam_size": beam, "length_penalty": float(alpha), "coverage_penalty": float(beta)}


def check_alignment_data(cfg: DictConfig) -> None:
    """Gold alignments of files (``data.align``) link whitespace-separated words: they are the
    model's tokens only with ``data.tokenizer=whitespace``."""
    align = OmegaConf.select(cfg, "data.align", default=None)
    tokenizer = OmegaConf.select(cfg, "data.tokenizer", default=None)
    if align and tokenizer != "whitespace":
        raise ConfigError(
            f"data.align={align} gives gold links between whitespace-separated words, but "
            f"data.tokenizer={tokenizer} makes other tokens, so the links would point at the wrong "
            "positions. Use data.tokenizer=whitespace on pre-tokenized text, or data.align=null."
        )
