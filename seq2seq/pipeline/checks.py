"""Config values checked before anything is built: one paragraph per problem, naming the key."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from seq2seq.errors import ConfigError
from seq2seq.inference.bundle import kernels_choice
from seq2seq.onednn_guard import bf16_error
from seq2seq.onednn_guard import report as onednn_report
from seq2seq.search import is_count
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


# Trainer settings that are counts, with their least value and whether -1 means "no limit"
# (Lightning's): Lightning asserts their type deep in its loop, with no message, and lets a
# max_steps=0 train nothing, so a word or a count out of range is refused here by name.
TRAINER_COUNTS = {
    "max_epochs": (1, True),
    "max_steps": (1, True),
    "min_epochs": (0, False),
    "min_steps": (0, False),
    "log_every_n_steps": (1, False),
    "check_val_every_n_epoch": (1, False),
    "accumulate_grad_batches": (1, False),
    "num_nodes": (1, False),
    "num_sanity_val_steps": (0, True),
}


def check_trainer_counts(cfg: DictConfig) -> None:
    for key, (least, unlimited) in TRAINER_COUNTS.items():
        value = OmegaConf.select(cfg, f"trainer.{key}", default=None)
        if value is None:
            continue
        if is_count(value) and (value >= least or (unlimited and value == -1)):
            continue
        allowed = f"a whole number of at least {least}" + (
            " (or -1: no limit)" if unlimited else ""
        )
        # The trainer configs lack most of these keys: Hydra adds one with +, sets one with none.
        add = "" if key in trainer_config_keys() else "+"
        raise ConfigError(
            f"trainer.{key}={value!r}: it must be {allowed}, e.g. {add}trainer.{key}="
            f"{max(least, 2)} on the command line."
        )


@functools.cache
def trainer_config_keys() -> frozenset[str]:
    """The keys of every trainer config: those of conf/trainer/default.yaml, which all extend."""
    default = Path(__file__).resolve().parents[1] / "conf" / "trainer" / "default.yaml"
    return frozenset(map(str, OmegaConf.load(default)))


def check_max_time(cfg: DictConfig) -> timedelta | None:
    """``trainer.max_time`` as a ``timedelta`` (``training_time``), None without a limit."""
    value = OmegaConf.select(cfg, "trainer.max_time", default=None)
    return None if value is None else training_time(value)


# The string's fields, then every unit timedelta takes (a mapping may use any of them).
TIME_FIELDS = ("days", "hours", "minutes", "seconds")
TIME_UNITS = ("weeks", *TIME_FIELDS, "milliseconds", "microseconds")


def training_time(value: object) -> timedelta:
    """``trainer.max_time`` as a positive ``timedelta``: "DD:HH:MM:SS" (any number of digits a
    field) or a mapping of ``timedelta``'s units ({hours: 1, minutes: 30}), the forms Lightning's
    Timer takes. Checked here: Lightning's own check lets a number through to an AttributeError,
    a negative part or a zero to a limit spent before the first step."""
    parts: dict[str, object] = {}
    if isinstance(value, str):
        fields = value.split(":")
        if len(fields) == len(TIME_FIELDS) and all(f.strip().isdecimal() for f in fields):
            parts = dict(zip(TIME_FIELDS, map(int, fields), strict=True))
    elif isinstance(value, Mapping | DictConfig):
        parts = {str(key): amount for key, amount in value.items()}
    valid = bool(parts) and all(
        unit in TIME_UNITS
        and isinstance(amount, int | float)
        and not isinstance(amount, bool)
        and 0 <= amount < math.inf
        for unit, amount in parts.items()
    )
    if not valid:
        raise ConfigError(max_time_message(value, "a training time longer than 0"))
    try:
        limit = timedelta(**{unit: float(amount) for unit, amount in parts.items()})  # type: ignore[arg-type]
    except OverflowError:
        raise ConfigError(
            max_time_message(value, f"at most {timedelta.max.days:,} days (Python's timedelta)")
        ) from None
    if limit <= timedelta():
        raise ConfigError(max_time_message(value, "a training time longer than 0"))
    return limit


def max_time_message(value: object, what: str) -> str:
    # YAML 1.1 reads an unquoted 1:30:00:00 as a sexagesimal number.
    quote = ' (in a YAML file, quote it: max_time: "00:01:30:00")' if type(value) is int else ""
    units = ", ".join(TIME_UNITS)
    return (
        f"trainer.max_time must be {what}, as days:hours:minutes:seconds such as "
        f'"00:01:30:00" for an hour and a half, or a mapping of {units}, quoted on the command '
        f"line: trainer.max_time='{{hours:1,minutes:30}}' (or null: no limit); got "
        f"{value!r}{quote}."
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
