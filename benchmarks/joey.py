"""Joey NMT 2.3.0, run in this process's environment, as a peer of the benchmark
(docs/performance.md)."""

from __future__ import annotations

import logging
import re
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    _divisor_near,
    corpus_files,
    is_transformer,
    peak_rss_mb,
    time_to_bleu,
    training_seconds_at,
    updates_per_epoch,
    validation_steps,
)
from seq2seq.errors import ConfigError

log = logging.getLogger(__name__)


# --- Joey NMT ------------------------------------------------------------------------------------

# Joey NMT's name for the scoring function nearest to each of ours: it has additive ("bahdanau")
# and bilinear ("luong", Luong's general); dot products have no counterpart, so they are compared
# with its bilinear one, as PEERS.md does.
JOEY_ATTENTION = {
    "seq2seq.attention.AdditiveAttention": "bahdanau",
    "seq2seq.attention.GeneralAttention": "luong",
    "seq2seq.attention.MultiplicativeAttention": "luong",
    "seq2seq.attention.DotProductAttention": "luong",
}


def joeynmt_available() -> bool:
    try:
        import joeynmt  # noqa: F401
    except Exception:  # any import failure (missing package, broken dependency) means "absent"
        return False
    return True


def joey_config(
    config: dict[str, Any],
    work_dir: Path,
    val_check_interval: float,
    decode_batch_size: int = 64,
) -> dict[str, Any]:
    """The Joey NMT 2.3 config of the same work as ours: data files, model and sizes (its
    recurrent model for our RNN models, its Transformer for ours: ``_joey_rnn_model``,
    ``_joey_transformer_model``), batch, optimizer, learning-rate schedule, label smoothing,
    epochs, and greedy validation with dev BLEU every ``val_check_interval`` of an epoch as ours
    (``validation_steps``); dev and test are decoded afterwards too, in batches of
    ``decode_batch_size`` sentences as ours are.

    Joey logs "Tokens per Sec" every ``logging_freq`` updates, which must divide
    ``validation_freq``: the divisor nearest to 25 updates."""
    data, optim = config["data"], config["optim"]
    if data.get("max_tokens"):
        raise ConfigError(
            f"--peer joeynmt batches {data['batch_size']} sentences as data.batch_size says, but "
            f"data.max_tokens={data['max_tokens']} makes ours batch by tokens: pass "
            "data.max_tokens=null to compare the same batches."
        )
    corpus, root = corpus_files(config, "joeynmt")
    validation_freq = validation_steps(updates_per_epoch(config, "joeynmt"), val_check_interval)
    side = {"level": "word", "lowercase": False, "max_length": 100, "voc_min_freq": 1}
    transformer = is_transformer(config)
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
            **_joey_optimizer(optim),
            **_joey_schedule(optim),
            # Joey's 0 would clip every gradient to nothing: None is its "no clipping".
            "clip_grad_norm": optim["grad_clip"] or None,
            "loss": "crossentropy",
            "label_smoothing": optim.get("label_smoothing", 0.0),
            # Ours divides the summed loss by the batch's target tokens. The RNN comparison keeps
            # PEERS.md's per-sentence loss; the Transformer's, new, matches ours, which matters
            # under gradient clipping (per-sentence gradients are ~15x larger on the toy task).
            "normalization": "tokens" if transformer else "batch",
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
        "model": _joey_transformer_model(config) if transformer else _joey_rnn_model(config),
    }


def _joey_optimizer(optim: dict[str, Any]) -> dict[str, Any]:
    """Joey's optimizer keys for ours (``optim.optimizer``): Adam or AdamW, same betas and weight
    decay (torch's defaults where ours leaves them out; Joey's own AdamW default betas differ)."""
    optimizer = optim["optimizer"]
    name = {"torch.optim.Adam": "adam", "torch.optim.AdamW": "adamw"}.get(optimizer["_target_"])
    if name is None:
        raise ConfigError(
            f"--peer joeynmt compares Adam or AdamW runs; optim.optimizer is "
            f"{optimizer['_target_']}. Pass --peer none, or "
            "optim.optimizer._target_=torch.optim.Adam."
        )
    return {
        "optimizer": name,
        "adam_betas": list(optimizer.get("betas", [0.9, 0.999])),
        "weight_decay": optimizer.get("weight_decay", 0.0 if name == "adam" else 0.01),
    }


def _joey_schedule(optim: dict[str, Any]) -> dict[str, Any]:
    """Joey's learning-rate keys for ours (``optim.scheduler``).

    None: a constant rate; Joey rejects no scheduler, and an exponential one with a factor of 1
    keeps the rate constant. ``inverse_sqrt`` (seq2seq.training.schedules): Joey's
    ``warmupinversesquareroot``, which rises linearly to its peak over ``learning_rate_warmup``
    updates, then decays as ``peak · sqrt(warmup / n)``: ours, with the same peak (our ``lr``)
    and warm-up. Joey 2.3 reads the peak from ``learning_rate``: its config parser drops
    ``learning_rate_peak`` (joeynmt/config.py), so the scheduler falls back to the optimizer's
    rate, and a peak given only there left Joey training at our rate of update 1 (2.6e-6) for
    good. Joey steps its scheduler after each update, so its first update runs at that peak, and
    from the second on it runs one update behind ours (at update n, ours n/W of the peak,
    Joey's (n - 1)/W), 0.25 % of the peak a step during a warm-up of 400. Its
    ``learning_rate_min`` is both a floor of the schedule and a stop (training ends when the rate
    falls below it), and our warm-up starts below its default of 1e-4: 0, as ours has none.
    Any other schedule of ours (plateau) is compared at a constant rate, with a warning."""
    lr = optim["optimizer"]["lr"]
    scheduler = optim.get("scheduler")
    target = str((scheduler or {}).get("_target_", ""))
    if target.endswith("InverseSquareRootSchedule"):
        assert scheduler is not None
        warmup = scheduler["warmup_steps"]
        return {
            "learning_rate": lr,  # the peak (see above)
            "scheduling": "warmupinversesquareroot",
            "learning_rate_warmup": warmup,
            "learning_rate_min": 0.0,
        }
    if scheduler:
        log.warning(
            "Joey NMT runs at a constant learning rate of %g: it has no counterpart of "
            "optim.scheduler %s (pass optim.scheduler=null to compare the same schedule).",
            lr,
            target,
        )
    return {"learning_rate": lr, "scheduling": "exponential", "decrease_factor": 1.0}


def _joey_rnn_model(config: dict[str, Any]) -> dict[str, Any]:
    """Joey's recurrent model for our GRU models (PEERS.md): bidirectional GRU encoder, GRU
    decoder without input feeding, untied embeddings."""
    model = config["model"]
    embedding = {
        "embedding_dim": model["embedding_size"],
        "scale": False,
        "dropout": model["dropout"],
    }
    encoder_hidden = model["encoder_hidden_size"] or model["hidden_size"] // 2
    return {
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
    }


def _joey_transformer_model(config: dict[str, Any]) -> dict[str, Any]:
    """Joey's Transformer of the same size as ours (seq2seq.models.transformer): layers, heads,
    model and feed-forward sizes, dropout, post- or pre-norm, embeddings × √D plus sinusoidal
    positions, the target embedding as the output layer's weight when ours ties them.

    What Joey cannot match: its heads score with scaled dot products only (a warning if ours
    uses another ``attention=``), one dropout rate also on the attention weights (a warning if
    our ``attention_dropout`` differs), no bias on the output layer (ours has one), LayerNorm
    eps 1e-6 (ours 1e-5), and ``nn.Linear``'s initialisation: Joey starts Xavier-uniform with
    zero biases, as ours does under ``model.init=xavier`` (a warning otherwise). The embeddings
    of both start from N(0, 1/D)."""
    model, attention = config["model"], config["attention"]
    d_model, dropout = model["d_model"], model["dropout"]
    scaled_dot = (
        attention["_target_"] == "seq2seq.attention.DotProductAttention"
        and attention.get("scaled")
        and attention.get("temperature", 1.0) == 1.0
    )
    if not scaled_dot:
        log.warning(
            "Joey NMT's Transformer attends with scaled dot products; ours with %s: pass "
            "attention=scaled_dot to compare the same model.",
            attention["_target_"],
        )
    if model.get("attention_dropout") not in (None, dropout):
        log.warning(
            "Joey NMT's Transformer drops attention weights at its one dropout rate, "
            "model.dropout=%g, not at model.attention_dropout=%g.",
            dropout,
            model["attention_dropout"],
        )
    init = model.get("init", "pytorch")  # configs written before model.init existed: pytorch
    if init != "xavier":
        log.warning(
            "Joey NMT's Transformer starts Xavier-uniform; ours with model.init=%s: pass "
            "model.init=xavier to compare the same model.",
            init,
        )
    # Joey adds the positions to its embeddings scaled by √D, as ours; dropout after both.
    embeddings = {"embedding_dim": d_model, "scale": True, "dropout": dropout}
    layers = {
        "type": "transformer",
        "embeddings": embeddings,
        "hidden_size": d_model,  # Joey requires embedding_dim == hidden_size
        "ff_size": model["d_ff"],
        "num_heads": model["num_heads"],
        # On every residual branch, inside the FFN and on the attention weights, in Joey.
        "dropout": dropout,
        # Joey's layers default to pre-norm and its stacks' final LayerNorm to post: say which.
        # Pre-norm adds one LayerNorm at the end of each stack, as ours does.
        "layer_norm": "pre" if model["norm_first"] else "post",
        "activation": "relu",
        "alpha": 1.0,  # the residual's weight: x + sublayer(x), as ours
    }
    return {
        "initializer": "xavier_uniform",
        # Ours draws embeddings from N(0, 1/D) (seq2seq.models.embedding): the same here.
        "embed_initializer": "normal",
        "embed_init_weight": d_model**-0.5,
        "bias_initializer": "zeros",
        # Joey's tied_embeddings shares the source and target embeddings (one vocabulary); ours
        # has one embedding per side, whatever data.joint_vocab says.
        "tied_embeddings": False,
        # The target embedding as the output layer's weight (ours: model.tie_embeddings).
        "tied_softmax": bool(model["tie_embeddings"]),
        "encoder": {**layers, "num_layers": model["encoder_layers"]},
        "decoder": {**layers, "num_layers": model["decoder_layers"]},
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
        "parameters": sum(parameter.numel() for parameter in model.parameters()),  # tied: once
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
