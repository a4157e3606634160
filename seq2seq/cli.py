"""What the command-line scripts share: clean errors instead of tracebacks, strict text reading."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

from seq2seq.bundle import ModelFileError

log = logging.getLogger("seq2seq")


class UsageError(ValueError):
    """Bad input to a command; the message names the file, line or option and the fix."""


def run(main: Callable[[], int]) -> None:
    """Run a script's ``main``: known errors become one paragraph on stderr and exit status 2."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s", stream=sys.stderr)
    try:
        status = main()
    except (UsageError, ModelFileError) as error:
        print(f"error: {error}", file=sys.stderr)
        status = 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        status = 130
    sys.exit(status)


def read_lines(path: Path, what: str) -> list[str]:
    """Lines of a UTF-8 text file, split on "\\n" only; errors name the file, line and byte."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{what} {path} does not exist; check the path.") from None
    except OSError as error:
        raise UsageError(f"{what} {path} cannot be read ({error.strerror}).") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline that ends the last line does not start another
    texts = []
    offset = 0
    for number, raw in enumerate(lines, start=1):
        try:
            texts.append(raw.removesuffix(b"\r").decode("utf-8"))
        except UnicodeDecodeError as error:
            raise UsageError(
                f"{path}:{number}: invalid UTF-8 at byte offset {offset + error.start} of the file "
                f"(byte 0x{raw[error.start]:02x}). Convert {what} to UTF-8 (e.g. with iconv)."
            ) from None
        offset += len(raw) + 1
    return texts


def check_writable(path: Path, what: str) -> None:
    """Fail early, before any decoding, if ``path`` cannot be written."""
    directory = path.parent if path.parent != Path("") else Path(".")
    if not directory.is_dir():
        raise UsageError(
            f"cannot write {what} to {path}: the directory {directory} does not exist."
        )
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as error:
        raise UsageError(f"cannot write {what} to {path} ({error.strerror}).") from None
