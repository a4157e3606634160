"""Time ``Seq2SeqDataModule.setup()`` on Tatoeba (167k pairs): uncached, cold cache, warm cache.

    python scripts/benchmark_data.py [--tatoeba PATH] [--cache-dir DIR] [--repeats N] [--json OUT]

"uncached" runs with ``cache_dir=None``; "cold" with an empty cache directory (read, train the
tokenizers, encode, write the entry); "cached" loads that entry. Each is run for a word-level
tokenizer and for BPE with 8000 tokens, with the settings of ``conf/data/tatoeba.yaml``. Prints
the median and min-max over the repeats, the hardware and the load average, which matters: other
processes on the machine slow every number down.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tokenizers
import torch

from seq2seq.data.corpora import Tatoeba
from seq2seq.data.datamodule import Seq2SeqDataModule
from seq2seq.data.tokenization import TokenizerSpec

# min_frequency and the length limits as conf/data/tsv.yaml sets them for Tatoeba.
TOKENIZERS = {
    "word": TokenizerSpec(level="word", vocab_size=0, min_frequency=2),
    "bpe8000": TokenizerSpec(level="bpe", vocab_size=8000, min_frequency=2),
}
MODES = ("uncached", "cold", "cached")


class _CacheLog(logging.Handler):
    """Collects the data module's cache messages, to check that "cached" runs really hit."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def hardware() -> dict[str, Any]:
    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "rayon_num_threads": os.environ.get("RAYON_NUM_THREADS"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "tokenizers": tokenizers.__version__,
    }


def time_setup(corpus: Tatoeba, spec: TokenizerSpec, cache_dir: Path | None) -> float:
    datamodule = Seq2SeqDataModule(corpus, tokenizer=spec, cache_dir=cache_dir)
    start = time.perf_counter()
    datamodule.setup()
    return time.perf_counter() - start


def run(corpus: Tatoeba, cache_root: Path, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Seconds of every setup() call, by tokenizer and mode."""
    cache_log = _CacheLog()
    module_log = logging.getLogger("seq2seq.data.datamodule")
    module_log.addHandler(cache_log)
    module_log.setLevel(logging.INFO)
    times: dict[str, dict[str, list[float]]] = {}
    for name, spec in TOKENIZERS.items():
        times[name] = {mode: [] for mode in MODES}
        for repeat in range(repeats):
            times[name]["uncached"].append(time_setup(corpus, spec, None))
            cache_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=cache_root))
            try:
                times[name]["cold"].append(time_setup(corpus, spec, cache_dir))
                cache_log.messages.clear()
                times[name]["cached"].append(time_setup(corpus, spec, cache_dir))
                if not any(message.startswith("data cache hit") for message in cache_log.messages):
                    sys.exit(f"error: the cached run of {name} did not hit: {cache_log.messages}")
            finally:
                shutil.rmtree(cache_dir)
            summary = ", ".join(f"{mode} {times[name][mode][-1]:.2f} s" for mode in MODES)
            print(f"{name} repeat {repeat + 1}/{repeats}: {summary}", flush=True)
    module_log.removeHandler(cache_log)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tatoeba", type=Path, default=Path("data/tatoeba-fra-eng/fra.txt"))
    parser.add_argument(
        "--cache-dir", type=Path, help="where the empty cache directories go (default: a temp dir)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write all timings as JSON here")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    corpus = Tatoeba(path=str(args.tatoeba), max_src_len=100, max_tgt_len=100)
    machine = hardware()
    load_before = os.getloadavg()
    print(
        f"{machine['cpu_model']}, nproc {machine['nproc']}, torch threads "
        f"{machine['torch_threads']}, load average {load_before[0]:.2f} (1 min)",
        flush=True,
    )
    if args.cache_dir is not None:
        args.cache_dir.mkdir(parents=True, exist_ok=True)
        times = run(corpus, args.cache_dir, args.repeats)
    else:
        with tempfile.TemporaryDirectory() as cache_root:
            times = run(corpus, Path(cache_root), args.repeats)
    load_after = os.getloadavg()

    summary: dict[str, dict[str, dict[str, float]]] = {}
    print(f"\nsetup() seconds over {args.repeats} repeats: median (min-max)")
    for name, by_mode in times.items():
        summary[name] = {}
        for mode, seconds in by_mode.items():
            summary[name][mode] = {
                "median": statistics.median(seconds),
                "min": min(seconds),
                "max": max(seconds),
            }
            print(
                f"  {name:8} {mode:8} {statistics.median(seconds):6.2f} "
                f"({min(seconds):.2f}-{max(seconds):.2f})"
            )
    print(f"load average before {load_before}, after {load_after}")
    if args.json is not None:
        report = {
            "corpus": str(args.tatoeba),
            "repeats": args.repeats,
            "hardware": machine,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "seconds": times,
            "summary": summary,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
