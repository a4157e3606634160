"""OpenNMT-py 3.5.1, run in an environment of its own, as a peer of the benchmark
(docs/performance.md)."""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (
    DECODE_MAX_LENGTH,
    corpus_files,
    time_to_bleu,
    training_seconds_at,
    updates_per_epoch,
    validation_steps,
)

log = logging.getLogger(__name__)


# --- OpenNMT-py ----------------------------------------------------------------------------------

# OpenNMT-py 3.5.1 pins torch < 2.3, so it lives in an environment of its own
# (docs/performance.md) and runs through that environment's Python, as subprocesses.
OPENNMT_PYTHON_ENV = "SEQ2SEQ_OPENNMT_PYTHON"
# OpenNMT-py's ``global_attention`` for each of our scoring functions: additive is its "mlp"
# (Bahdanau), bilinear its "general"; it has no scaled dot product, so scaled_dot maps to "dot".
OPENNMT_ATTENTION = {
    "seq2seq.attention.AdditiveAttention": "mlp",
    "seq2seq.attention.GeneralAttention": "general",
    "seq2seq.attention.MultiplicativeAttention": "general",
    "seq2seq.attention.DotProductAttention": "dot",
}
OPENNMT_INSTALL = (
    "Install it side by side in its own environment (it pins an old torch): "
    "python -m venv --system-site-packages VENV && VENV/bin/pip install --no-deps "
    "OpenNMT-py==3.5.1 and its requirements, as docs/performance.md and PEERS.md describe; "
    f"then pass --opennmt-python VENV/bin/python or set {OPENNMT_PYTHON_ENV}"
)


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
