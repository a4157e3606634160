"""Speed and memory of training and decoding, measured the same way for us and for Joey NMT.

Shape legend: B batch, S source length, T target length, H hidden size.

``run_benchmark(overrides, ...)`` composes the Hydra config that ``train.py`` would, then measures,
each in a fresh process (so start-up and peak memory are those of a real run):

- training: steady-state target tokens/s and sentences/s after ``warmup_batches`` (validation time
  excluded), start-up seconds (process start to the first training batch), peak RSS, and the
  training seconds until dev BLEU first reaches ``bleu_target`` (dev is decoded greedily every
  ``val_check_interval`` of an epoch; that time is not counted), and the final dev BLEU;
- decoding, with the model that run trained: greedy and beam-5 sentences/s over the test split;
- each scoring function's forward + backward time at B=64, H=256 and S=T in ``lengths``, with all
  T queries at once (Luong) and one query per step (Bahdanau).

Every figure is the median over ``repeats`` runs (training runs use seeds seed, seed + 1, ...),
with the min and max. With ``peer="joeynmt"``, ``"opennmt"`` or ``"all"`` the same data, sizes,
batch, optimizer and epochs run through Joey NMT 2.3 (in-process, its own training loop) and/or
OpenNMT-py 3.5.1 (its ``onmt_train`` and inference engine, run by the Python of its own
environment) in the same invocation, interleaved with ours, and the report gives ours / theirs
for each peer (``report["peers"]``). Each peer validates greedily on dev (BLEU) inside its own
timed run at our cadence (``validation_steps``), so its time to BLEU ``bleu_target`` is measured
as ours is: start-up plus training seconds, validation time left out.

With ``trainer=gpu`` in the overrides (``benchmark_device``) ours trains, decodes and times the
scoring functions on the GPU, waiting for the GPU before every clock reading, and reports its peak
GPU memory and the GPU; the peers, which run on the CPU, are then left out.
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor

from seq2seq.attention import Attention
from seq2seq.errors import ConfigError
from seq2seq.training.runtime import freeze_startup_objects, tune_allocator

log = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
ATTENTION_LENGTHS = (10, 25, 50, 100)
# The keys the JSON promises (each a median); more are written beside them.
HEADLINE = (
    "train_tgt_tok_per_s",
    "train_sent_per_s",
    "startup_s",
    "peak_rss_mb",
    "peak_gpu_mb",
    "greedy_sent_per_s",
    "beam5_sent_per_s",
    "time_to_bleu95_s",
    "dev_bleu",
)


@dataclass
class Spread:
    """The median of some measurements, with their min and max."""

    median: float | None
    min: float | None
    max: float | None
    values: list[float | None] = field(default_factory=list)

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Spread:
        known = [value for value in values if value is not None]
        if not known:
            return cls(None, None, None, list(values))
        return cls(statistics.median(known), min(known), max(known), list(values))

    def text(self, digits: int = 0) -> str:
        if self.median is None:
            return "n/a"
        if self.min == self.max:
            return f"{self.median:,.{digits}f}"
        return f"{self.median:,.{digits}f} ({self.min:,.{digits}f}–{self.max:,.{digits}f})"


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def in_fresh_process(job: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """Run ``job(*args)`` in a new Python process (imports included) and return its result."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return pool.apply(job, args)


# --- ours ------------------------------------------------------------------------------------


def repeat_config(config: dict[str, Any], repeat: int) -> dict[str, Any]:
    """The resolved ``config`` for repeat ``repeat``: its seed and the training batch order's
    (``data.module.seed``, which resolving ``${seed}`` made a number of its own) both moved on
    by ``repeat``, as the peers' seeds move their data order too. Until 2026-11-24 only the
    seed moved, so every repeat of ours trained on the same batch order."""
    data = config["data"]
    module = {**data["module"], "seed": data["module"]["seed"] + repeat}
    return {**config, "seed": config["seed"] + repeat, "data": {**data, "module": module}}


def compose_config(overrides: Sequence[str], run_dir: Path) -> Any:
    """The config ``python train.py OVERRIDES`` would run, writing into ``run_dir``."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=[*overrides, f"run_dir={run_dir}"])
    except HydraException as error:
        raise ConfigError(
            f"the Hydra overrides after -- do not compose: {error} Pass overrides as train.py "
            "takes them, e.g. -- experiment=bench_reverse data=parallel data.root=DIR ..."
        ) from None
    from seq2seq.pipeline import missing_keys

    missing = missing_keys(cfg)
    if missing:
        raise ConfigError(
            f"the benchmark's config needs a value for {', '.join(missing)}; add it after --, "
            f"e.g. {missing[0]}=VALUE."
        )
    return OmegaConf.to_container(cfg, resolve=True)


def benchmark_device(config: dict[str, Any]) -> str:
    """The device: "cuda" when the config asks for a GPU (``trainer=gpu``, or
    ``trainer.accelerator`` gpu or cuda), else "cpu". Lightning's "auto" counts as the CPU here:
    the peers run on the CPU, and a comparison must not change hardware because a GPU happens to
    be there."""
    accelerator = str(config.get("trainer", {}).get("accelerator", "cpu"))
    if accelerator not in ("gpu", "cuda"):
        return "cpu"
    if not torch.cuda.is_available():
        raise ConfigError(
            f"trainer.accelerator={accelerator} asks for a GPU, but torch {torch.__version__} sees "
            "none. Drop trainer=gpu to benchmark on the CPU, or install a CUDA build of torch "
            "(README, 'Quick start', GPU users)."
        )
    return "cuda"


def train_and_decode(
    config: dict[str, Any],
    started: float,
    warmup_batches: int,
    val_check_interval: float,
    bleu_target: float,
    decode_repeats: int,
    decode_batch_size: int,
) -> dict[str, Any]:
    """One training run as train.py does it (same modules, same Lightning loop), timed; then the
    trained model decodes the test split. Runs in a fresh process (``in_fresh_process``)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from seq2seq.inference.bundle import TrainedModel
    from seq2seq.inference.translator import Translator
    from seq2seq.pipeline import build_model_config, build_module

    cfg = OmegaConf.create(config)
    device = benchmark_device(config)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    tune_allocator()  # as train.py does
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    datamodule = instantiate(cfg.data.module)
    datamodule.setup("fit")
    model_config = build_model_config(
        cfg, datamodule.src_tokenizer.get_vocab_size(), datamodule.tgt_tokenizer.get_vocab_size()
    )
    module = build_module(cfg, datamodule, model_config)
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    clock = TrainingClock(started, warmup_batches, synchronize=device == "cuda")
    trainer = pl.Trainer(
        # Validation writes val_hypotheses.txt there: the benchmark's scratch directory.
        default_root_dir=cfg.run_dir,
        accelerator="gpu" if device == "cuda" else "cpu",
        devices=1,
        max_epochs=cfg.trainer.max_epochs,
        precision=cfg.trainer.precision,
        val_check_interval=val_check_interval,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        callbacks=[clock],
    )
    freeze_startup_objects()  # as train.py does
    trainer.fit(module, datamodule=datamodule)
    result = clock.summary(bleu_target)
    result["peak_rss_mb"] = peak_rss_mb()  # of training: decoding below allocates less
    if device == "cuda":
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20

    translator = Translator(
        TrainedModel(
            module.model.eval(),
            datamodule.src_tokenizer,
            datamodule.tgt_tokenizer,
            model_config,
            {
                "max_len_a": cfg.decoding.max_len_a,
                "max_len_b": cfg.decoding.max_len_b,
                "max_src_len": cfg.decoding.max_src_len,
            },
        ),
        device,
    )
    split = "test" if "test" in datamodule.datasets else "val"
    sentences = [example.src_text for example in datamodule.datasets[split].examples]
    for name, beam_size in [("greedy", 1), ("beam5", 5)]:
        rates = []
        for _ in range(decode_repeats):
            start = time.perf_counter()
            translator.translate(sentences, beam_size=beam_size, batch_size=decode_batch_size)
            synchronize(device)
            rates.append(len(sentences) / (time.perf_counter() - start))
        result[f"{name}_sent_per_s"] = statistics.median(rates)
    result["decode_sentences"] = len(sentences)
    return result


class TrainingClock(pl.Callback):
    """Times training batches, leaving out the first ``warmup_batches`` and every validation.

    The time of a batch runs from the end of the previous one (so data loading counts) to its
    own end; the first batch after a validation is timed from the end of that validation. With
    ``synchronize`` (training on a GPU) each end waits for the GPU's queued work, so that a batch's
    time is that of its kernels, not of their launches.
    """

    def __init__(self, started: float, warmup_batches: int, synchronize: bool = False) -> None:
        self.started = started  # time.time() when the parent started this process
        self.warmup_batches = warmup_batches
        self.synchronize = synchronize
        self.first_batch: float | None = None
        self.last_end: float | None = None
        self.batches = 0
        self.tokens = 0
        self.sentences = 0
        self.seconds = 0.0  # steady state: after the warm-up, without validation
        self.train_seconds = 0.0  # all training so far, without validation
        self.validations: list[tuple[float, float]] = []  # (training seconds, dev BLEU)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, _: int) -> None:
        if self.first_batch is None:
            self.first_batch = time.time()  # wall clock, comparable with the parent's
            self.last_end = time.perf_counter()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, _: int
    ) -> None:
        if self.synchronize:
            synchronize("cuda")
        now = time.perf_counter()
        assert self.last_end is not None
        elapsed, self.last_end = now - self.last_end, now
        self.train_seconds += elapsed
        self.batches += 1
        if self.batches > self.warmup_batches:
            self.seconds += elapsed
            self.tokens += int(batch.tgt_lens.sum())
            self.sentences += len(batch.tgt_lens)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        bleu = trainer.callback_metrics.get("val/bleu")
        if bleu is not None:
            self.validations.append((self.train_seconds, float(bleu)))
        if self.synchronize:
            synchronize("cuda")
        self.last_end = time.perf_counter()  # the next batch is timed from here

    def summary(self, bleu_target: float) -> dict[str, Any]:
        assert self.first_batch is not None, "no training batch ran"
        startup = self.first_batch - self.started
        return {
            "train_tgt_tok_per_s": self.tokens / self.seconds if self.seconds else None,
            "train_sent_per_s": self.sentences / self.seconds if self.seconds else None,
            "startup_s": startup,
            "train_seconds": self.train_seconds,
            "time_to_bleu95_s": time_to_bleu(startup, self.validations, bleu_target),
            "dev_bleu": self.validations[-1][1] if self.validations else None,
            "validations": self.validations,
        }


def time_to_bleu(
    startup: float | None, validations: Sequence[tuple[float, float]], bleu_target: float
) -> float | None:
    """Start-up plus the training seconds at the first of ``validations`` (training seconds,
    BLEU) that reaches ``bleu_target``; None if none does (or the start-up is unknown)."""
    reached = [seconds for seconds, bleu in validations if bleu >= bleu_target]
    return startup + reached[0] if reached and startup is not None else None


def _train_job(config: dict[str, Any], options: dict[str, Any], started: float) -> dict[str, Any]:
    """``train_and_decode`` in a fresh process, started at ``started`` (time.time())."""
    logging.disable(logging.INFO)  # Lightning's and the data module's messages
    return train_and_decode(config, started, **options)


# --- scoring functions -------------------------------------------------------------------------


def attention_costs(
    lengths: Sequence[int] = ATTENTION_LENGTHS,
    batch_size: int = 64,
    hidden_size: int = 256,
    repeats: int = 5,
    threads: int | None = None,
    device: str = "cpu",
) -> dict[str, dict[str, dict[int, Spread]]]:
    """Forward + backward milliseconds of every scoring function: cost[mode][name][length].

    ``parallel``: all T queries (B, T, H) attend at once, as in the Luong decoder; ``stepwise``:
    T calls with one query (B, 1, H) each against keys projected once, as in the Bahdanau decoder.
    Queries, keys and values are (B, L, H) with L = S = T, and a random half of the sentences is
    padded to 60 % of L. On "cuda" each time waits for the GPU's work to finish.
    """
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    if threads:
        torch.set_num_threads(threads)
    costs: dict[str, dict[str, dict[int, Spread]]] = {"parallel": {}, "stepwise": {}}
    for path in sorted((CONF_DIR / "attention").glob("*.yaml")):
        # The option as train.py builds it, with its ${model.hidden_size} resolved to ours.
        config = OmegaConf.merge(
            {"model": {"hidden_size": hidden_size}}, {"attention": OmegaConf.load(path)}
        )
        factory = instantiate(config.attention)
        torch.manual_seed(0)
        attention = factory(query_size=hidden_size, key_size=hidden_size).to(device)
        for mode in costs:
            costs[mode][path.stem] = {}
        for length in lengths:
            generator = torch.Generator().manual_seed(length)
            queries = torch.randn(batch_size, length, hidden_size, generator=generator)
            memory = torch.randn(batch_size, length, hidden_size, generator=generator)
            valid_lens = torch.full((batch_size,), length)
            valid_lens[torch.rand(batch_size, generator=generator) < 0.5] = max(1, length * 3 // 5)
            queries, memory, valid_lens = (t.to(device) for t in (queries, memory, valid_lens))
            for mode, run in [("parallel", _parallel_attention), ("stepwise", _stepwise_attention)]:
                times = []
                for repeat in range(repeats + 1):  # the first is a warm-up
                    q, m = queries.clone().requires_grad_(), memory.clone().requires_grad_()
                    synchronize(device)
                    start = time.perf_counter()
                    run(attention, q, m, valid_lens).sum().backward()
                    synchronize(device)
                    if repeat:
                        times.append(1000 * (time.perf_counter() - start))
                costs[mode][path.stem][length] = Spread.of(times)
    return costs


def synchronize(device: str | torch.device) -> None:
    """Wait for the GPU's queued work, so that a host clock read after it times the kernels."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _parallel_attention(
    attention: Attention, queries: Tensor, memory: Tensor, valid_lens: Tensor
) -> Tensor:
    return attention.context(queries, memory, memory, valid_lens)  # (B, T, H)


def _stepwise_attention(
    attention: Attention, queries: Tensor, memory: Tensor, valid_lens: Tensor
) -> Tensor:
    projected_keys = attention.project_keys(memory)  # once per batch, as the decoder does
    contexts = [
        attention.context(
            queries[:, t : t + 1], memory, memory, valid_lens, projected_keys=projected_keys
        )
        for t in range(queries.shape[1])
    ]
    return torch.cat(contexts, dim=1)  # T x (B, 1, H) -> (B, T, H)


# --- Joey NMT ------------------------------------------------------------------------------------

# Joey NMT's name for the scoring function nearest to each of ours: it has additive ("bahdanau")
# and bilinear ("luong", Luong's general); dot products have no counterpart, so they are compared
# with its bilinear one, as PEERS.md does.
JOEY_ATTENTION = {
    "seq2seq.attention.AdditiveAttention": "bahdanau",
    "seq2seq.attention.MultiplicativeAttention": "luong",
    "seq2seq.attention.DotProductAttention": "luong",
}


def joeynmt_available() -> bool:
    try:
        import joeynmt  # noqa: F401
    except Exception:  # any import failure (missing package, broken dependency) means "absent"
        return False
    return True


def corpus_files(config: dict[str, Any], peer: str) -> tuple[dict[str, Any], Path]:
    """The ``data.corpus`` config and its root directory, for a peer that reads the files."""
    corpus = config["data"]["corpus"]
    if not str(corpus.get("_target_", "")).endswith("ParallelCorpus"):
        raise ConfigError(
            f"--peer {peer} needs files it can read: run with data=parallel data.root=DIR ... "
            "(e.g. the peers' reverse task, see docs/performance.md), or pass --peer none."
        )
    return corpus, Path(corpus["root"])


def training_seconds_at(
    loop_start: float, spans: Sequence[tuple[float, float, float | None]]
) -> list[tuple[float, float]]:
    """(training seconds, BLEU) at each validation of a peer, from its (start, end, BLEU) on the
    clock of ``loop_start``: the time since the loop started less every earlier validation.
    A validation without a BLEU is not listed, but its time is still left out."""
    validations, excluded = [], 0.0
    for start, end, bleu in spans:
        if bleu is not None:
            validations.append((start - loop_start - excluded, bleu))
        excluded += end - start
    return validations


def updates_per_epoch(config: dict[str, Any], peer: str) -> int:
    """Batches in an epoch of the training file that ``peer`` reads: both peers batch whole
    sentences, the last batch partial. (Ours buckets by length, which can add a batch or two.)"""
    corpus, root = corpus_files(config, peer)
    with open(root / f"{corpus['train']}.{corpus['src_lang']}", encoding="utf-8") as lines:
        sentences = sum(1 for _ in lines)
    return math.ceil(sentences / config["data"]["batch_size"])


def validation_steps(updates: int, val_check_interval: float) -> int:
    """Updates between two validations at our cadence: Lightning validates every
    ``int(batches per epoch * val_check_interval)`` batches, at least 1."""
    return max(1, int(updates * val_check_interval))


def _divisor_near(number: int, target: int) -> int:
    """The divisor of ``number`` nearest to ``target`` by ratio (the smaller on a tie)."""
    divisors = [d for d in range(1, number + 1) if number % d == 0]
    return min(divisors, key=lambda d: abs(math.log(d / target)))


def joey_config(
    config: dict[str, Any],
    work_dir: Path,
    val_check_interval: float,
    decode_batch_size: int = 64,
) -> dict[str, Any]:
    """The Joey NMT 2.3 config of the same work as ours: data files, sizes, batch, optimizer,
    epochs, and greedy validation with dev BLEU every ``val_check_interval`` of an epoch as ours
    (``validation_steps``); dev and test are decoded afterwards too, in batches of
    ``decode_batch_size`` sentences as ours are.

    Joey logs "Tokens per Sec" every ``logging_freq`` updates, which must divide
    ``validation_freq``: the divisor nearest to 25 updates."""
    data, model = config["data"], config["model"]
    corpus, root = corpus_files(config, "joeynmt")
    validation_freq = validation_steps(updates_per_epoch(config, "joeynmt"), val_check_interval)
    embedding = {
        "embedding_dim": model["embedding_size"],
        "scale": False,
        "dropout": model["dropout"],
    }
    side = {"level": "word", "lowercase": False, "max_length": 100, "voc_min_freq": 1}
    encoder_hidden = model["encoder_hidden_size"] or model["hidden_size"] // 2
    return {
        "name": "benchmark",
        "joeynmt_version": "2.3.0",
        "model_dir": str(work_dir / "joeynmt"),
        "use_cuda": False,
        "fp16": False,
        "random_seed": config["seed"],
        "data": {
            "train": str(root / corpus["train"]),
            "dev": str(root / corpus["val"]),
            "test": str(root / corpus["test"]),
            "dataset_type": "plain",
            "src": {"lang": corpus["src_lang"], **side},
            "trg": {"lang": corpus["tgt_lang"], **side},
        },
        # Validation decodes with these, made greedy by joeynmt.config.set_validation_args.
        "testing": {
            "n_best": 1,
            "beam_size": 1,
            "beam_alpha": -1,
            "batch_size": decode_batch_size,
            "batch_type": "sentence",
            "max_output_length": 60,
            "eval_metrics": ["bleu"],
            "sacrebleu_cfg": {"tokenize": "none"},
        },
        "training": {
            "optimizer": "adam",
            "adam_betas": [0.9, 0.999],
            "learning_rate": config["optim"]["optimizer"]["lr"],
            # Joey rejects no scheduler; a factor of 1 keeps the learning rate constant.
            "scheduling": "exponential",
            "decrease_factor": 1.0,
            "clip_grad_norm": config["optim"]["grad_clip"] or 0.0,
            "loss": "crossentropy",
            "normalization": "batch",
            "batch_size": data["batch_size"],
            "batch_type": "sentence",
            "epochs": config["trainer"]["max_epochs"],
            "shuffle": True,
            "num_workers": 0,
            "validation_freq": validation_freq,
            "logging_freq": _divisor_near(validation_freq, 25),
            "early_stopping_metric": "loss",
            "keep_best_ckpts": 1,
            "keep_last_ckpts": 1,
            "overwrite": True,
            "print_valid_sents": [],
        },
        "model": {
            "initializer": "xavier_uniform",
            "embed_initializer": "normal",
            "embed_init_weight": 0.1,
            "bias_initializer": "zeros",
            "tied_embeddings": False,
            "tied_softmax": False,
            "encoder": {
                "type": "recurrent",
                "rnn_type": "gru",
                "embeddings": embedding,
                "hidden_size": encoder_hidden,
                "bidirectional": True,
                "dropout": model["dropout"],
                "num_layers": model["encoder_layers"],
            },
            "decoder": {
                "type": "recurrent",
                "rnn_type": "gru",
                "embeddings": embedding,
                "hidden_size": model["hidden_size"],
                "dropout": model["dropout"],
                "hidden_dropout": model["dropout"],
                "num_layers": 1,
                "input_feeding": False,
                "init_hidden": "last",
                "attention": JOEY_ATTENTION[config["attention"]["_target_"]],
            },
        },
    }


class _JoeyRates(logging.Handler):
    """Collects the "Tokens per Sec" Joey NMT logs every ``logging_freq`` updates."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.rates: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        match = re.search(r"Tokens per Sec:\s+([0-9.]+)", record.getMessage())
        if match:
            self.rates.append(float(match.group(1)))


def _quiet_joey() -> None:
    """Keep Joey NMT's messages and progress bars off the console. It gives each of its modules'
    loggers a console handler at INFO: those go to WARNING (its training figures still reach
    ``_JoeyRates``, a handler of ours). Its prediction shows a progress bar per decoding pass;
    that is turned off (it passes ``disable=`` itself, so TQDM_DISABLE cannot)."""
    import joeynmt.prediction

    for name, logger in logging.root.manager.loggerDict.items():
        if name.startswith("joeynmt") and isinstance(logger, logging.Logger):
            for handler in logger.handlers:
                if type(handler) is logging.StreamHandler:  # not a FileHandler, not ours
                    handler.setLevel(logging.WARNING)
    progress_bar = joeynmt.prediction.tqdm

    def silent_progress_bar(*args: Any, **kwargs: Any) -> Any:
        return progress_bar(*args, **{**kwargs, "disable": True})

    joeynmt.prediction.tqdm = silent_progress_bar


def _joey_job(
    config: dict[str, Any],
    decode_repeats: int,
    bleu_target: float,
    threads: int | None,
    started: float,
) -> dict[str, Any]:
    """Joey NMT's own training loop (as ``joeynmt.training.train`` runs it), then its decoding
    of dev (BLEU) and test (speed) with the model in memory. Runs in a fresh process started at
    ``started`` (time.time()), with our ``threads`` setting (Joey NMT has none of its own).

    Each of the loop's validations (``TrainManager._validate``: dev loss, greedy decoding, BLEU,
    its reports) is timed and left out of the training seconds; its "Tokens per Sec" leave that
    time out too (``total_valid_duration``)."""
    if threads:
        torch.set_num_threads(threads)
    from joeynmt.config import parse_global_args, set_validation_args
    from joeynmt.prediction import predict, prepare
    from joeynmt.training import TrainManager

    rates = _JoeyRates()
    logging.getLogger("joeynmt.training").addHandler(rates)
    _quiet_joey()
    Path(config["model_dir"]).mkdir(parents=True, exist_ok=True)  # joeynmt's CLI makes it
    args = parse_global_args(config, rank=0, mode="train")
    model, train_data, dev_data, test_data = prepare(args, rank=0, mode="train")
    trainer = TrainManager(
        model=model,
        model_dir=args.model_dir,
        device=args.device,
        n_gpu=args.n_gpu,
        rank=0,
        num_workers=args.num_workers,
        autocast=args.autocast,
        seed=args.seed,
        train_args=args.train,
        dev_args=set_validation_args(args.test),
    )
    spans: list[tuple[float, float, float]] = []  # (start, end, dev BLEU) of each validation
    bleus: list[float] = []
    add_report, validate = trainer._add_report, trainer._validate

    def report_bleu(valid_scores: dict[str, float], new_best: bool = False) -> None:
        bleus.append(valid_scores["bleu"])  # sacrebleu's score, 0-100 as ours
        add_report(valid_scores=valid_scores, new_best=new_best)

    def timed_validate(valid_data: Any) -> None:
        start = time.perf_counter()
        validate(valid_data)
        spans.append((start, time.perf_counter(), bleus[-1]))

    # Instance attributes shadow the methods the loop calls as self._validate(...).
    trainer._add_report, trainer._validate = report_bleu, timed_validate
    # Nothing reads Joey's checkpoints (the model in memory decodes below) and ours writes none:
    # skip its save after every better validation and at the end.
    trainer._save_checkpoint = lambda new_best, score: None
    startup = time.time() - started
    ready = time.perf_counter()
    trainer.train_and_validate(train_data=train_data, valid_data=dev_data)
    validations = training_seconds_at(ready, spans)
    result: dict[str, Any] = {
        "startup_s": startup,
        "train_seconds": time.perf_counter() - ready - sum(end - start for start, end, _ in spans),
        # The first window includes the warm-up; the rest are steady state.
        "train_tgt_tok_per_s": statistics.median(rates.rates[1:] or rates.rates or [0.0]),
        "train_sent_per_s": None,  # Joey logs tokens only
        "peak_rss_mb": peak_rss_mb(),
        "time_to_bleu95_s": time_to_bleu(startup, validations, bleu_target),
        "validations": validations,
    }
    model.eval()

    def decode(data: Any, beam_size: int) -> tuple[float, dict[str, float]]:
        start = time.perf_counter()
        scores, *_ = predict(
            model=model,
            data=data,
            device=args.device,
            n_gpu=args.n_gpu,
            compute_loss=False,
            normalization=args.train.normalization,
            num_workers=args.num_workers,
            args=args.test._replace(beam_size=beam_size),
            autocast=args.autocast,
        )
        return len(data) / (time.perf_counter() - start), scores

    result["dev_bleu"] = decode(dev_data, 1)[1].get("bleu")
    for name, beam_size in [("greedy", 1), ("beam5", 5)]:
        speeds = [decode(test_data, beam_size)[0] for _ in range(decode_repeats)]
        result[f"{name}_sent_per_s"] = statistics.median(speeds)
    return result


# --- OpenNMT-py ----------------------------------------------------------------------------------

# OpenNMT-py 3.5.1 pins torch < 2.3, so it lives in an environment of its own
# (docs/performance.md) and runs through that environment's Python, as subprocesses.
OPENNMT_PYTHON_ENV = "SEQ2SEQ_OPENNMT_PYTHON"
# OpenNMT-py's ``global_attention`` for each of our scoring functions: additive is its "mlp"
# (Bahdanau), bilinear its "general"; it has no scaled dot product, so scaled_dot maps to "dot".
OPENNMT_ATTENTION = {
    "seq2seq.attention.AdditiveAttention": "mlp",
    "seq2seq.attention.MultiplicativeAttention": "general",
    "seq2seq.attention.DotProductAttention": "dot",
}
OPENNMT_INSTALL = (
    "Install it side by side in its own environment (it pins an old torch): "
    "python -m venv --system-site-packages VENV && VENV/bin/pip install --no-deps "
    "OpenNMT-py==3.5.1 and its requirements, as docs/performance.md and PEERS.md describe; "
    f"then pass --opennmt-python VENV/bin/python or set {OPENNMT_PYTHON_ENV}"
)
DECODE_MAX_LENGTH = 60  # the longest output either peer may decode (Joey's max_output_length)


def opennmt_python(explicit: str | os.PathLike[str] | None = None) -> str | None:
    """The Python that runs OpenNMT-py: ``explicit``, else $SEQ2SEQ_OPENNMT_PYTHON, else ours if
    ``onmt_train`` lies beside it; None if none is given or found."""
    chosen = explicit or os.environ.get(OPENNMT_PYTHON_ENV)
    if chosen:
        return str(chosen)
    beside = Path(sys.executable).parent  # not resolved: a venv's python is a symlink
    return sys.executable if (beside / "onmt_train").exists() else None


def opennmt_available(python: str | None) -> bool:
    """Whether ``python`` exists and imports OpenNMT-py (dependencies included)."""
    if not python or not Path(python).is_file():
        return False
    try:
        completed = subprocess.run(
            [python, "-c", "import onmt"], capture_output=True, timeout=300, env=_opennmt_env(1)
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return completed.returncode == 0


def _opennmt_env(threads: int | None) -> dict[str, str]:
    """The environment of OpenNMT-py's processes: our thread count (it has no option of its own)
    and permission to unpickle its own checkpoints under torch >= 2.6 (PEERS.md)."""
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def opennmt_config(
    config: dict[str, Any], work_dir: Path, val_check_interval: float, report_every: int = 25
) -> dict[str, Any]:
    """The OpenNMT-py 3.5.1 config (its YAML, as a dict) of the same work as ours: data files,
    sizes, batch, optimizer and as many updates as our epochs make; validation (dev loss, then
    greedy decoding and BLEU) every ``val_check_interval`` of an epoch as ours
    (``validation_steps``), a checkpoint at the end only, a training report every
    ``report_every`` updates.

    Its validation decodes greedily whatever the config says (``ScoringPreparator.translate``
    sets ``beam_size`` 1), up to ``max_length`` 250 tokens (its translation default, which the
    training config cannot change), and scores with sacrebleu's default 13a tokenization, which
    leaves pre-tokenized text such as the reverse task's as it is.

    As in PEERS.md: input feeding off (our decoders feed none), the whole corpus in one bucket
    (``bucket_size`` 20000; the default of 262144 repeats a small corpus ~13 times per bucket)
    and no DataLoader worker processes."""
    data, model = config["data"], config["model"]
    corpus, root = corpus_files(config, "opennmt")

    def path(split: str, lang: str) -> str:
        return str(root / f"{corpus[split]}.{corpus[lang]}")

    batch_size = data["batch_size"]
    updates = updates_per_epoch(config, "opennmt")
    steps = config["trainer"]["max_epochs"] * updates
    encoder_hidden = model["encoder_hidden_size"] or model["hidden_size"] // 2
    vocab_dir = work_dir / "opennmt" / "vocab"
    return {
        "save_data": str(vocab_dir / "data"),
        "src_vocab": str(vocab_dir / "vocab.src"),
        "tgt_vocab": str(vocab_dir / "vocab.tgt"),
        "overwrite": True,
        "data": {
            "corpus_1": {
                "path_src": path("train", "src_lang"),
                "path_tgt": path("train", "tgt_lang"),
            },
            "valid": {"path_src": path("val", "src_lang"), "path_tgt": path("val", "tgt_lang")},
        },
        "save_model": str(work_dir / "opennmt" / "model"),
        "seed": config["seed"],
        "model_type": "text",
        "encoder_type": "brnn",
        "decoder_type": "rnn",
        "rnn_type": "GRU",
        "enc_layers": model["encoder_layers"],
        "dec_layers": 1,
        "enc_hid_size": 2 * encoder_hidden,  # brnn splits it over the two directions
        "dec_hid_size": model["hidden_size"],
        "word_vec_size": model["embedding_size"],
        "global_attention": OPENNMT_ATTENTION[config["attention"]["_target_"]],
        "input_feed": 0,  # StdRNNDecoder: one GRU call over the whole target, attention after
        "bridge": False,
        "dropout": [model["dropout"]],
        "share_vocab": False,
        "param_init": 0.1,
        "optim": "adam",
        "learning_rate": config["optim"]["optimizer"]["lr"],
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "decay_method": "none",
        "learning_rate_decay": 1.0,
        "start_decay_steps": 10**9,
        "max_grad_norm": config["optim"]["grad_clip"] or 0.0,
        "label_smoothing": 0.0,
        "normalization": "sents",
        "batch_type": "sents",
        "batch_size": batch_size,
        "valid_batch_size": batch_size,
        "accum_count": [1],
        "train_steps": steps,
        "valid_steps": validation_steps(updates, val_check_interval),
        "valid_metrics": ["BLEU"],
        "save_checkpoint_steps": steps,
        "keep_checkpoint": 1,
        "report_every": report_every,
        "num_workers": 0,
        "bucket_size": 20000,
        "world_size": 1,
        "gpu_ranks": [],
        "model_dtype": "fp32",
    }


_ONMT_TIME = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) INFO\] "
# Step 20/   30; acc: 7.5; ppl:  49.0; xent: 3.9; lr: 0.00100; sents:     640; bsz:  806/ 870/64;
# 7482/8075 tok/s;      4 sec;  (onmt.utils.statistics.Statistics.output, one line)
_ONMT_REPORT = re.compile(
    _ONMT_TIME + r"Step\s+(\d+)(?:/\s*\d+)?;.*?sents:\s*(\d+); bsz:\s*([\d.]+)/\s*([\d.]+)/\s*"
    r"([\d.]+);\s*([\d.]+)/\s*([\d.]+) tok/s;",
    re.MULTILINE,
)
_ONMT_START = re.compile(_ONMT_TIME + r"Start training loop", re.MULTILINE)
# A validation (onmt.trainer.Trainer.validate, then the step report after it) logs, in order:
#   valid stats calculation\n    took: 0.0052 s.   (dev loss, timed from the validation's start)
#   validation BLEU: 0.153                         (sacrebleu, after greedy decoding of dev)
#   Validation accuracy: 2.027                     (the last line of its report)
_FLOAT = r"([-+\d.eE]+)"
_ONMT_VALID_LOSS = re.compile(
    _ONMT_TIME + r"valid stats calculation\s+took: " + _FLOAT + r" s\.", re.MULTILINE
)
_ONMT_VALID_BLEU = re.compile(_ONMT_TIME + r"validation BLEU: " + _FLOAT, re.MULTILINE)
_ONMT_VALID_END = re.compile(_ONMT_TIME + r"Validation accuracy: ", re.MULTILINE)


def _log_time(day_time: str, millis: str) -> float:
    """time.time() of a logging asctime (local time, millisecond resolution)."""
    return time.mktime(time.strptime(day_time, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


def _opennmt_validations(text: str) -> list[tuple[int, float, float, float | None]]:
    """Each validation in OpenNMT-py's log: where in ``text`` it is logged, its start and end
    (time.time()) and its dev BLEU (None if not logged).

    It starts when its dev loss started (that line's time less the seconds it logs; nothing runs
    between the update and it) and ends at the last line of the report after it."""
    losses = list(_ONMT_VALID_LOSS.finditer(text))
    validations = []
    for index, loss in enumerate(losses):
        stop = losses[index + 1].start() if index + 1 < len(losses) else len(text)
        bleu = _ONMT_VALID_BLEU.search(text, loss.end(), stop)
        end = _ONMT_VALID_END.search(text, loss.end(), stop) or bleu or loss
        start = _log_time(loss[1], loss[2]) - float(loss[3])
        score = float(bleu[3]) if bleu else None
        validations.append((loss.start(), start, _log_time(end[1], end[2]), score))
    return validations


def parse_opennmt_log(text: str, warmup_batches: int) -> dict[str, Any]:
    """Training speed from OpenNMT-py's log: steady-state target tokens/s and sentences/s over the
    report windows that begin after ``warmup_batches`` updates, when the loop started, and each
    validation's training seconds and dev BLEU.

    A window runs from the previous report line (the first from "Start training loop") to its own,
    by the lines' timestamps, so data loading counts as in ours, less the validations logged
    between the two lines; its target tokens (EOS included, as our ``tgt_lens`` counts BOS) are
    the logged mean target tokens per batch times the updates since the previous report. Updates
    after the last report are not counted. (The tok/s OpenNMT-py logs, kept in ``windows``,
    include validation time.)"""
    start = _ONMT_START.search(text)
    loop_start = _log_time(*start.groups()) if start else None
    validations = _opennmt_validations(text)

    def validating(after: int, before: int) -> float:
        """Seconds of the validations logged between those two places in ``text``."""
        return sum(
            (end - begin for place, begin, end, _ in validations if after < place < before), 0.0
        )

    previous_step, previous_time, previous_place = 0, loop_start, start.end() if start else 0
    tokens = sentences = 0.0
    seconds = 0.0
    windows = []
    for match in _ONMT_REPORT.finditer(text):
        now = _log_time(match[1], match[2])
        step, sents, tgt_per_batch = int(match[3]), int(match[4]), float(match[6])
        excluded = validating(previous_place, match.start())
        window = {
            "step": step,
            "tgt_tok_per_s": float(match[9]),
            "sents": sents,
            "validation_s": excluded,
        }
        windows.append(window)
        if previous_time is not None and previous_step >= warmup_batches:
            tokens += tgt_per_batch * (step - previous_step)
            sentences += sents
            seconds += now - previous_time - excluded
        previous_step, previous_time, previous_place = step, now, match.end()
    train_seconds = None
    if loop_start and previous_time:
        train_seconds = previous_time - loop_start - validating(0, previous_place)
    spans = [(begin, end, bleu) for _, begin, end, bleu in validations]
    return {
        "train_tgt_tok_per_s": tokens / seconds if seconds > 0 else None,
        "train_sent_per_s": sentences / seconds if seconds > 0 else None,
        "loop_start": loop_start,
        "train_seconds": train_seconds,
        "validations": training_seconds_at(loop_start, spans) if loop_start else [],
        "windows": windows,
    }


def _run_opennmt(
    what: str, python: str, args: Sequence[str], threads: int | None
) -> tuple[str, str]:
    """Run ``python args`` (OpenNMT-py's CLI, or our decoding script) in OpenNMT-py's
    environment; its stdout and stderr as text. ``what`` names it in the error."""
    completed = subprocess.run(
        [python, *args], capture_output=True, text=True, env=_opennmt_env(threads)
    )
    if completed.returncode != 0:
        output = completed.stdout + completed.stderr
        raise RuntimeError(f"{what} failed ({completed.returncode}):\n{output[-3000:]}")
    return completed.stdout, completed.stderr


def build_opennmt_vocab(python: str, config: dict[str, Any], config_path: Path) -> None:
    """Write ``config`` as YAML and count its vocabulary (``onmt_build_vocab``), once, before any
    timed run: PEERS.md timed ``onmt_train`` alone, so building the vocabulary is not start-up."""
    import yaml

    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    _run_opennmt(
        "onmt_build_vocab",
        python,
        ["-m", "onmt.bin.build_vocab", "-config", str(config_path), "-n_sample", "-1"],
        1,
    )


def _opennmt_job(
    python: str,
    config: dict[str, Any],
    config_path: Path,
    test_src: str,
    warmup_batches: int,
    bleu_target: float,
    decode_repeats: int,
    decode_batch_size: int,
    threads: int | None,
) -> dict[str, Any]:
    """``onmt_train`` on ``config`` (written to ``config_path``) with our thread count, then its
    decoding of dev (BLEU) and of the sentences in ``test_src`` (speed, ``opennmt_decode.py``).
    Runs in a fresh process, so the peak RSS of its children is that of the training alone.
    Its validations' times and BLEU come from its log (``parse_opennmt_log``)."""
    import sacrebleu
    import yaml

    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    started = time.time()
    log_text = "".join(
        _run_opennmt(
            "onmt_train", python, ["-m", "onmt.bin.train", "-config", str(config_path)], threads
        )
    )
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # only that child so far
    speed = parse_opennmt_log(log_text, warmup_batches)
    startup = speed["loop_start"] - started if speed["loop_start"] else None
    result: dict[str, Any] = {
        "startup_s": startup,
        "train_seconds": speed["train_seconds"],
        "train_tgt_tok_per_s": speed["train_tgt_tok_per_s"],
        "train_sent_per_s": speed["train_sent_per_s"],
        "peak_rss_mb": rss,
        "time_to_bleu95_s": time_to_bleu(startup, speed["validations"], bleu_target),
        "validations": speed["validations"],
        "report_windows": speed["windows"],
    }
    dev_src, dev_tgt = config["data"]["valid"]["path_src"], config["data"]["valid"]["path_tgt"]
    spec = {
        "model": f"{config['save_model']}_step_{config['train_steps']}.pt",
        "dev_src": dev_src,
        "test_src": test_src,
        "batch_size": decode_batch_size,
        "max_length": DECODE_MAX_LENGTH,
        "repeats": decode_repeats,
    }
    script = Path(__file__).with_name("opennmt_decode.py")
    stdout, stderr = _run_opennmt(
        "OpenNMT-py decoding", python, [str(script), json.dumps(spec)], threads
    )
    lines = [line for line in stdout.splitlines() if line.startswith("SEQ2SEQ_RESULT ")]
    if not lines:
        raise RuntimeError(f"OpenNMT-py decoding printed no result:\n{stderr[-3000:]}")
    decoded = json.loads(lines[-1].split(" ", 1)[1])
    references = Path(dev_tgt).read_text(encoding="utf-8").splitlines()
    bleu = sacrebleu.corpus_bleu(decoded["dev_hypotheses"], [references], tokenize="none")
    result["dev_bleu"] = bleu.score
    for name in ("greedy", "beam5"):
        result[f"{name}_sent_per_s"] = statistics.median(decoded[f"{name}_sent_per_s"])
    result["decode_sentences"] = decoded["test_sentences"]
    return result


# --- the whole benchmark -----------------------------------------------------------------------


PEERS = {"joeynmt": "Joey NMT", "opennmt": "OpenNMT-py"}  # name: title
PEER_CHOICES = ("auto", "joeynmt", "opennmt", "all", "none")


@dataclass
class BenchmarkOptions:
    """How much to measure; ``quick`` sizes suit a CI smoke test, not a report."""

    repeats: int = 3
    decode_repeats: int = 5
    warmup_batches: int = 20
    # 1/12 of an epoch: 26 updates on the reverse task, ~1 s of our training and ~1.8 s of
    # OpenNMT-py's. At 1/4 (78 updates) the first validation at BLEU 95 rounded the times up by
    # up to 2.6 and 5.3 s, as much as a fifth of what is measured.
    val_check_interval: float = 1 / 12
    bleu_target: float = 95.0
    decode_batch_size: int = 64
    attention_lengths: tuple[int, ...] = ATTENTION_LENGTHS
    attention_repeats: int = 10
    # "auto" (every installed peer that can read the data), "joeynmt", "opennmt", "all", "none"
    peer: str = "auto"
    opennmt_python: str | None = None  # None: $SEQ2SEQ_OPENNMT_PYTHON, or onmt_train beside ours
    plot: Path | None = None

    def __post_init__(self) -> None:
        for name in ("repeats", "decode_repeats", "attention_repeats", "decode_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1.")
        if self.warmup_batches < 0:
            raise ConfigError("--warmup-batches must be 0 or more.")
        if self.peer not in PEER_CHOICES:
            raise ConfigError(
                f"--peer must be one of {', '.join(PEER_CHOICES)}, got {self.peer!r}."
            )


def machine(device: str = "cpu") -> dict[str, Any]:
    """What the numbers were measured on (the GPU too when ``device`` is "cuda")."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
        **(gpu_description() if device == "cuda" else {}),
    }


def gpu_description() -> dict[str, Any]:
    """The GPU's name, memory and compute capability, and torch's CUDA and cuDNN versions."""
    properties = torch.cuda.get_device_properties(0)
    return {
        "gpu": properties.name,
        "gpu_memory_gb": round(properties.total_memory / 2**30, 1),
        "gpu_capability": f"{properties.major}.{properties.minor}",
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }


def chosen_peers(options: BenchmarkOptions, config: dict[str, Any]) -> list[str]:
    """The peers ``options.peer`` asks for: named ones must be installed (ConfigError if not);
    "auto" takes every installed peer that can read the data (files, not a synthetic task)."""
    python = opennmt_python(options.opennmt_python)
    available = {
        "joeynmt": joeynmt_available,
        "opennmt": lambda: opennmt_available(python),
    }
    if options.peer == "none":
        return []
    if benchmark_device(config) == "cuda":
        # Both peers' configs here run them on the CPU (Joey NMT's use_cuda: false, OpenNMT-py
        # without gpu_ranks), so a side-by-side ratio would compare hardware, not toolkits.
        if options.peer == "auto":
            return []
        raise ConfigError(
            f"--peer {options.peer} runs the peers on the CPU, and trainer=gpu runs ours on the "
            "GPU: their ratio would compare hardware. Pass --peer none with trainer=gpu, or drop "
            "trainer=gpu to compare with the peers on the CPU."
        )
    if options.peer == "auto":
        reads_files = str(config["data"]["corpus"].get("_target_", "")).endswith("ParallelCorpus")
        return [name for name in PEERS if reads_files and available[name]()]
    names = list(PEERS) if options.peer == "all" else [options.peer]
    if "joeynmt" in names and not available["joeynmt"]():
        raise ConfigError(
            f"--peer {options.peer}: Joey NMT cannot be imported. Install it over your torch with "
            "pip install joeynmt==2.3.0 importlib_metadata (see docs/performance.md), or "
            "pass --peer none."
        )
    if "opennmt" in names and not available["opennmt"]():
        if not python:
            where = "no Python with onmt_train beside it was found"
        elif not Path(python).is_file():
            where = f"{python} does not exist"
        else:
            where = f"{python} cannot import onmt"
        raise ConfigError(
            f"--peer {options.peer}: OpenNMT-py cannot be run ({where}). {OPENNMT_INSTALL}. "
            "Or pass --peer none."
        )
    return names


def run_benchmark(overrides: Sequence[str], options: BenchmarkOptions) -> dict[str, Any]:
    """Measure ours (and the peers') on the config ``overrides`` compose; see the module doc."""
    with tempfile.TemporaryDirectory(prefix="seq2seq-bench-") as scratch:
        work_dir = Path(scratch)
        config = compose_config(overrides, work_dir / "run")
        device = benchmark_device(config)
        peers = chosen_peers(options, config)
        threads = config.get("threads")
        # Each peer's config, and a function running one repeat of it in a fresh process.
        peer_configs: dict[str, dict[str, Any]] = {}
        peer_runs: dict[str, Callable[[int], dict[str, Any]]] = {}
        if "joeynmt" in peers:
            joey = joey_config(
                config, work_dir, options.val_check_interval, options.decode_batch_size
            )
            peer_configs["joeynmt"] = joey

            def joey_run(repeat: int) -> dict[str, Any]:
                seeded = {**joey, "random_seed": joey["random_seed"] + repeat}
                return in_fresh_process(
                    _joey_job,
                    seeded,
                    options.decode_repeats,
                    options.bleu_target,
                    threads,
                    time.time(),
                )

            peer_runs["joeynmt"] = joey_run
        if "opennmt" in peers:
            python = opennmt_python(options.opennmt_python)
            assert python is not None  # chosen_peers checked it
            # Report windows as long as our warm-up, so that skipping the first ones skips it.
            report_every = options.warmup_batches if 0 < options.warmup_batches <= 50 else 25
            onmt = opennmt_config(config, work_dir, options.val_check_interval, report_every)
            peer_configs["opennmt"] = onmt
            corpus = config["data"]["corpus"]
            test_src = str(
                Path(corpus["root"]) / f"{corpus.get('test') or corpus['val']}.{corpus['src_lang']}"
            )
            build_opennmt_vocab(python, onmt, work_dir / "opennmt" / "vocab.yaml")

            def onmt_run(repeat: int) -> dict[str, Any]:
                return in_fresh_process(
                    _opennmt_job,
                    python,
                    {**onmt, "seed": onmt["seed"] + repeat},
                    work_dir / "opennmt" / f"train-{repeat}.yaml",
                    test_src,
                    options.warmup_batches,
                    options.bleu_target,
                    options.decode_repeats,
                    options.decode_batch_size,
                    threads,
                )

            peer_runs["opennmt"] = onmt_run
        load_before = os.getloadavg()
        ours: list[dict[str, Any]] = []
        theirs: dict[str, list[dict[str, Any]]] = {name: [] for name in peers}
        job_options = {
            "warmup_batches": options.warmup_batches,
            "val_check_interval": options.val_check_interval,
            "bleu_target": options.bleu_target,
            "decode_repeats": options.decode_repeats,
            "decode_batch_size": options.decode_batch_size,
        }
        # Ours and the peers' runs alternate, so drift in the machine's speed hits all alike.
        for repeat in range(options.repeats):
            seeded = repeat_config(config, repeat)
            log.info("repeat %d/%d: seq2seq", repeat + 1, options.repeats)
            ours.append(in_fresh_process(_train_job, seeded, job_options, time.time()))
            for name in peers:
                log.info("repeat %d/%d: %s", repeat + 1, options.repeats, PEERS[name])
                theirs[name].append(peer_runs[name](repeat))
        log.info("scoring functions: forward + backward")
        costs = attention_costs(
            options.attention_lengths,
            repeats=options.attention_repeats,
            threads=threads,
            device=device,
        )
    report: dict[str, Any] = {
        "overrides": list(overrides),
        "machine": machine(device),
        "load_average_before": load_before,
        "repeats": options.repeats,
        "warmup_batches": options.warmup_batches,
        "val_check_interval": options.val_check_interval,
        # time_to_bleu95_s keeps its name whatever the target (the JSON's promise).
        "bleu_target": options.bleu_target,
        "model": {
            "decoder": config["model"]["decoder"]["_target_"],
            "attention": config["attention"]["_target_"],
        },
        "ours_runs": ours,
        "attention_ms": {
            mode: {
                name: {str(length): vars(spread) for length, spread in by_length.items()}
                for name, by_length in by_name.items()
            }
            for mode, by_name in costs.items()
        },
    }
    for key in HEADLINE:
        spread = Spread.of([run.get(key) for run in ours])
        report[key] = spread.median
        report[f"{key}_min"], report[f"{key}_max"] = spread.min, spread.max
    report["peers"] = [
        peer_report(name, _peer_attention(name, peer_configs[name]), theirs[name], report)
        for name in peers
    ]
    report["load_average_after"] = os.getloadavg()
    report["markdown"] = markdown_table(report, costs)
    if options.plot is not None:
        plot_attention_costs(costs, options.plot)
        report["plot"] = str(options.plot)
    return report


def _peer_attention(name: str, config: dict[str, Any]) -> str:
    """The peer's name for the scoring function it runs."""
    if name == "joeynmt":
        return str(config["model"]["decoder"]["attention"])
    return str(config["global_attention"])


def peer_report(
    name: str, attention: str, runs: list[dict[str, Any]], ours: dict[str, Any]
) -> dict[str, Any]:
    """One peer's part of the report: its runs, the median of each headline figure, and ours
    against it (``ratios``; above 1 means we are better: ours / theirs for rates and BLEU,
    theirs / ours for memory and seconds)."""
    peer: dict[str, Any] = {"name": name, "title": PEERS[name], "attention": attention}
    ratios = {}
    for key in HEADLINE:
        peer[key] = Spread.of([run.get(key) for run in runs]).median
        if ours.get(key) and peer[key]:
            lower_is_better = key in ("peak_rss_mb", "time_to_bleu95_s", "startup_s")
            ratios[key] = peer[key] / ours[key] if lower_is_better else ours[key] / peer[key]
    peer["ratios"] = ratios
    peer["runs"] = runs
    return peer


def markdown_table(report: dict[str, Any], costs: dict[str, dict[str, dict[int, Spread]]]) -> str:
    """The report as markdown: a table of ours (and each peer's, then ours / each peer's) and one
    of the scoring costs."""
    ours = report["ours_runs"]
    peers = report.get("peers", [])
    decoder = report["model"]["decoder"].rsplit(".", 1)[-1]
    attention = report["model"]["attention"].rsplit(".", 1)[-1]
    rows = [
        ("train target tok/s", "train_tgt_tok_per_s", 0),
        ("train sentences/s", "train_sent_per_s", 0),
        ("start-up s", "startup_s", 1),
        ("peak RSS MB (training)", "peak_rss_mb", 0),
        ("peak GPU memory MB (training)", "peak_gpu_mb", 0),
        ("greedy sentences/s", "greedy_sent_per_s", 0),
        ("beam-5 sentences/s", "beam5_sent_per_s", 0),
        (f"time to dev BLEU ≥ {report['bleu_target']:g}, s", "time_to_bleu95_s", 1),
        ("dev BLEU at the end (greedy)", "dev_bleu", 1),
    ]
    gpu = report["machine"].get("gpu")
    if gpu is None:  # a CPU run has no GPU memory row
        rows = [row for row in rows if row[1] != "peak_gpu_mb"]
    where = f", {gpu}" if gpu else ""
    header = f"| | seq2seq ({decoder}, {attention}{where}) |"
    header += "".join(f" {peer['title']} ({peer['attention']}) |" for peer in peers)
    # One peer: "ratio", as before; more: "ours / PEER" for each.
    header += "".join(
        " ratio |" if len(peers) == 1 else f" ours / {peer['title']} |" for peer in peers
    )
    lines = [header, "|---|---|" + "---|" * 2 * len(peers)]
    for label, key, digits in rows:
        line = f"| {label} | {Spread.of([run.get(key) for run in ours]).text(digits)} |"
        for peer in peers:
            line += f" {Spread.of([run.get(key) for run in peer['runs']]).text(digits)} |"
        for peer in peers:
            ratio = peer["ratios"].get(key)
            line += f" {ratio:.2f}× |" if ratio else " |"
        lines.append(line)
    lengths = sorted(
        {length for by_name in costs.values() for spread in by_name.values() for length in spread}
    )
    lines += [
        "",
        f"Scoring functions, forward + backward ms at B=64, H=256, S=T=L{where} (median of the "
        "repeats):",
        "",
    ]
    lines.append("| scoring | mode | " + " | ".join(f"L={length}" for length in lengths) + " |")
    lines.append("|---|---|" + "---|" * len(lengths))
    for mode, by_name in costs.items():
        for name, by_length in by_name.items():
            cells = " | ".join(f"{by_length[length].median:.2f}" for length in lengths)
            lines.append(f"| {name} | {mode} | {cells} |")
    return "\n".join(lines) + "\n"


def plot_attention_costs(costs: dict[str, dict[str, dict[int, Spread]]], path: Path) -> None:
    """Forward + backward ms against L for every scoring function, both modes, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    for mode, style in [("parallel", "-"), ("stepwise", "--")]:
        for index, (name, by_length) in enumerate(costs[mode].items()):
            lengths = sorted(by_length)
            axis.plot(
                lengths,
                [by_length[length].median or 0.0 for length in lengths],
                style,
                marker="o",
                color=f"C{index}",
                label=f"{name} ({mode})",
            )
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("S = T (tokens)")
    axis.set_ylabel("forward + backward, ms")
    axis.set_title("Attention cost vs length (B=64, H=256)")
    axis.legend(fontsize=7, ncol=2)
    axis.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(report: dict[str, Any], json_path: Path) -> None:
    json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


# A smoke test of every code path in seconds (CI), not a measurement.
QUICK = {
    "repeats": 1,
    "decode_repeats": 1,
    "warmup_batches": 1,
    "val_check_interval": 1.0,
    "attention_lengths": (10, 25),
    "attention_repeats": 1,
}
