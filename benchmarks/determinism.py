"""Is a CPU training run reproducible, and where does it stop being so? The toy task's default
run (seed 1, one epoch) trained once as the reference, then again in each variant: the same
command (identical?), another thread count, the reference decoder loop instead of the kernels,
and the instruction sets of another CPU: one level below this one's (AVX2 on a CPU with AVX-512,
else SSE4), for torch's ATen and our kernels (``ATEN_CPU_CAPABILITY``), oneDNN
(``ONEDNN_MAX_CPU_ISA``) and MKL (``MKL_ENABLE_INSTRUCTIONS``). Each variant's metrics.csv and
final weights against the reference's: how many logged values differ, the largest difference of
val BLEU, and the largest weight difference.

    python -m benchmarks.determinism --out docs/benchmark/determinism.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
LOWER = {  # this CPU's level -> the environment that holds every library one level below it
    "AVX512": {
        "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "AVX2": {
        "ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    },
}  # fmt: skip
LEVEL = torch.backends.cpu.get_cpu_capability()
# (name, train.py overrides, environment): the reference first.
VARIANTS: list[tuple[str, list[str], dict[str, str]]] = [
    ("reference", [], {}),
    ("the same command again", [], {}),
    ("threads=2", ["threads=2"], {}),
    ("model.kernels=off", ["model.kernels=off"], {}),
]
if LEVEL in LOWER:
    below = LOWER[LEVEL]["MKL_ENABLE_INSTRUCTIONS"]
    VARIANTS.append((f"instruction sets below {LEVEL} ({below})", [], LOWER[LEVEL]))


def train(overrides: list[str], environment: dict[str, str], directory: Path) -> None:
    command = [
        sys.executable, str(ROOT / "train.py"), "seed=1", "trainer.max_epochs=1", "threads=1",
        "logger=csv", "trainer.enable_progress_bar=false", f"run_dir={directory}", *overrides,
    ]  # fmt: skip
    finished = subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **environment}
    )
    if finished.returncode != 0:
        raise RuntimeError(f"train.py {' '.join(overrides)} failed:\n{finished.stderr[-3000:]}")


def metrics(directory: Path) -> list[dict[str, str]]:
    """metrics.csv without its timing columns (wall-clock, tokens/s): what the run computed."""
    with open(directory / "metrics.csv", newline="", encoding="utf-8") as file:
        return [
            {k: v for k, v in row.items() if "tokens_per_s" not in k and "time" not in k}
            for row in csv.DictReader(file)
        ]


def weights(directory: Path) -> dict[str, torch.Tensor]:
    checkpoint = torch.load(directory / "checkpoints" / "last.ckpt", map_location="cpu")
    return dict(checkpoint["state_dict"])


def against(reference: Path, variant: Path) -> dict[str, Any]:
    ours, theirs = metrics(reference), metrics(variant)
    values = [(a[k], b.get(k)) for a, b in zip(ours, theirs, strict=False) for k in a if a[k]]
    differing = sum(1 for a, b in values if a != b)
    bleu = [
        abs(float(a["val/bleu"]) - float(b["val/bleu"]))
        for a, b in zip(ours, theirs, strict=False)
        if a.get("val/bleu") and b.get("val/bleu")
    ]
    first, second = weights(reference), weights(variant)
    largest = max(float((first[k] - second[k]).abs().max()) for k in first)
    summary = json.loads((variant / "summary.json").read_text())
    return {
        "logged values differing": f"{differing} of {len(values)}",
        "val BLEU, largest difference": max(bleu, default=0.0),
        "weights, largest difference": largest,
        "test BLEU": summary.get("test_bleu"),
    }


def cpu() -> str:
    """The processor's model name and whether it has AVX-512 (/proc/cpuinfo)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                 if line.startswith("model name")), "unknown")  # fmt: skip
    return (
        f"{name}, {'with' if ' avx512f' in info else 'without'} AVX-512, torch {torch.__version__}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the report (JSON) here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        directories = []
        for index, (name, overrides, environment) in enumerate(VARIANTS):
            directory = Path(scratch) / str(index)
            train(overrides, environment, directory)
            directories.append(directory)
            if index:
                rows.append({"variant": name, **against(directories[0], directory)})
                print(rows[-1], flush=True)
    report = {"machine": cpu(), "command": "seed=1 trainer.max_epochs=1", "rows": rows}
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
