"""Process-wide CPU settings that training and inference share.

glibc's ``malloc`` serves every block above a (dynamic, initially 128 KiB) threshold with a fresh
``mmap`` and hands it back with ``munmap`` when freed, and it trims the top of the heap back to
the kernel. A training step allocates hundreds of short-lived tensors of 0.1 to 4 MB, so on the
CPU each of them paid for page faults and for the kernel zeroing its pages, many times the cost
of the op itself. Raising both thresholds keeps those blocks in the heap for reuse (what it
gains: docs/performance.md).

PyTorch's CPU performance guide suggests the same cure through jemalloc or tcmalloc
(``LD_PRELOAD``); this needs nothing installed. ``SEQ2SEQ_MALLOC_TUNING=0`` turns it off.
Outside glibc (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os

log = logging.getLogger(__name__)

# mallopt parameters, from glibc's malloc.h.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# The largest mmap threshold glibc accepts on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX):
# blocks up to 32 MiB come from the heap, larger ones (rare, and dear anyway) still from mmap.
MMAP_THRESHOLD = 32 * 1024 * 1024
# Free memory at the top of the heap is given back once it exceeds this.
TRIM_THRESHOLD = 256 * 1024 * 1024


def tune_allocator() -> bool:
    """Keep freed tensor memory in glibc's heap (see the module doc). True if it took effect."""
    if os.environ.get("SEQ2SEQ_MALLOC_TUNING", "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; setting the thresholds also stops glibc adjusting them.
    done = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    done = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and done
    if not done:
        log.debug("mallopt refused the allocator thresholds; malloc keeps its defaults")
    return done


def freeze_startup_objects() -> None:
    """Move every object the collector tracks now into its permanent generation, so that no full
    collection scans them again: called once training is set up, these are the imported modules
    (torch, Lightning, scipy through torchmetrics), the data and the model, some 400,000 objects.

    A full collection of them took 0.2 s here (2-core AMD EPYC), and the first one came within
    the first second of training, every run; later ones are rarer but cost the same. Objects made
    afterwards are collected as usual; a frozen object that becomes cyclic garbage is never freed,
    which costs nothing here (startup objects live as long as the process).
    """
    gc.freeze()
