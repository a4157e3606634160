"""What DDP needs beyond Lightning: gathering Python objects, and ranks before the trainer exists.

Every helper here also works in a single process (it then does the trivial thing), so the code
that calls it has one path for one process and for many.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TypeVar, cast

import torch.distributed as dist

T = TypeVar("T")

# Environment variables that launchers set to a process's rank: torchrun (RANK), Lightning's own
# launcher (LOCAL_RANK and NODE_RANK for the processes it starts), SLURM (SLURM_PROCID).
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")


def is_nonzero_rank_from_env() -> bool:
    """True in a process that a DDP launcher started as any rank but global rank zero.

    Read from the environment, so it works before the process group (or even Hydra) is set up.
    """
    return any(os.environ.get(name, "0").strip() not in ("", "0") for name in _RANK_VARIABLES)


def hydra_overrides_for_rank(argv: Sequence[str]) -> list[str]:
    """Extra Hydra overrides for a non-zero rank, so that it writes no file of its own.

    Hydra would otherwise save ``.hydra/`` and a ``<job>.log`` in the run directory from every
    process (Lightning's launcher turns off the first, not the second). Rank zero keeps both.
    """
    if not is_nonzero_rank_from_env():
        return []
    extra = []
    if not any(arg.startswith("hydra.output_subdir=") for arg in argv):
        extra.append("hydra.output_subdir=null")
    if not any(
        arg.startswith(("hydra/job_logging=", "override hydra/job_logging=")) for arg in argv
    ):
        extra.append("hydra/job_logging=stdout")
    return extra


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def gather_objects(local: T) -> list[T]:
    """Every rank's ``local`` object, in rank order, on every rank (``[local]`` in one process)."""
    size = world_size()
    if size == 1:
        return [local]
    gathered: list[T | None] = [None] * size
    dist.all_gather_object(gathered, local)
    return cast(list[T], gathered)
