"""What the benchmark harness and its peer runners share: spreads, memory, fresh processes, the
peers' corpus files and cadence, the machine's description."""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import platform
import resource
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from seq2seq.errors import ConfigError

log = logging.getLogger(__name__)

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
    "parameters",
)

PEERS = {"joeynmt": "Joey NMT", "opennmt": "OpenNMT-py"}  # name: title


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


def time_to_bleu(
    startup: float | None, validations: Sequence[tuple[float, float]], bleu_target: float
) -> float | None:
    """Start-up plus the training seconds at the first of ``validations`` (training seconds,
    BLEU) that reaches ``bleu_target``; None if none does (or the start-up is unknown)."""
    reached = [seconds for seconds, bleu in validations if bleu >= bleu_target]
    return startup + reached[0] if reached and startup is not None else None


def synchronize(device: str | torch.device) -> None:
    """Wait for the GPU's queued work, so that a host clock read after it times the kernels."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def is_transformer(config: dict[str, Any]) -> bool:
    """Whether the resolved ``config`` trains our Transformer (model=transformer: it has
    ``model.d_model``) rather than one of our RNN models."""
    return "d_model" in config["model"]


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


DECODE_MAX_LENGTH = 60  # the longest output either peer may decode (Joey's max_output_length)


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
