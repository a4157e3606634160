"""Entry points behind ``train.py`` and the scripts: build everything from the config and run it."""

from __future__ import annotations

import functools
import inspect
import json
import logging
import shlex
import signal
import warnings
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

from seq2seq.analysis.compare import SUMMARY_FILE
from seq2seq.analysis.diagnostics import AttentionDiagnostics
from seq2seq.atomic import write_atomic
from seq2seq.data.datamodule import Seq2SeqDataModule
from seq2seq.data.tokenization import PAD_ID
from seq2seq.errors import ConfigError
from seq2seq.inference.bundle import (
    ALLOWED_TARGETS,
    RUNTIME_KEYS,
    ModelFileError,
    TrainedModel,
    build_model,
    load,
    read_checkpoint,
)
from seq2seq.inference.bundle import (
    load_checkpoint as load_trained_checkpoint,
)
from seq2seq.kernels import KERNEL_CHOICES
from seq2seq.onednn_guard import bf16_error
from seq2seq.onednn_guard import report as onednn_report
from seq2seq.training.callbacks import ValidationExamples
from seq2seq.training.checkpointing import (
    AtomicCheckpointIO,
    NonFiniteGuard,
    PeriodicCheckpoint,
    ResumeState,
    SignalFlag,
    StopOnSignal,
    TrainingInterruptedError,
    ValidateAtMaxSteps,
    last_checkpoint_every_epoch,
    run_dir_of_checkpoint,
)
from seq2seq.training.console import drop_lightning_tips, lightning_quietly
from seq2seq.training.distributed import is_nonzero_rank_from_env
from seq2seq.training.lit_module import LitSeq2Seq
from seq2seq.training.loggers import RunInfo, csv_logger, finish
from seq2seq.training.runtime import freeze_startup_objects, tune_allocator

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
    check_cpu_precision(cfg)
    run_dir = resolve_run_dir(cfg)
    is_rank_zero = not is_nonzero_rank_from_env()
    resumed = read_resume_checkpoint(cfg, run_dir) if cfg.ckpt_path else None
    if is_rank_zero:
        prepare_run_dir(run_dir, resuming=resumed is not None)
    if is_rank_zero and resumed is None:  # a resumed run keeps the config.yaml it started with
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    pl.seed_everything(cfg.seed, workers=True)
    tune_allocator()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)

    # A resumed run reuses the checkpoint's vocabularies, never ones trained again.
    tokenizers = {}
    if resumed is not None:
        tokenizers = dict(src_tokenizer=resumed.src_tokenizer, tgt_tokenizer=resumed.tgt_tokenizer)
    datamodule: Seq2SeqDataModule = instantiate(cfg.data.module, **tokenizers)
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
    if resumed is not None:
        check_same_model(cfg.ckpt_path, resumed.model_config, model_config)
    check_model_sizes(cfg)
    module = build_module(cfg, datamodule, model_config)
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
    run = describe_run(cfg, run_dir)
    drop_lightning_tips()  # before the Trainer, which prints its tip when it is built
    # A resumed run is in its original directory, so the tracker finds its run id there.
    tracker = instantiate(cfg.logger)(save_dir=run_dir, run=run)
    loggers = [csv_logger(run_dir), *([tracker] if tracker is not None else [])]
    trainer: pl.Trainer = instantiate(
        trainer_config(cfg),
        default_root_dir=str(run_dir),
        # Lightning counts an epoch's batches once, when it loads the data, and then validates
        # after that many batches and stops the epoch there. Token-budget batches (data.max_tokens)
        # number differently in every epoch: without a reload, an epoch one batch short skips its
        # validation and one batch long loses its last batch.
        reload_dataloaders_every_n_epochs=1 if cfg.data.get("max_tokens") else 0,
        callbacks=[
            checkpoint,
            last,
            *kept_checkpoints(cfg, run_dir / "checkpoints"),
            *early_stopping(cfg),
            *reliability_callbacks(cfg, run_dir, stop_flag),
            ValidationExamples(run_dir, **cfg.examples),
            AttentionDiagnostics(),
        ],
        logger=loggers,
        plugins=[AtomicCheckpointIO()],
    )
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
    # Read before testing: loading best.ckpt for the test restores the checkpoint callback's state
    # as it was when best.ckpt was written, before last.ckpt existed.
    result = {
        "best_val_bleu": float(best_score) if best_score is not None else None,
        "best_checkpoint": checkpoint.best_model_path or None,
        "last_checkpoint": last.best_model_path or None,
        "metrics": metrics,
        "run_dir": str(run_dir),
    }
    if cfg.test_after_training and "test" in datamodule.datasets and result["best_checkpoint"]:
        # The best checkpoint on the test split, logged as test/* at the last step. Its path is
        # named: "best" would make Lightning warn that it picks the first of two checkpoint
        # callbacks (best and last), which is the one meant.
        with lightning_quietly():
            tested = trainer.test(
                module, datamodule=datamodule, ckpt_path=checkpoint.best_model_path
            )
        for name, value in tested[0].items():
            metrics[name] = float(value)
    finish(loggers)
    if trainer.is_global_zero:
        write_summary(run_dir, run, module, result)
        print(
            f"Best val BLEU: {result['best_val_bleu']}\n"
            f"Best checkpoint: {result['best_checkpoint']}"
        )
    return result


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
        bleu_tokenize=cfg.data.bleu_tokenize,
        cuda_graphs=cfg.cuda_graphs,
        label_smoothing=check_label_smoothing(cfg.optim.get("label_smoothing", 0.0)),
        alignment_loss_weight=check_alignment_loss_weight(
            cfg.optim.get("alignment_loss_weight", 0.0)
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


def describe_run(cfg: DictConfig, run_dir: Path | None = None) -> RunInfo:
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
    if run_dir is not None:  # the directory resolve_run_dir chose (a resumed run's own)
        cfg = cfg.copy()
        with open_dict(cfg):
            cfg.run_dir = str(run_dir)
    config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config, dict)
    return RunInfo(
        name=f"{attention}-{model_name}-{data}",
        group=group,
        tags=(str(attention), str(model), str(data), decoder),
        config={str(key): value for key, value in config.items()},
    )


def model_kind(cfg: DictConfig) -> str:
    """gru, lstm or transformer: the model's recurrent layer, or the Transformer."""
    rnn = OmegaConf.select(cfg, "model.rnn._target_", default=None)
    return str(rnn).rsplit(".", 1)[-1].lower() if rnn else "transformer"


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


# Config keys in cfg.trainer that are ours, not pl.Trainer arguments.
NON_TRAINER_KEYS = ("skip_nonfinite",)


def trainer_config(cfg: DictConfig) -> DictConfig:
    """``cfg.trainer`` without the keys that are not ``pl.Trainer`` arguments."""
    keys = [str(key) for key in cfg.trainer if key not in NON_TRAINER_KEYS]
    return OmegaConf.masked_copy(cfg.trainer, keys)


def check_alignment_loss_weight(value: Any) -> float:
    """``optim.alignment_loss_weight`` (λ of guided alignment) as a float, or a ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e6:
        raise ConfigError(
            f"optim.alignment_loss_weight must be a number of at least 0 (the weight of the "
            f"alignment cross-entropy in the training loss; 0 turns it off), got {value!r}; "
            "e.g. optim.alignment_loss_weight=0.5."
        )
    return float(value)


def check_label_smoothing(value: Any) -> float:
    if type(value) not in (int, float) or not 0 <= value < 1:
        raise ConfigError(
            f"optim.label_smoothing must be at least 0 and below 1 (the probability mass spread "
            f"over the vocabulary), got {value!r}; e.g. optim.label_smoothing=0.1."
        )
    return float(value)


class KeptCheckpoints(ModelCheckpoint):
    """A ``ModelCheckpoint`` told apart from the best-checkpoint one by its file names too:
    Lightning keys a checkpoint callback's saved state by its monitor and cadence alone, which
    ``keep_best`` shares with ``best.ckpt``'s."""

    @property
    def state_key(self) -> str:
        return self._generate_state_key(monitor=self.monitor, filename=self.filename)


def kept_checkpoints(cfg: DictConfig, directory: Path) -> list[pl.Callback]:
    """``checkpoint.keep_last`` / ``keep_best``: the checkpoints of the last N validations and of
    the N best by val/bleu, which ``scripts/average_checkpoints.py`` averages."""
    callbacks: list[pl.Callback] = []
    for key, prefix, monitor in (("keep_last", "val", "step"), ("keep_best", "top", "val/bleu")):
        count = cfg.checkpoint.get(key, 0) or 0
        if type(count) is not int or count < 0:
            raise ConfigError(
                f"checkpoint.{key} must be a whole number of checkpoints (0: none), got {count!r}."
            )
        if count:
            callbacks.append(
                KeptCheckpoints(
                    dirpath=directory,
                    filename=prefix + "-step={step}",
                    monitor=monitor,  # "step": the latest N (Lightning logs the global step)
                    mode="max",
                    save_top_k=count,
                    auto_insert_metric_name=False,
                    enable_version_counter=False,
                )
            )
    return callbacks


def early_stopping(cfg: DictConfig) -> list[pl.Callback]:
    """``early_stopping.patience``: stop when val/bleu has not improved for that many
    validations."""
    settings = cfg.get("early_stopping") or {}
    patience = settings.get("patience")
    if patience is None:
        return []
    if type(patience) is not int or patience < 1:
        raise ConfigError(
            f"early_stopping.patience must be a positive number of validations (or null: never "
            f"stop early), got {patience!r}."
        )
    return [
        EarlyStopping(
            monitor="val/bleu", mode="max", patience=patience,
            min_delta=float(settings.get("min_delta", 0.0)), check_finite=True,
        )
    ]  # fmt: skip


def reliability_callbacks(
    cfg: DictConfig, run_dir: Path, stop_flag: SignalFlag
) -> list[pl.Callback]:
    """Periodic last.ckpt, clean stop on SIGINT/SIGTERM, validation at max_steps, the non-finite
    guard, resume state."""
    directory = run_dir / "checkpoints"
    command = resume_command()
    return [
        PeriodicCheckpoint(directory, cfg.checkpoint.every_n_steps),
        StopOnSignal(stop_flag, directory, command),
        ValidateAtMaxSteps(),
        NonFiniteGuard(bool(cfg.trainer.get("skip_nonfinite", False)), directory, command),
        ResumeState(),
    ]


def resolve_run_dir(cfg: DictConfig) -> Path:
    """The run directory: ``run_dir`` if it was set; when resuming without it, the checkpoint's run
    (``RUN/checkpoints/last.ckpt`` -> ``RUN``), so a resumed run writes where the original did."""
    if cfg.ckpt_path and OmegaConf.is_interpolation(cfg, "run_dir"):
        original = run_dir_of_checkpoint(cfg.ckpt_path)
        if original is not None and not HydraConfig.initialized():
            return original  # train(compose(...)) has no Hydra output dir to resolve
    return Path(cfg.run_dir)


def hydra_run_dir(ckpt_path: str | None, default: str) -> str:
    """The ``seq2seq_run_dir`` resolver behind ``hydra.run.dir``: a resumed run's own directory."""
    original = run_dir_of_checkpoint(ckpt_path) if ckpt_path else None
    return str(original) if original is not None else default


def resume_command() -> str:
    """The command that resumes this run, with ``{ckpt_path}`` to fill in."""
    if not HydraConfig.initialized():
        return "train(cfg) with ckpt_path={ckpt_path}"
    overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("ckpt_path=")]
    return " ".join(["python train.py", *map(shlex.quote, overrides), "ckpt_path={ckpt_path}"])


def prepare_run_dir(run_dir: Path, resuming: bool) -> None:
    """Create the run directory; refuse to start a new run over the checkpoints of another."""
    last = run_dir / "checkpoints" / "last.ckpt"
    if not resuming and last.exists():
        raise ConfigError(
            f"{run_dir} already holds a run ({last}); a new run there would overwrite its "
            f"checkpoints. Resume it with ckpt_path={last}, or choose another run_dir."
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write_test"
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise ConfigError(
            f"cannot write to the run directory {run_dir} ({error.strerror or error}): choose a "
            "writable one with run_dir=... (or hydra.run.dir=...), or fix its permissions."
        ) from None


# Config sections that must not change when a run is resumed: they define its data and model.
RESUME_SECTIONS = ("seed", "data", "model", "attention", "optim")


def read_resume_checkpoint(cfg: DictConfig, run_dir: Path) -> TrainedModel:
    """Check that ``cfg.ckpt_path`` can be resumed with ``cfg``; returns its model and tokenizers.

    Every problem is one paragraph here, before Lightning would fail on it with a traceback: a
    missing, truncated or foreign file, or a config whose data or model differ from the run's.
    """
    path = Path(cfg.ckpt_path)
    if not path.is_file():
        raise ConfigError(
            f"ckpt_path={path} does not exist. Resume from a checkpoint a run wrote: "
            "RUN/checkpoints/last.ckpt (written every checkpoint.every_n_steps steps and at the "
            "end of every epoch) or RUN/checkpoints/best.ckpt."
        )
    # A truncated or foreign file fails here, clearly; a user's scoring function loads because
    # the command's own config names it.
    trained = load_trained_checkpoint(path, trust_modules=trusted_by_config(cfg))
    if "optimizer_states" not in read_checkpoint(path):
        raise ModelFileError(
            f"ckpt_path={path} holds a model but no optimizer state, so training cannot resume "
            "from it. Pass RUN/checkpoints/last.ckpt of a run."
        )
    saved = run_dir / "config.yaml"
    if saved.is_file():
        changed = changed_keys(OmegaConf.load(saved), cfg)
        if changed:
            shown = "; ".join(
                f"{key}: {old!r} in the run, {new!r} now" for key, old, new in changed
            )
            raise ConfigError(
                f"ckpt_path={path} continues the run in {run_dir}, but this command changes "
                f"settings the run was trained with ({shown}). Resume with the run's original "
                f"overrides (see {run_dir / '.hydra' / 'overrides.yaml'} or {saved}); only "
                "trainer.* and decoding.* may change."
            )
    return trained


def changed_keys(saved: Any, cfg: DictConfig) -> list[tuple[str, Any, Any]]:
    """(key, saved value, new value) for each leaf in ``RESUME_SECTIONS`` that differs."""
    changed = []
    for key in RESUME_SECTIONS:
        # Section by section: run_dir may not resolve outside Hydra, and is not compared.
        before_section, after_section = (_plain(config, key) for config in (saved, cfg))
        for name, (before, after) in _differences(before_section, after_section, key).items():
            # Where the data cache lives, and which Adam kernel runs, change no result.
            if "cache_dir" not in name and name != "optim.optimizer.fused":
                changed.append((name, before, after))
    return changed


def _plain(config: Any, key: str) -> Any:
    node = OmegaConf.select(config, key, default=None)
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


# Keys added to (or moved within) the config since runs were first written, with the value that
# reproduces what those runs did: a run or checkpoint without the key is the same as one with
# this value (num_heads: attention.num_heads of RNN runs before it became model.num_heads).
ADDED_KEYS = {"initial_temperature": 1.0, "alignment_loss_weight": 0.0, "num_heads": 1}


def _differences(old: Any, new: Any, prefix: str) -> dict[str, tuple[Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        found: dict[str, tuple[Any, Any]] = {}
        for key in sorted(set(old) | set(new), key=str):
            default = ADDED_KEYS.get(str(key))
            before, after = (default if c.get(key) is None else c[key] for c in (old, new))
            found.update(_differences(before, after, f"{prefix}.{key}"))
        return found
    return {} if old == new else {prefix: (old, new)}


def check_same_model(ckpt_path: str, saved: dict[str, Any], model_config: dict[str, Any]) -> None:
    """The config must build the model the checkpoint holds, or its weights cannot be loaded."""
    changed = {
        key: values
        for key, values in _differences(saved, model_config, "model").items()
        if key.removeprefix("model.") not in RUNTIME_KEYS
    }
    if changed:
        shown = "; ".join(
            f"{key}: {old!r} in the checkpoint, {new!r} now" for key, (old, new) in changed.items()
        )
        raise ConfigError(
            f"ckpt_path={ckpt_path} holds a different model than this config builds ({shown}). "
            "Resume with the model.* and attention=... settings the run was trained with."
        )


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
    problems = []
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
        problems.append(
            f"model.fused_rnn={shown} (renamed: the C kernels are now chosen with model.kernels, "
            f"auto or off; use model.kernels={replacement})"
        )
    heads = OmegaConf.select(cfg, "attention.num_heads", default=None)
    if heads is not None:
        problems.append(
            f"attention.num_heads={heads} (renamed: the heads of every attention, RNN or "
            f"Transformer, are model.num_heads; use model.num_heads={heads}, and delete num_heads "
            "from your attention YAML)"
        )
    kernels = OmegaConf.select(cfg, "model.kernels", default="auto")
    if kernels not in KERNEL_CHOICES:
        problems.append(f"model.kernels={kernels} (auto: the C kernels where they apply; off)")
    if problems:
        raise ConfigError(
            f"the model cannot be built with {'; '.join(problems)}. Set "
            f"{'these' if len(problems) > 1 else 'it'} on the command line, e.g. "
            "python train.py model.hidden_size=256 model.encoder_layers=1 model.dropout=0.1."
        )


def trusted_by_config(cfg: DictConfig) -> list[str]:
    """The modules whose code training may import: ``trust_modules`` and the module of a scoring
    function ``attention._target_`` names that is not built in. The user's own config named
    them, as it names every class Hydra builds; a checkpoint's config is trusted only as far as
    this command's is (resuming)."""
    trusted = [str(entry) for entry in cfg.get("trust_modules") or []]
    target = OmegaConf.select(cfg, "attention._target_", default=None)
    if isinstance(target, str) and target not in ALLOWED_TARGETS and "." in target:
        trusted.append(target.rpartition(".")[0])
    return trusted


def scoring_config(attention: DictConfig) -> dict[str, Any]:
    """The ``attention`` group's node as the scoring function's ``_partial_`` config, resolved:
    without ``num_heads`` (renamed ``model.num_heads``: ``check_model_sizes`` refuses it)."""
    config = OmegaConf.to_container(attention, resolve=True)
    assert isinstance(config, dict)
    return {str(key): value for key, value in config.items() if key != "num_heads"}


def build_model_config(cfg: DictConfig, src_vocab_size: int, tgt_vocab_size: int) -> dict[str, Any]:
    """The resolved ``Seq2Seq`` config: ``cfg.model`` plus vocabulary sizes and the attention."""
    model_config = OmegaConf.to_container(cfg.model, resolve=True)
    attention_config = scoring_config(cfg.attention)
    assert isinstance(model_config, dict)
    model_config.pop("fused_rnn", None)  # null unless set, and then check_model_sizes refused it
    if model_config.get("num_heads", 1) == 1 and model_kind(cfg) != "transformer":
        # A single-head RNN model's files never held the key: they stay as they were.
        model_config.pop("num_heads", None)
    model_config.update(
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        padding_idx=PAD_ID,
        attention=attention_config,
    )
    return {str(key): value for key, value in model_config.items()}


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
    )
    return module.eval()
