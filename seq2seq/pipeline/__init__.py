"""Entry points behind ``train.py`` and the scripts: build everything from the config and run it.

``train`` mostly instantiates; each job it needs has its module: ``checks`` (config values checked
before anything is built), ``building`` (the model config, the LightningModule, the optimizer),
``resume`` (the run directory, and a resumed run checked against its checkpoint), ``callbacks``
(the callbacks the config asks for) and ``reporting`` (tracker names, ``summary.json``).
"""

from __future__ import annotations

import logging
import signal
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import ModelCheckpoint

from seq2seq.analysis.diagnostics import AttentionDiagnostics
from seq2seq.data.datamodule import Seq2SeqDataModule
from seq2seq.errors import ConfigError
from seq2seq.inference.bundle import TrainedModel, load
from seq2seq.pipeline.building import (
    build_model_config,
    build_module,
    build_optimizer,
    model_kind,
    scoring_config,
    trainer_config,
    trusted_by_config,
)
from seq2seq.pipeline.callbacks import (
    ParameterSummary,
    early_stopping,
    kept_checkpoints,
    progress_bar,
    reliability_callbacks,
)
from seq2seq.pipeline.checks import (
    check_alignment_data,
    check_cpu_precision,
    check_max_time,
    check_model_sizes,
    check_trainer_counts,
    missing_keys,
)
from seq2seq.pipeline.reporting import (
    describe_run,
    format_bleu,
    log_effective_batch,
    test_report,
    write_summary,
)
from seq2seq.pipeline.resume import (
    changed_keys,
    check_same_model,
    hydra_run_dir,
    prepare_run_dir,
    read_resume_checkpoint,
    resolve_run_dir,
)
from seq2seq.training.callbacks import ExplorerPage, ValidationExamples
from seq2seq.training.checkpointing import (
    AtomicCheckpointIO,
    SignalFlag,
    TrainingInterruptedError,
    last_checkpoint_every_epoch,
)
from seq2seq.training.console import drop_lightning_tips, lightning_quietly
from seq2seq.training.distributed import is_nonzero_rank_from_env
from seq2seq.training.lit_module import LitSeq2Seq
from seq2seq.training.loggers import csv_logger, finish
from seq2seq.training.runtime import freeze_startup_objects, tune_allocator

# What scripts, benchmarks and tests import from here.
__all__ = [
    "build_model_config",
    "build_module",
    "build_optimizer",
    "changed_keys",
    "describe_run",
    "hydra_run_dir",
    "load_checkpoint",
    "missing_keys",
    "model_kind",
    "resolve_run_dir",
    "scoring_config",
    "train",
    "trusted_by_config",
]

log = logging.getLogger(__name__)


def train(cfg: DictConfig, choices: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Train the model ``cfg`` describes; returns the best val BLEU, its checkpoint and metrics.

    Under DDP every rank runs this; only rank zero writes files.
    """
    check_config(cfg)
    run_dir = resolve_run_dir(cfg)
    is_rank_zero = not is_nonzero_rank_from_env()
    resumed = read_resume_checkpoint(cfg, run_dir) if cfg.ckpt_path else None
    if is_rank_zero:
        prepare_run_dir(run_dir, resuming=resumed is not None)
    pl.seed_everything(cfg.seed, workers=True)
    tune_allocator()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)

    datamodule = prepare_data(cfg, resumed)
    module = build_checked_module(cfg, datamodule, resumed)
    if is_rank_zero:  # once every check has passed: a refused run writes nothing of its own
        write_run_files(cfg, run_dir, datamodule, resumed)
    checkpoint = ModelCheckpoint(
        dirpath=run_dir / "checkpoints",
        filename="best",
        monitor="val/bleu",
        mode="max",
        save_top_k=1,
        auto_insert_metric_name=False,
        enable_version_counter=False,
    )
    last = last_checkpoint_every_epoch(run_dir / "checkpoints")  # after `checkpoint`: see there
    stop_flag = SignalFlag()
    run = describe_run(cfg, run_dir, choices)
    drop_lightning_tips()  # before the Trainer, which prints its tip when it is built
    # A resumed run is in its original directory, so the tracker finds its run id there.
    tracker = instantiate(cfg.logger)(save_dir=run_dir, run=run)
    loggers = [csv_logger(run_dir), *([tracker] if tracker is not None else [])]
    callbacks = [checkpoint, last, *run_callbacks(cfg, run_dir, stop_flag)]
    trainer = build_trainer(cfg, run_dir, callbacks, loggers)
    log_effective_batch(cfg, trainer)
    for logger in loggers:
        logger.log_hyperparams(run.config)
    freeze_startup_objects()
    with stop_flag.installed(), lightning_quietly(), warnings.catch_warnings():
        # Resuming into its own checkpoints/ is the point, not a mistake to warn about.
        warnings.filterwarnings("ignore", "Checkpoint directory .* exists and is not empty")
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.ckpt_path, weights_only=True)
    if stop_flag.signum is not None:  # it came during the last validation: the run is complete
        raise TrainingInterruptedError(
            f"stopped by {signal.Signals(stop_flag.signum).name} after the last epoch; the run is "
            f"complete and {last.best_model_path} holds its final state.",
            stop_flag.signum,
        )

    metrics = {name: float(value) for name, value in trainer.callback_metrics.items()}
    best_score = checkpoint.best_model_score
    best_bleu = float(best_score) if best_score is not None else None
    # Read before testing: loading best.ckpt for the test restores the checkpoint callback's state
    # as it was when best.ckpt was written, before last.ckpt existed.
    result = {
        "best_val_bleu": best_bleu,
        "best_checkpoint": checkpoint.best_model_path or None,
        "last_checkpoint": last.best_model_path or None,
        "metrics": metrics,
        "run_dir": str(run_dir),
    }
    if cfg.test_after_training and "test" in datamodule.datasets and result["best_checkpoint"]:
        metrics.update(score_on_test(cfg, trainer, module, datamodule, checkpoint.best_model_path))
    finish(loggers)
    if trainer.is_global_zero:
        write_summary(run_dir, run, module, result)
        print(
            f"Best val BLEU: {format_bleu(best_bleu, metrics.get('val/bleu'))}\n"
            f"Best checkpoint: {result['best_checkpoint']}"
        )
    return result


def check_config(cfg: DictConfig) -> None:
    """What can be refused from the config alone, before the run directory and the logger exist."""
    missing = missing_keys(cfg)
    if missing:
        raise ConfigError(
            f"the config needs a value for {', '.join(missing)} (marked ??? in conf/). Set it on "
            f"the command line, e.g. seq2seq train ... {missing[0]}=VALUE."
        )
    check_trainer_counts(cfg)
    check_max_time(cfg)
    check_cpu_precision(cfg)
    check_alignment_data(cfg)


def prepare_data(cfg: DictConfig, resumed: TrainedModel | None) -> Seq2SeqDataModule:
    """The data module, set up for fitting."""
    # A resumed run reuses the checkpoint's vocabularies, never ones trained again.
    tokenizers = {}
    if resumed is not None:
        tokenizers = dict(src_tokenizer=resumed.src_tokenizer, tgt_tokenizer=resumed.tgt_tokenizer)
    datamodule: Seq2SeqDataModule = instantiate(cfg.data.module, **tokenizers)
    datamodule.setup("fit")
    return datamodule


def write_run_files(
    cfg: DictConfig, run_dir: Path, datamodule: Seq2SeqDataModule, resumed: TrainedModel | None
) -> None:
    """The resolved config (a resumed run keeps the one it started with) and the vocabularies."""
    if resumed is None:
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    assert datamodule.src_tokenizer is not None and datamodule.tgt_tokenizer is not None
    datamodule.src_tokenizer.save(str(run_dir / "src_tokenizer.json"))
    datamodule.tgt_tokenizer.save(str(run_dir / "tgt_tokenizer.json"))


def build_checked_module(
    cfg: DictConfig, datamodule: Seq2SeqDataModule, resumed: TrainedModel | None
) -> LitSeq2Seq:
    """The Lightning module of ``cfg``'s model for the data's vocabularies, once its sizes are
    checked, and against the resumed checkpoint's model if there is one."""
    assert datamodule.src_tokenizer is not None and datamodule.tgt_tokenizer is not None
    model_config = build_model_config(
        cfg,
        datamodule.src_tokenizer.get_vocab_size(),
        datamodule.tgt_tokenizer.get_vocab_size(),
    )
    if resumed is not None:
        check_same_model(cfg.ckpt_path, resumed.model_config, model_config)
    check_model_sizes(cfg)
    return build_module(cfg, datamodule, model_config)


def run_callbacks(cfg: DictConfig, run_dir: Path, stop_flag: SignalFlag) -> list[pl.Callback]:
    """Every callback but the two checkpoints, in the order they must run."""
    quiet = bool(cfg.get("quiet", False))
    return [
        *kept_checkpoints(cfg, run_dir / "checkpoints"),
        *early_stopping(cfg),
        *reliability_callbacks(cfg, run_dir, stop_flag),
        *progress_bar(cfg),
        *([] if quiet else [ParameterSummary()]),
        ValidationExamples(run_dir, **cfg.examples),
        ExplorerPage(run_dir, cfg.examples.num_samples),
        AttentionDiagnostics(),
    ]


def build_trainer(
    cfg: DictConfig, run_dir: Path, callbacks: list[pl.Callback], loggers: list[Any]
) -> pl.Trainer:
    """The Trainer of ``cfg.trainer``, with the run's callbacks and loggers."""
    quiet = bool(cfg.get("quiet", False))
    trainer: pl.Trainer = instantiate(
        trainer_config(cfg),
        **({"enable_model_summary": False} if quiet else {}),
        max_time=None,  # its Timer is among reliability_callbacks
        default_root_dir=str(run_dir),
        # Lightning counts an epoch's batches once, when it loads the data, and then validates
        # after that many batches and stops the epoch there. Token-budget batches (data.max_tokens)
        # number differently in every epoch: without a reload, an epoch one batch short skips its
        # validation and one batch long loses its last batch.
        reload_dataloaders_every_n_epochs=1 if cfg.data.get("max_tokens") else 0,
        callbacks=callbacks,
        logger=loggers,
        plugins=[AtomicCheckpointIO()],
    )
    return trainer


def score_on_test(
    cfg: DictConfig,
    trainer: pl.Trainer,
    module: LitSeq2Seq,
    datamodule: Seq2SeqDataModule,
    best_checkpoint: str,
) -> dict[str, float]:
    """The best checkpoint on the test split, logged as test/* at the last step; its metrics."""
    # Its path is named: "best" would make Lightning warn that it picks the first of two
    # checkpoint callbacks (best and last), which is the one meant.
    with lightning_quietly():
        tested = trainer.test(
            module,
            datamodule=datamodule,
            ckpt_path=best_checkpoint,
            verbose=False,  # its table prints 16 digits: test_report's line instead
        )
    metrics = {name: float(value) for name, value in tested[0].items()}
    if not cfg.get("quiet", False) and trainer.is_global_zero:
        print(test_report(metrics))
    return metrics


def load_checkpoint(
    path: str | Path,
    map_location: str | torch.device = "cpu",
    trust_modules: list[str] | None = None,
) -> LitSeq2Seq:
    """Rebuild the trained module from a checkpoint alone (weights, config and vocabularies).

    The checkpoint is read with ``weights_only=True``: loading it runs no code from the file, nor
    from any module it names but the ``trust_modules`` (``seq2seq.inference.plugins``).
    """
    trained = load(path, map_location, trust_modules=trust_modules or ())
    module = LitSeq2Seq(
        model=trained.model,
        src_tokenizer=trained.src_tokenizer,
        tgt_tokenizer=trained.tgt_tokenizer,
        model_config=trained.model_config,
        max_len_a=trained.decoding["max_len_a"],
        max_len_b=trained.decoding["max_len_b"],
        max_src_len=trained.decoding["max_src_len"],
        # Validation's search (files from before it was a setting validated greedily).
        beam_size=trained.decoding.get("beam_size", 1),
        length_penalty=trained.decoding.get("length_penalty", 0.6),
        coverage_penalty=trained.decoding.get("coverage_penalty", 0.0),
    )
    return module.eval()
