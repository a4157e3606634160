"""Checkpoint averaging: one model whose every weight is the mean of several checkpoints'.

Averaging the last (or best) few checkpoints of a run smooths the noise of the final updates and
usually gains some BLEU on small data (Vaswani et al., 2017; Junczys-Dowmunt et al., 2016). The
result is a checkpoint file like ``train.py``'s, so ``evaluate.py``, ``translate.py`` and
``export.py`` take it as they take any; it holds no optimizer state, so a run cannot resume from
it (``ckpt_path=`` says so).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from seq2seq.atomic import write_atomic
from seq2seq.inference.bundle import (
    CHECKPOINT_KEY,
    ModelFileError,
    load_checkpoint,
    read_checkpoint,
)

KEPT = {"last": "val-step=*.ckpt", "best": "top-step=*.ckpt"}  # pipeline.kept_checkpoints's


def average_checkpoints(
    paths: Sequence[Path], out: Path, trust_modules: Iterable[str] = ()
) -> Path:
    """Write the mean of ``paths``' weights to ``out``, with the model config, vocabularies and
    decoding settings of the last of them (which must all describe one model); ``trust_modules``
    as for ``bundle.load``."""
    if len(paths) < 1:
        raise ModelFileError("no checkpoints to average: give one or more .ckpt files.")
    checkpoints = [read_checkpoint(path) for path in paths]
    for path in paths:
        load_checkpoint(
            path, trust_modules=trust_modules
        )  # a seq2seq checkpoint whose weights fit its own model config
    configs = [checkpoint[CHECKPOINT_KEY]["model_config"] for checkpoint in checkpoints]
    for path, config in zip(paths[1:], configs[1:], strict=True):
        if config != configs[0]:
            raise ModelFileError(
                f"{path} holds another model than {paths[0]} (their model configs differ): "
                "average checkpoints of one run."
            )
    states = [checkpoint["state_dict"] for checkpoint in checkpoints]
    averaged: dict[str, torch.Tensor] = {}
    for name, first in states[0].items():
        if first.is_floating_point():
            # Summed in float64, so that the mean of many checkpoints rounds once.
            total = torch.stack([state[name].double() for state in states]).sum(0)
            averaged[name] = (total / len(states)).to(first.dtype)
        else:
            averaged[name] = states[-1][name]  # counters and the like: the latest
    meta = dict(checkpoints[-1][CHECKPOINT_KEY])
    meta["metrics"] = {}  # no single evaluation describes the mean
    meta["averaged_from"] = [str(path) for path in paths]
    result: dict[str, Any] = {"state_dict": averaged, CHECKPOINT_KEY: meta}
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, lambda temporary: torch.save(result, temporary))
    return out


def kept_checkpoints(run_dir: Path, which: str, count: int) -> list[Path]:
    """The ``count`` latest (``which="last"``) or best by val/bleu (``"best"``) checkpoints that a
    run kept (``checkpoint.keep_last`` / ``checkpoint.keep_best``), oldest first."""
    directory = run_dir / "checkpoints"
    found = sorted(directory.glob(KEPT[which]), key=_step)
    if which == "best":
        found = sorted(found, key=_val_bleu)[-count:]
        found = sorted(found, key=_step)
    else:
        found = found[-count:]
    if len(found) < count:
        setting = "keep_last" if which == "last" else "keep_best"
        raise ModelFileError(
            f"{directory} holds {len(found)} of the {count} checkpoints asked for ({KEPT[which]}); "
            f"train with checkpoint.{setting}={count} (or more) to keep them, or ask for fewer."
        )
    return found


def _step(path: Path) -> int:
    match = re.search(r"step=(\d+)", path.name)
    return int(match.group(1)) if match else -1


def _val_bleu(path: Path) -> float:
    metrics = read_checkpoint(path).get(CHECKPOINT_KEY, {}).get("metrics", {})
    return float(metrics.get("val/bleu", float("-inf")))
