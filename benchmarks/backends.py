"""The inference backends side by side on one test set: time, BLEU and how many translations
differ from PyTorch's, for greedy and beam search (scripts/compare_backends.py)."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

import sacrebleu
import torch

from seq2seq import Translator


def compare_backends(
    model: Path,
    sources: list[str],
    references: list[str],
    backends: list[str],
    beam_sizes: list[int],
    batch_size: int = 64,
    rounds: int = 2,
) -> dict[str, Any]:
    """Each backend and beam size translates ``sources`` ``rounds`` times, alternating backends
    round by round (the machine's drift falls on all alike); the fastest round counts."""
    translators = {backend: Translator.load(model, backend=backend) for backend in backends}
    rows = []
    for beam_size in beam_sizes:
        outputs: dict[str, list[str]] = {}
        seconds: dict[str, list[float]] = {backend: [] for backend in backends}
        for _ in range(rounds):
            for backend, translator in translators.items():
                start = time.perf_counter()
                outputs[backend] = translator.translate(sources, beam_size, batch_size=batch_size)
                seconds[backend].append(time.perf_counter() - start)
        first = outputs[backends[0]]
        for backend in backends:
            differ = sum(a != b for a, b in zip(outputs[backend], first, strict=True))
            best = min(seconds[backend])
            rows.append(
                {
                    "backend": backend,
                    "beam_size": beam_size,
                    "seconds": best,
                    "sentences_per_s": len(sources) / best,
                    "bleu": sacrebleu.corpus_bleu(outputs[backend], [references]).score,
                    "differ_from_first": differ,
                }
            )
    return {
        "model": str(model),
        "sentences": len(sources),
        "batch_size": batch_size,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "rows": rows,
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"{report['sentences']} sentences, batches of {report['batch_size']}, "
        f"{report['threads']} threads on {report['cpus']} CPUs ({report['machine']}); fastest of "
        "the alternating rounds.",
        "",
        "| backend | beam | seconds | sentences/s | BLEU | differ from the first backend |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['backend']} | {row['beam_size']} | {row['seconds']:.2f} | "
            f"{row['sentences_per_s']:.1f} | {row['bleu']:.2f} | {row['differ_from_first']} |"
        )
    return "\n".join(lines) + "\n"
