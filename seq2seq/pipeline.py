"""Entry points behind ``train.py`` and the scripts: build everything from the config and run it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import ModelCheckpoint

from seq2seq.bundle import build_model, load
from seq2seq.data.datamodule import Seq2SeqDataModule
from seq2seq.data.tokenization import PAD_ID
from seq2seq.diagnostics import AttentionDiagnostics
from seq2seq.errors import ConfigError
from seq2seq.lit_module import LitSeq2Seq

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train the model ``cfg`` describes; returns the best val BLEU, its checkpoint and metrics."""
    missing = missing_keys(cfg)
    if missing:
        raise ConfigError(
            f"the config needs a value for {', '.join(missing)} (marked ??? in conf/). Set it on "
            f"the command line, e.g. python train.py ... {missing[0]}=VALUE."
        )
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    pl.seed_everything(cfg.seed, workers=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)

    datamodule: Seq2SeqDataModule = instantiate(cfg.data.module)
    datamodule.setup("fit")
    assert datamodule.src_tokenizer is not None and datamodule.tgt_tokenizer is not None
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
    trainer: pl.Trainer = instantiate(
        cfg.trainer,
        default_root_dir=str(run_dir),
        callbacks=[checkpoint, AttentionDiagnostics()],
        logger=instantiate(cfg.logger, save_dir=str(run_dir)) if cfg.logger else False,
    )
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.ckpt_path)

    metrics = {name: float(value) for name, value in trainer.callback_metrics.items()}
    best_score = checkpoint.best_model_score
    result = {
        "best_val_bleu": float(best_score) if best_score is not None else None,
        "best_checkpoint": checkpoint.best_model_path or None,
        "last_checkpoint": checkpoint.last_model_path or None,
        "metrics": metrics,
        "run_dir": str(run_dir),
    }
    if trainer.is_global_zero:
        print(
            f"Best val BLEU: {result['best_val_bleu']}\n"
            f"Best checkpoint: {result['best_checkpoint']}"
        )
    return result


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
