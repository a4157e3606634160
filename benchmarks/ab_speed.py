"""Training speed of two revisions of this repository, A/B, in one invocation.

    python -m benchmarks.ab_speed --old REV [--new REV] [--repeats 3] [--steps 300]
        [--out docs/benchmark/ab] -- HYDRA OVERRIDES

Checks out ``--old`` and ``--new`` (default: HEAD) into temporary git worktrees,
then trains the same config in each (``python train.py`` with the overrides, ``--steps``
optimizer steps, one thread, no test pass), alternating old, new, old, new... so that a slow
spell of the machine falls on both, and reads each run's training tokens/s from its
``summary.json``. Prints and writes the median of each and their ratio (new ÷ old).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.switch_speed import train_py_tokens_per_s

ROOT = Path(__file__).resolve().parents[1]


def worktree(revision: str, directory: Path) -> Path:
    """A detached worktree of ``revision`` at ``directory``."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(directory), revision],
        check=True, capture_output=True,
    )  # fmt: skip
    return directory


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    overrides: list[str] = []
    if "--" in argv:
        overrides = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        usage="%(prog)s --old REV [--new REV] [--repeats N] [--steps N] [--out DIR] "
        "[-- HYDRA OVERRIDES]",
        epilog="After --, the train.py overrides both revisions train with, e.g. -- "
        "model.decoder=luong attention=dot.",
    )
    parser.add_argument("--old", required=True, help="the revision to compare against")
    parser.add_argument("--new", default="HEAD", help="the revision to measure (HEAD)")
    parser.add_argument("--repeats", type=int, default=3, help="alternations of old and new (3)")
    parser.add_argument("--steps", type=int, default=300, help="updates per train.py run (300)")
    parser.add_argument("--out", type=Path, default=None, help="a directory for the result (JSON)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        checkouts = {"old": worktree(args.old, base / "old")}
        checkouts["new"] = worktree(args.new, base / "new")
        speeds: dict[str, list[float]] = {"old": [], "new": []}
        try:
            for repeat in range(args.repeats):
                for name in ("old", "new"):
                    run_dir = base / f"{name}-{repeat}"
                    speed = train_py_tokens_per_s(overrides, args.steps, run_dir, checkouts[name])
                    speeds[name].append(speed)
                    print(f"{name} {repeat}: {speed:,.0f} tokens/s", flush=True)
        finally:
            for checkout in checkouts.values():
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(checkout)],
                    check=False, capture_output=True,
                )  # fmt: skip
    medians = {name: statistics.median(values) for name, values in speeds.items()}
    result = {
        "old": args.old,
        "new": args.new,
        "overrides": overrides,
        "steps": args.steps,
        "tokens_per_s": speeds,
        "median": medians,
        "ratio": medians["new"] / medians["old"],
    }
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        name = "_".join(o.replace("=", "-").replace(".", "-") for o in overrides) or "default"
        (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
