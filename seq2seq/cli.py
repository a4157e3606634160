"""What the command-line scripts share: clean errors instead of tracebacks, strict text reading."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from hydra.errors import InstantiationException

from seq2seq.errors import Seq2SeqError
from seq2seq.inference.translator import BACKENDS
from seq2seq.training.runtime import tune_allocator

log = logging.getLogger("seq2seq")


class UsageError(Seq2SeqError, ValueError):
    """Bad input to a command; the message names the file, line or option and the fix."""


# Errors caused by what the user gave us; their messages say what to fix, so no traceback.
USER_ERRORS = (Seq2SeqError,)


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """Turn a user error into ``error: <one paragraph>`` on stderr and exit status 2 (or the
    error's own ``exit_status``, e.g. 130 after SIGINT).

    Hydra wraps errors raised while building an object from the config; the cause is unwrapped
    when it is one of ours, and Hydra's own message (which names the config key) is kept otherwise.
    """
    try:
        yield
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(getattr(error, "exit_status", 2))
    except InstantiationException as error:
        cause = error.__cause__
        message = str(cause) if isinstance(cause, USER_ERRORS) else str(error)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """``[options] -- HYDRA_OVERRIDES`` -> (options, overrides); no ``--``: no overrides."""
    if "--" not in argv:
        return argv, []
    split = argv.index("--")
    return argv[:split], argv[split + 1 :]


def int_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum`` (so ``--beam-size 0`` is refused early),
    and <= ``maximum`` if one is given."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f"at least {minimum}" if maximum is None else f"from {minimum} to {maximum}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    return parse


# The largest β (and α) the command line takes, the server's and training's bound too (GNMT's
# lie within [0, 1]): a value one accepts, the others do.
MAX_COVERAGE_PENALTY = 10.0


def penalty_weight(text: str) -> float:
    """An argparse type: GNMT's α or β, a number from 0 to ``MAX_COVERAGE_PENALTY``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and 0 <= value <= MAX_COVERAGE_PENALTY):
        raise argparse.ArgumentTypeError(
            f"must be a number from 0 to {MAX_COVERAGE_PENALTY:g} (the server's bound too), "
            f"got {text}"
        )
    return value


def add_length_penalty_argument(parser: argparse.ArgumentParser) -> None:
    """``--length-penalty α``: GNMT's length penalty in beam search (``seq2seq.search``)."""
    parser.add_argument(
        "--length-penalty", type=penalty_weight, default=0.6, metavar="ALPHA",
        help="GNMT alpha, 0 to 10: beam search ranks hypotheses by log P / ((5 + |Y|) / 6)^alpha "
        "(0.6)",
    )  # fmt: skip


def add_coverage_penalty_argument(parser: argparse.ArgumentParser) -> None:
    """``--coverage-penalty β``: GNMT's coverage penalty in beam search (``seq2seq.search``)."""
    parser.add_argument(
        "--coverage-penalty",
        type=penalty_weight,
        default=0.0,
        metavar="BETA",
        help="GNMT beta, 0 to 10: beam search adds beta * sum_i log(min(attention to word i, 1)) "
        "to each finished hypothesis's score, against source words left untranslated (0: off, "
        "the default; above 0 with a beam of 1 it runs a beam search of one, with the length "
        "penalty too, instead of greedy decoding)",
    )


def check_coverage_penalty_backend(backend: str, beta: float) -> None:
    """Refuse ``--coverage-penalty`` on CTranslate2 before a model is loaded (the Translator
    refuses it too, for callers of the API)."""
    if backend == "ctranslate2" and beta > 0:
        raise UsageError(
            f"--coverage-penalty {beta:g} with --backend ctranslate2: CTranslate2 cannot apply "
            "the coverage penalty as this toolkit does (its penalty reads its alignment head's "
            "attention, not the last layer's heads averaged that ours reads), so it is refused "
            "rather than rank differently. Use --backend torch or onnx for a coverage penalty, "
            "or leave it at 0."
        )


def alignment_method(*words: str) -> Callable[[str], str | float]:
    """An argparse ``type`` for --alignment: one of ``words`` or a threshold from 0 to 1; 1 (no
    weight is above it) means hard links, as in Marian."""

    def parse(text: str) -> str | float:
        if text in words:
            return text
        if text.strip() in ("1", "1.0"):
            return "hard"
        try:
            threshold = float(text)
        except ValueError:
            threshold = -1.0
        if not 0 <= threshold <= 1:
            named = ", ".join(repr(word) for word in words)
            raise argparse.ArgumentTypeError(
                f"{text!r}: give {named} or a threshold from 0 to 1 such as 0.3"
            )
        return threshold

    return parse


def add_trust_argument(parser: argparse.ArgumentParser) -> None:
    """``--trust-module MODULE`` (repeatable): the modules whose scoring functions a model file
    may name (``seq2seq.inference.plugins``)."""
    parser.add_argument(
        "--trust-module",
        dest="trust_modules",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a scoring function the model file names from this module (or .py file): "
        "its code runs, so trust only your own (repeatable)",
    )


def add_backend_argument(parser: argparse.ArgumentParser) -> None:
    """``--backend torch|onnx``: what runs the search (``Translator.load``'s ``backend``)."""
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="torch",
        help="torch (the model; the default), onnx (a bundle exported with --onnx, in ONNX "
        "Runtime) or ctranslate2 (a bundle exported with --format ctranslate2)",
    )


def named_paths(specs: list[str], default_name: Callable[[Path], str]) -> list[tuple[str, Path]]:
    """``--model [NAME=]PATH`` options (serve.py, explore.py) -> (name, path) pairs, each path
    existing and each name once; a PATH alone is named ``default_name(PATH)``."""
    named: list[tuple[str, Path]] = []
    for spec in specs:
        name, separator, path_text = spec.partition("=")
        if not separator:
            name, path_text = default_name(Path(spec)), spec
        if not name or not path_text:
            raise UsageError(f"--model {spec!r}: give NAME=PATH (or a PATH alone).")
        if name in (taken for taken, _ in named):
            raise UsageError(
                f"--model {spec!r}: the name {name!r} is taken; give each model its own."
            )
        path = Path(path_text)
        if not path.exists():
            raise UsageError(
                f"--model {spec!r}: {path} does not exist (a bundle dir or checkpoint)."
            )
        named.append((name, path))
    return named


def run(main: Callable[[], int]) -> None:
    """Run a script's ``main``: known errors become one paragraph on stderr and exit status 2."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s", stream=sys.stderr)
    tune_allocator()
    try:
        with exit_on_user_error():
            status = main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        status = 130
    sys.exit(status)


def check_device(device: str) -> None:
    """Refuse ``--device cuda...`` early when torch sees no GPU."""
    import torch

    if device != "cpu" and not torch.cuda.is_available():
        raise UsageError(f"--device {device} asked for, but torch sees no GPU; use cpu.")


def report_parser(doc: str | None) -> argparse.ArgumentParser:
    """The parser of a benchmark script (``doc`` its module docstring): ``--json OUT.json``,
    ``--markdown``, then its own options and ``-- HYDRA_OVERRIDES``."""
    parser = argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0],
        usage="%(prog)s --json OUT.json [options] -- HYDRA_OVERRIDES",
    )
    parser.add_argument("--json", type=Path, required=True, help="write the report here")
    parser.add_argument("--markdown", type=Path, help="also write the markdown table here")
    return parser


def check_report_paths(json_path: Path, markdown_path: Path | None) -> None:
    """A benchmark's ``--json`` report and optional ``--markdown`` table can be written."""
    check_writable(json_path, "the report")
    if markdown_path:
        check_writable(markdown_path, "the markdown table")


def check_writable(path: Path, what: str) -> None:
    """Fail early, before any decoding, if ``path`` cannot be written; a file that does not exist
    yet is not created (a command refused later leaves nothing behind)."""
    directory = path.parent if path.parent != Path("") else Path(".")
    if not directory.is_dir():
        raise UsageError(
            f"cannot write {what} to {path}: the directory {directory} does not exist."
        )
    existed = path.exists()
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as error:
        raise UsageError(f"cannot write {what} to {path} ({error.strerror}).") from None
    if not existed:  # tried, not kept: a command refused later leaves no empty file behind
        path.unlink()


def read_sources_and_references(src: Path, ref: Path) -> tuple[list[str], list[str]]:
    """The lines of a source file and of its line-parallel reference file (evaluate.py,
    tune_decoding.py); files of different lengths are refused before any decoding."""
    from seq2seq.data.corpora import read_lines  # only the scoring scripts read these files

    sources = read_lines(src, "the source file")
    references = read_lines(ref, "the reference file")
    if len(sources) != len(references):
        raise UsageError(
            f"{src} has {len(sources)} lines but {ref} has {len(references)}: source "
            "and reference files must be line-parallel."
        )
    return sources, references
