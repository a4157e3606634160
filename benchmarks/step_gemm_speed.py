"""A step loop's GEMMs two ways (``seq2seq.kernels.step_gemm``): torch's ``addmm`` against the C
kernels' panels, at the decoders' shapes (a step's rows by a GRU's W_hh^T, its backward's W_hh,
and a square H × H), on torch's threads. What ``step_panels`` chooses from, measured on the
machine it runs on; run it again with ``SEQ2SEQ_KERNELS_ISA=avx2`` for the AVX2 build.

    python -m benchmarks.step_gemm_speed [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.benchmark import machine
from seq2seq.kernels.library import kernel_isa, library
from seq2seq.kernels.step_gemm import StepWeight

ROWS = (8, 32, 64, 320)  # a step's rows once sentences have ended, a batch's, beam 5's B·K
SHAPES = ((256, 768), (768, 256), (256, 256))  # (K, N): W_hh^T, W_hh, an H × H weight


def median_microseconds(call: Callable[[], Any], repeats: int = 200, rounds: int = 7) -> float:
    """The median over ``rounds`` of a round's mean time of ``call``, in microseconds."""
    for _ in range(repeats // 4):
        call()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        times.append((time.perf_counter() - start) / repeats * 1e6)
    return statistics.median(times)


def measure(rows: int, inner: int, columns: int) -> dict[str, Any]:
    """torch's addmm and the panels for (rows, K) @ (K, N) + bias, and their largest difference."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(rows, inner, generator=generator)
    weight = torch.randn(columns, inner, generator=generator)  # a layer's (N, K)
    bias = torch.randn(columns, generator=generator)
    expected, got = torch.empty(rows, columns), torch.empty(rows, columns)
    packed = StepWeight(weight, panels=True)
    torch_us = median_microseconds(lambda: torch.addmm(bias, inputs, weight.t(), out=expected))
    panels_us = median_microseconds(lambda: packed.into(got, inputs, bias))
    return {
        "rows": rows, "inner": inner, "columns": columns, "torch_us": round(torch_us, 1),
        "panels_us": round(panels_us, 1), "speedup": round(torch_us / panels_us, 2),
        "max_difference": float((got - expected).abs().max()),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    arguments = parser.parse_args()
    if library() is None:
        raise SystemExit("the C kernels are not built here: nothing to compare")
    rows = [measure(count, inner, columns) for count in ROWS for inner, columns in SHAPES]
    report = {"machine": machine(), "isa": kernel_isa(), "threads": torch.get_num_threads()}
    print(f"{report['machine']}, library built for {report['isa']}, {report['threads']} threads")
    print("| rows × K by K × N | torch addmm µs | panels µs | torch ÷ panels |")
    print("|---|---|---|---|")
    for row in rows:
        shape = f"{row['rows']} × {row['inner']} by {row['inner']} × {row['columns']}"
        print(f"| {shape} | {row['torch_us']} | {row['panels_us']} | {row['speedup']} |")
    if arguments.out is not None:
        arguments.out.write_text(json.dumps({**report, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
