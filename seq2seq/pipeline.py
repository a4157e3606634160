"""Entry points behind ``train.py`` and the scripts: build everything from the config and run it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import ModelCheckpoint

from seq2seq.atomic import write_atomic
from seq2seq.bundle import build_model, load
from seq2seq.callbacks import ValidationExamples
from seq2seq.compare import SUMMARY_FILE
from seq2seq.data.datamodule import Seq2SeqDataModule
from seq2seq.data.tokenization import PAD_ID
from seq2seq.diagnostics import AttentionDiagnostics
from seq2seq.distributed import is_nonzero_rank_from_env
from seq2seq.errors import ConfigError
from seq2seq.lit_module import LitSeq2Seq
from seq2seq.loggers import RunInfo, csv_logger, finish

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train the model ``cfg`` describes; returns the best val BLEU, its checkpoint and metrics.

    Under DDP every rank runs this; only rank zero writes files.
    """
    missing = missing_keys(cfg)
    if missing:
        raise ConfigError(
            f"the config needs a value for {', '.join(missing)} (marked ??? in conf/). Set it on "
            f"the command line, e.g. python train.py ... {missing[0]}=VALUE."
        )
    run_dir = Path(cfg.run_dir)
    is_rank_zero = not is_nonzero_rank_from_env()
    if is_rank_zero:
        run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    pl.seed_everything(cfg.seed, workers=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)

    datamodule: Seq2SeqDataModule = instantiate(cfg.data.module)
    datamodule.setup("fit")
    assert datamodule.src_tokenizer is not None and datamodule.tgt_tokenizer is not None
    if is_rank_zero:
        datamodule.src_tokenizer.save(str(run_dir / "src_tokenizer.json"))
        datamodule.tgt_tokenizer.save(str(run_dir / "tgt_tokenizer.json"))

    model_config = build_model_config(
        cfg,
        datamodule.src_tokenizer.get_vocab_size(),
        datamodule.tgt_tokenizer.get_vocab_size(),
    )
    module = LitSeq2Seq(
        model=build_model(model_config),
        src_tokenizer=datamodule.src_tokenizer,
        tgt_tokenizer=datamodule.tgt_tokenizer,
        model_config=model_config,
        optimizer=instantiate(cfg.optim.optimizer),
        scheduler=instantiate(cfg.optim.scheduler) if cfg.optim.scheduler else None,
        grad_clip=cfg.optim.grad_clip,
        max_len_a=cfg.decoding.max_len_a,
        max_len_b=cfg.decoding.max_len_b,
        max_src_len=cfg.decoding.max_src_len,
        bleu_tokenize=cfg.data.bleu_tokenize,
    )
    checkpoint = ModelCheckpoint(
        dirpath=run_dir / "checkpoints",
        filename="best",
        monitor="val/bleu",
        mode="max",
        save_top_k=1,
        save_last=True,
        auto_insert_metric_name=False,
        enable_version_counter=False,
    )
    run = describe_run(cfg)
    tracker = instantiate(cfg.logger)(save_dir=run_dir, run=run)
    loggers = [csv_logger(run_dir), *([tracker] if tracker is not None else [])]
    trainer: pl.Trainer = instantiate(
        cfg.trainer,
        default_root_dir=str(run_dir),
        callbacks=[checkpoint, ValidationExamples(run_dir, **cfg.examples), AttentionDiagnostics()],
        logger=loggers,
    )
    log_effective_batch(cfg, trainer)
    for logger in loggers:
        logger.log_hyperparams(run.config)
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.ckpt_path)

    metrics = {name: float(value) for name, value in trainer.callback_metrics.items()}
    best_score = checkpoint.best_model_score
    # Read before testing: loading best.ckpt for the test restores the checkpoint callback's state
    # as it was when best.ckpt was written, before last.ckpt existed.
    result = {
        "best_val_bleu": float(best_score) if best_score is not None else None,
        "best_checkpoint": checkpoint.best_model_path or None,
        "last_checkpoint": checkpoint.last_model_path or None,
        "metrics": metrics,
        "run_dir": str(run_dir),
    }
    if cfg.test_after_training and "test" in datamodule.datasets and result["best_checkpoint"]:
        # The best checkpoint on the test split, logged as test/* at the last step.
        for name, value in trainer.test(module, datamodule=datamodule, ckpt_path="best")[0].items():
            metrics[name] = float(value)
    finish(loggers)
    if trainer.is_global_zero:
        write_summary(run_dir, run, module, result)
        print(
            f"Best val BLEU: {result['best_val_bleu']}\n"
            f"Best checkpoint: {result['best_checkpoint']}"
        )
    return result


def describe_run(cfg: DictConfig) -> RunInfo:
    """Tracker name, group and tags from the chosen config options (``additive-gru-toy``); in a
    Hydra multirun the group is the sweep directory, so one sweep is one W&B group."""
    choices: dict[str, Any] = {}
    group = None
    if HydraConfig.initialized():
        hydra = HydraConfig.get()
        choices = dict(hydra.runtime.choices)
        if hydra.mode == RunMode.MULTIRUN:
            group = str(hydra.sweep.dir)
    # Outside a Hydra app (the compose API in tests and notebooks): the classes' names.
    attention = choices.get("attention") or cfg.attention._target_.rsplit(".", 1)[-1]
    model = choices.get("model") or cfg.model.rnn._target_.rsplit(".", 1)[-1].lower()
    data = choices.get("data") or cfg.data.corpus._target_.rsplit(".", 1)[-1].lower()
    config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config, dict)
    return RunInfo(
        name=f"{attention}-{model}-{data}",
        group=group,
        tags=(str(attention), str(model), str(data)),
        config={str(key): value for key, value in config.items()},
    )


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
        "train_tokens_per_s": module.total_train_tokens / module.total_train_seconds
        if module.total_train_seconds
        else None,
    }
    text = json.dumps(summary, indent=2) + "\n"
    write_atomic(run_dir / SUMMARY_FILE, lambda path: path.write_text(text, encoding="utf-8"))


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


def build_model_config(cfg: DictConfig, src_vocab_size: int, tgt_vocab_size: int) -> dict[str, Any]:
    """The resolved ``Seq2Seq`` config: ``cfg.model`` plus vocabulary sizes and the attention."""
    model_config = OmegaConf.to_container(cfg.model, resolve=True)
    attention_config = OmegaConf.to_container(cfg.attention, resolve=True)
    assert isinstance(model_config, dict) and isinstance(attention_config, dict)
    model_config.update(
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        padding_idx=PAD_ID,
        attention=attention_config,
    )
    return {str(key): value for key, value in model_config.items()}


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> LitSeq2Seq:
    """Rebuild the trained module from a checkpoint alone (weights, config and vocabularies).

    The checkpoint is read with ``weights_only=True``: loading it runs no code from the file.
    """
    trained = load(path, map_location)
    module = LitSeq2Seq(
        model=trained.model,
        src_tokenizer=trained.src_tokenizer,
        tgt_tokenizer=trained.tgt_tokenizer,
        model_config=trained.model_config,
        max_len_a=trained.decoding["max_len_a"],
        max_len_b=trained.decoding["max_len_b"],
        max_src_len=trained.decoding["max_src_len"],
    )
    return module.eval()
