"""Atomic file writes: a reader sees the old file or the new one, never a half-written one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write`` on a temporary file beside ``path``, fsync it, rename it over ``path``.

    The temporary file is in the same directory, so the rename stays within one file system; it
    is removed if anything fails, and ``path`` keeps its previous content.
    """
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    temporary = Path(name)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp's 0600 would hide the file from others
        write(temporary)
        # Again: a writer may replace the file rather than write into it (safetensors' save_file
        # leaves 0600).
        os.chmod(temporary, 0o666 & ~umask)
        with open(temporary, "rb") as written:
            os.fsync(written.fileno())  # the data must be on disk before the name points at it
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
