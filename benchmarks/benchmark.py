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

import logging
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor

from benchmarks.common import (
    HEADLINE,
    PEERS,
    Spread,
    in_fresh_process,
    is_transformer,
    machine,
    peak_rss_mb,
    synchronize,
    time_to_bleu,
)
from benchmarks.joey import _joey_job, joey_config, joeynmt_available
from benchmarks.opennmt import (
    OPENNMT_INSTALL,
    _opennmt_job,
    build_opennmt_vocab,
    opennmt_available,
    opennmt_config,
    opennmt_python,
)
from benchmarks.report import (
    _peer_attention,
    markdown_table,
    peer_report,
    plot_attention_costs,
)
from seq2seq.attention import Attention
from seq2seq.errors import ConfigError
from seq2seq.pipeline import model_kind, scoring_config
from seq2seq.training.runtime import freeze_startup_objects, tune_allocator

log = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
ATTENTION_LENGTHS = (10, 25, 50, 100)
# The keys the JSON promises (each a median); more are written beside them.


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
    config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config, dict)
    resolved = {str(key): value for key, value in config.items()}
    check_model_keys(resolved)
    return resolved


# The RNN models' sizes, which experiment=bench_reverse sets: a Transformer has none of them.
RNN_SIZES = ("embedding_size", "hidden_size", "encoder_hidden_size")


def check_model_keys(config: dict[str, Any]) -> None:
    """Refuse a Transformer config that carries the RNN models' sizes. ``experiment=bench_reverse
    model=transformer`` composes one: the experiment's RNN settings land on the Transformer
    (``encoder_layers: 1``, no warm-up schedule, keys its constructor does not take)."""
    stray = [key for key in RNN_SIZES if key in config["model"]]
    if is_transformer(config) and stray:
        raise ConfigError(
            f"model=transformer with the RNN models' model.{', model.'.join(stray)}: "
            "experiment=bench_reverse sets those, and encoder_layers=1 and no learning-rate "
            "schedule, for the RNN models. Use experiment=bench_reverse_transformer, the same "
            "task for the Transformer (docs/performance.md)."
        )


def model_description(config: dict[str, Any]) -> dict[str, Any]:
    """What the report says of our model: its kind (gru, lstm or transformer), its decoder (the
    Transformer's own class), scoring function and sizes."""
    from omegaconf import OmegaConf

    model = config["model"]
    if is_transformer(config):
        decoder = model["_target_"]
        keys = ["d_model", "num_heads", "d_ff", "encoder_layers", "decoder_layers", "dropout"]
        keys += ["attention_dropout", "norm_first", "tie_embeddings", "init"]
    else:
        decoder = model["decoder"]["_target_"]
        keys = ["embedding_size", "hidden_size", "encoder_hidden_size", "encoder_layers"]
        keys += ["dropout"]
    return {
        "kind": model_kind(OmegaConf.create(config)),
        "decoder": decoder,
        "attention": config["attention"]["_target_"],
        "sizes": {key: model.get(key) for key in keys},
    }


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
    # Tied weights once (parameters() yields each parameter once).
    result["parameters"] = sum(parameter.numel() for parameter in module.model.parameters())
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
        factory = instantiate(scoring_config(config.attention))
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


# --- the whole benchmark -----------------------------------------------------------------------


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
    # OpenNMT-py's config here (benchmarks/opennmt.py) is the RNN models' only.
    comparable = [name for name in PEERS if name == "joeynmt" or not is_transformer(config)]
    if options.peer == "auto":
        reads_files = str(config["data"]["corpus"].get("_target_", "")).endswith("ParallelCorpus")
        return [name for name in comparable if reads_files and available[name]()]
    names = list(PEERS) if options.peer == "all" else [options.peer]
    if not set(names) <= set(comparable):
        raise ConfigError(
            f"--peer {options.peer}: OpenNMT-py is compared with our RNN models only, not with "
            "model=transformer. Pass --peer joeynmt (its Transformer), or --peer none."
        )
    if "joeynmt" in names and not available["joeynmt"]():
        raise ConfigError(
            f"--peer {options.peer}: Joey NMT cannot be imported. Install it over your torch in "
            "an environment of its own (it pins protobuf < 3.21): python -m venv "
            "--system-site-packages VENV && VENV/bin/pip install joeynmt==2.3.0 "
            "importlib_metadata, then run this script with VENV/bin/python (docs/performance.md); "
            "or pass --peer none."
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
        "model": model_description(config),
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


QUICK = {
    "repeats": 1,
    "decode_repeats": 1,
    "warmup_batches": 1,
    "val_check_interval": 1.0,
    "attention_lengths": (10, 25),
    "attention_repeats": 1,
}
