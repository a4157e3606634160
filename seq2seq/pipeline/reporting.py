"""What a run says about itself: its name, group and tags for the trackers, the effective
batch, and ``summary.json``."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from seq2seq.analysis.compare import SUMMARY_FILE
from seq2seq.atomic import write_atomic
from seq2seq.pipeline.building import attention_parts_config, model_kind
from seq2seq.training.lit_module import LitSeq2Seq
from seq2seq.training.loggers import RunInfo

log = logging.getLogger("seq2seq.pipeline")


def describe_run(
    cfg: DictConfig, run_dir: Path | None = None, chosen: Mapping[str, str] | None = None
) -> RunInfo:
    """Tracker name, group and tags from the chosen config options (``additive-gru-toy``): the
    Hydra app's, or ``chosen`` (``seq2seq.train`` composes the config itself); in a Hydra
    multirun the group is the sweep directory, so one sweep is one W&B group."""
    choices: dict[str, Any] = dict(chosen or {})
    group = None
    if HydraConfig.initialized():
        hydra = HydraConfig.get()
        choices = dict(hydra.runtime.choices)
        if hydra.mode == RunMode.MULTIRUN:
            group = str(hydra.sweep.dir)
    # Composed without the choices (the compose API in tests): the classes' names.
    attention = choices.get("attention") or cfg.attention._target_.rsplit(".", 1)[-1]
    model = choices.get("model") or model_kind(cfg)
    data = choices.get("data") or cfg.data.corpus._target_.rsplit(".", 1)[-1].lower()
    # BahdanauDecoder -> bahdanau; named only when it is not the default, so names stay short.
    decoder_node = OmegaConf.select(cfg, "model.decoder._target_", default=None)
    decoder = (
        str(decoder_node).rsplit(".", 1)[-1].removesuffix("Decoder").lower()
        if decoder_node
        else "transformer"
    )
    model_name = model if decoder in ("bahdanau", "transformer") else f"{model}-{decoder}"
    # An RNN decoder's heads and input feeding change the model: named too (the Transformer's
    # heads are its architecture's).
    heads = OmegaConf.select(cfg, "model.num_heads", default=None)
    if decoder != "transformer" and isinstance(heads, int) and heads > 1:
        model_name += f"-heads{heads}"
    if OmegaConf.select(cfg, "model.input_feeding", default=False):
        model_name += "-feed"
    parts = parts_label(cfg)
    attention = f"{attention}+{parts}" if parts else attention
    if run_dir is not None:  # the directory resolve_run_dir chose (a resumed run's own)
        cfg = cfg.copy()
        with open_dict(cfg):
            cfg.run_dir = str(run_dir)
    config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config, dict)
    name = f"{attention}-{model_name}-{data}"
    # ``seed`` is in the config already; ``setting`` is the same for every seed of a setting, so
    # that W&B groups the seeds of one setting (Group by: setting) as compare_runs.py does.
    return RunInfo(
        name=name,
        group=group,
        tags=(str(attention), str(model), str(data), decoder),
        config={**{str(key): value for key, value in config.items()}, "setting": name},
    )


def parts_label(cfg: DictConfig) -> str:
    """The attention's parts that differ from global softmax, for names and tables:
    ``sparsemax``, ``entmax1.3``, ``entmax_alpha=learnable``, ``local_p3``, ``key_bias``,
    ``coverage``, joined by ``+``; ""
    by default."""
    parts = attention_parts_config(cfg)
    shown = []
    normalizer = parts["normalizer"]
    if isinstance(normalizer, dict):
        shown.append(str(normalizer.get("_target_", "own")).rsplit(".", 1)[-1])
    elif normalizer == "entmax" and parts["alpha"] == "learnable":
        shown.append("entmax_alpha=learnable")  # not "entmaxlearnable"
    elif normalizer == "entmax":
        shown.append(f"entmax{parts['alpha'] if parts['alpha'] is not None else 1.5}")
    elif normalizer != "softmax":
        shown.append(str(normalizer))
    if parts["window"] != "global":
        size = parts["window_size"] if parts["window_size"] is not None else 10
        shown.append(f"{parts['window']}{size}")
    if parts["key_bias"]:
        shown.append("key_bias")
    if parts.get("coverage"):
        shown.append("coverage")
    return "+".join(shown)


def log_effective_batch(cfg: DictConfig, trainer: pl.Trainer) -> None:
    """State how many sentences (or tokens) one optimizer step sees over all processes."""
    accumulate = trainer.accumulate_grad_batches
    processes = trainer.num_devices * trainer.num_nodes
    unit, size = (
        ("padded tokens", cfg.data.max_tokens)
        if cfg.data.max_tokens
        else ("sentences", cfg.data.batch_size)
    )
    log.info(
        "effective batch: %s %s per process x %d process(es) x %d accumulation step(s) = %s %s "
        "per optimizer step",
        size,
        unit,
        processes,
        accumulate,
        size * processes * accumulate,
        unit,
    )


def write_summary(run_dir: Path, run: RunInfo, module: LitSeq2Seq, result: dict[str, Any]) -> None:
    """``RUN/summary.json``: what ``scripts/compare_runs.py`` puts in its table."""
    metrics = result["metrics"]
    summary = {
        "name": run.name,
        "attention": run.tags[0] if run.tags else None,
        "model": run.tags[1] if len(run.tags) > 1 else None,
        "data": run.tags[2] if len(run.tags) > 2 else None,
        "parameters": sum(parameter.numel() for parameter in module.model.parameters()),
        "best_val_bleu": result["best_val_bleu"],
        "test_bleu": metrics.get("test/bleu"),
        "test_aer": metrics.get("test/aer"),
        "train_seconds": module.total_train_seconds,
        "train_tokens": module.total_train_tokens,
        "train_tokens_per_s": module.total_train_tokens / module.total_train_seconds
        if module.total_train_seconds
        else None,
    }
    text = json.dumps(summary, indent=2) + "\n"
    write_atomic(run_dir / SUMMARY_FILE, lambda path: path.write_text(text, encoding="utf-8"))


# A test figure's name and digits: BLEU and chrF as sacreBLEU prints them, AER to 3; the rest
# (loss, the attention diagnostics) by their logged names, to 4 significant digits.
TEST_FIGURES = {"test/bleu": ("BLEU", 2), "test/chrf": ("chrF", 2), "test/aer": ("AER", 3)}


def test_report(metrics: Mapping[str, float]) -> str:
    """The test pass's figures in one line, rounded (Lightning's own table prints every float
    to 16 digits): ``Test (best checkpoint): BLEU 97.70, chrF 98.12, loss 0.0412, AER 0.123``."""
    cells = []
    for name, value in metrics.items():
        if name in TEST_FIGURES:
            label, digits = TEST_FIGURES[name]
            cells.append(f"{label} {value:.{digits}f}")
        else:
            cells.append(f"{name.removeprefix('test/')} {value:.4g}")
    return "Test (best checkpoint): " + ", ".join(cells)


def format_bleu(bleu: float | None, last: float | None = None) -> str:
    """The best val BLEU as sacreBLEU prints a score, or why there is none: no validation ran,
    or one ran (``last``, its val/bleu) but no checkpoint kept a best (``trainer.fast_dev_run``
    keeps none)."""
    if bleu is not None:
        return f"{bleu:.2f}"
    if last is not None:
        return f"– (no checkpoint was kept; the last validation scored {last:.2f})"
    return "– (no validation ran)"
