"""Is a CPU training run reproducible, and where does it stop being so? The toy task's default
run (seed 1, one epoch) trained once as the reference, then again in each variant: the same
command (identical?), another thread count, the reference decoder loop instead of the kernels,
and the instruction sets of another CPU: one level below this one's (AVX2 on a CPU with AVX-512,
else SSE4), for torch's ATen and our kernels (``ATEN_CPU_CAPABILITY``), oneDNN
(``ONEDNN_MAX_CPU_ISA``) and MKL (``MKL_ENABLE_INSTRUCTIONS``). Each variant's metrics.csv and
final weights against the reference's: how many logged values differ, the largest difference of
val BLEU, and the largest weight difference.

The report keeps the reference run's fingerprint (its logged values and a SHA-256 of every
weight), so that a run on another machine can be held to it: ``--against`` compares this
machine's reference run with the one in another machine's report, which is how an Intel and
an AMD CPU are compared without both being at hand.

    python -m benchmarks.determinism --out docs/benchmark/determinism.json
    python -m benchmarks.determinism --against docs/benchmark/determinism.json --out OTHER.json
"""

from __future__ import annotations

import argparse
import csv
import hashlib
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


def metric_differences(ours: list[dict[str, str]], theirs: list[dict[str, str]]) -> dict[str, Any]:
    """How many of two runs' logged values differ, and their largest val BLEU difference."""
    values = [(a[k], b.get(k)) for a, b in zip(ours, theirs, strict=False) for k in a if a[k]]
    bleu = [
        abs(float(a["val/bleu"]) - float(b["val/bleu"]))
        for a, b in zip(ours, theirs, strict=False)
        if a.get("val/bleu") and b.get("val/bleu")
    ]
    return {
        "logged values differing": f"{sum(1 for a, b in values if a != b)} of {len(values)}",
        "val BLEU, largest difference": max(bleu, default=0.0),
    }


def against(reference: Path, variant: Path) -> dict[str, Any]:
    first, second = weights(reference), weights(variant)
    largest = max(float((first[k] - second[k]).abs().max()) for k in first)
    summary = json.loads((variant / "summary.json").read_text())
    return {
        **metric_differences(metrics(reference), metrics(variant)),
        "weights, largest difference": largest,
        "test BLEU": summary.get("test_bleu"),
    }


def fingerprint(directory: Path) -> dict[str, Any]:
    """What a run computed, small enough to commit: its logged values (no timings), a SHA-256
    of each weight's bytes and its test BLEU."""
    summary = json.loads((directory / "summary.json").read_text())
    return {
        "metrics": metrics(directory),
        "weights sha256": {
            name: hashlib.sha256(tensor.contiguous().numpy().tobytes()).hexdigest()
            for name, tensor in weights(directory).items()
        },
        "test BLEU": summary.get("test_bleu"),
    }


def against_fingerprint(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """This machine's reference run against another machine's, from their fingerprints."""
    mine, other = ours["weights sha256"], theirs["weights sha256"]
    same = sum(1 for name, digest in mine.items() if other.get(name) == digest)
    return {
        **metric_differences(ours["metrics"], theirs["metrics"]),
        "weights identical": f"{same} of {len(mine)} tensors",
        "test BLEU": ours["test BLEU"],
    }


def other_machine(path: Path, ours: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows for ``--against``: another report's reference run against this machine's
    reference and each of its variants (one with the instruction sets of the other CPU should
    match it, if the level is all that differs). A report from before fingerprints were kept has
    only its runs' test BLEU: that much is shown."""
    report = json.loads(path.read_text())
    if "fingerprints" not in report:
        again = next(row for row in report["rows"] if row["variant"] == "the same command again")
        return [{
            "variant": f"the reference run on {report['machine']} (values not kept there)",
            "test BLEU": again["test BLEU"],
        }]  # fmt: skip
    theirs = report["fingerprints"]["reference"]
    rows = [
        {"variant": f"the reference run on {report['machine']}", "test BLEU": theirs["test BLEU"]}
    ]
    for name, fingerprint in ours.items():
        rows.append({
            "variant": f"{name} here against the reference run there",
            **against_fingerprint(fingerprint, theirs),
        })  # fmt: skip
    return rows


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
    parser.add_argument(
        "--against", type=Path, help="another machine's report: compare its reference run too"
    )
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
        fingerprints = {
            name: fingerprint(directory)
            for (name, _, _), directory in zip(VARIANTS, directories, strict=True)
        }
    if args.against is not None:
        for row in other_machine(args.against, fingerprints):
            rows.append(row)
            print(row, flush=True)
    report = {
        "machine": cpu(),
        "instruction set": LEVEL,
        "command": "seed=1 trainer.max_epochs=1",
        "rows": rows,
        "fingerprints": fingerprints,
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
