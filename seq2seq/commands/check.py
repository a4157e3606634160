"""Check an attention you wrote: its properties on random inputs, and the bug that fits a failure.

    seq2seq check my_attention.py:MyAttention          # a subclass of seq2seq.attention.Attention
    seq2seq check my_attention.py:MyAttention --init num_hiddens=16
    seq2seq check my_normalizers.py:masked_softmax     # (logits, mask) -> weights
    seq2seq check mypkg.attention:D2LAttention --json  # a module: forward(q, k, v, valid_lens)

TARGET is FILE.py:NAME or package.module:NAME. Naming your own file here runs its code, as
training with it does. The exit status is 1 when a property fails, 0 when all hold, 2 when
the target cannot be checked (the message says why).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import json
import sys
import traceback
from functools import partial
from pathlib import Path
from typing import Any

from torch import nn

from seq2seq.analysis.checks import check
from seq2seq.attention import Attention
from seq2seq.cli import UsageError
from seq2seq.errors import Seq2SeqError
from seq2seq.inference.plugins import import_file


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]),
    )  # fmt: skip
    parser.add_argument("target", help="FILE.py:NAME or package.module:NAME")
    parser.add_argument(
        "--init", action="append", default=[], metavar="KEY=VALUE",
        help="another argument of the class's constructor (repeatable), e.g. num_hiddens=16",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = parser.parse_args()
    try:
        target = built(load_target(args.target), init_arguments(args.init), args.target)
        result = check(target, name=args.target)
    except Seq2SeqError as error:
        if args.json:  # a program reading the JSON gets JSON, and the person the paragraph
            print(json.dumps({"target": args.target, "error": str(error)}))
        raise
    print(result.to_json() if args.json else result.table())
    return 0 if result.passed else 1


def load_target(spec: str) -> Any:
    """The object ``FILE.py:NAME`` or ``package.module:NAME`` names."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise UsageError(
            f"{spec!r} names no object: write FILE.py:NAME (e.g. my_attention.py:MyAttention) or "
            "package.module:NAME."
        )
    if where.endswith(".py"):
        module = import_users_file(Path(where), spec)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as error:
            raise UsageError(
                f"{spec}: the module {where!r} cannot be imported ({error}); give the file "
                "instead (path/to/file.py:NAME) or put its directory on PYTHONPATH."
            ) from error
    if not hasattr(module, name):
        # What the file itself defines (its classes and functions), not what it imports.
        public = sorted(
            n for n, value in vars(module).items()
            if not n.startswith("_") and getattr(value, "__module__", None) == module.__name__
        )  # fmt: skip
        close = difflib.get_close_matches(name, public, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UsageError(
            f"{spec}: {where} defines no {name!r}; it defines {', '.join(public) or 'nothing'}."
            + hint
        )
    return getattr(module, name)


def import_users_file(path: Path, spec: str) -> Any:
    """The user's own file, named on the command line, imported as ``python FILE`` would run
    it (its directory first on the path, so that it imports the files beside it); what stops
    it (a syntax error, an exception at import) is one paragraph with the file and line."""
    if not path.is_file():
        siblings = [p.name for p in path.parent.glob("*.py")] if path.parent.is_dir() else []
        close = difflib.get_close_matches(path.name, siblings, n=1)
        hint = f" Did you mean {path.parent / close[0]}?" if close else ""
        raise UsageError(f"{spec}: there is no file {path}.{hint}")
    directory = str(path.resolve().parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        return importlib.import_module(import_file(path))
    except SyntaxError as error:
        raise UsageError(
            f"{spec}: {error.filename}, line {error.lineno}: {error.msg}: fix the file and run "
            "the check again."
        ) from None
    except Seq2SeqError:
        raise
    except Exception as error:
        frame = traceback.extract_tb(error.__traceback__)[-1]
        raise UsageError(
            f"{spec}: importing {path} raised {type(error).__name__}: {error} ({frame.filename}, "
            f"line {frame.lineno}); the file must import as `python {path}` runs it."
        ) from None


def init_arguments(pairs: list[str]) -> dict[str, Any]:
    """``--init KEY=VALUE`` pairs, each value read as a number or a word."""
    arguments: dict[str, Any] = {}
    for pair in pairs:
        key, equals, text = pair.partition("=")
        if not equals or not key.isidentifier():
            raise UsageError(f"--init {pair!r}: write KEY=VALUE, e.g. --init num_hiddens=16.")
        value: Any = text
        for kind in (int, float):
            try:
                value = kind(text)
                break
            except ValueError:
                continue
        arguments[key] = {"true": True, "false": False}.get(text, value)
    return arguments


def built(target: Any, init: dict[str, Any], spec: str) -> Any:
    """What ``check`` takes: an Attention subclass with its other arguments bound; another
    module class built with them; a function as it is."""
    if inspect.isclass(target) and issubclass(target, Attention):
        chosen = sorted({"query_size", "key_size"} & set(init))
        if chosen:
            raise UsageError(
                f"--init {', '.join(chosen)}: the check builds {spec} with query_size and "
                "key_size of its own (several sizes, to see how the scores grow with them); "
                "give only the other arguments of its constructor."
            )
        return partial(target, **init) if init else target
    if inspect.isclass(target) and issubclass(target, nn.Module):
        try:
            return target(**init)
        except TypeError as error:
            raise UsageError(
                f"{spec} could not be built with {init or 'no arguments'} ({error}): give its "
                "constructor's arguments with --init KEY=VALUE."
            ) from error
    if init:
        raise UsageError(f"--init is for a class; {spec} is a {type(target).__name__}.")
    return target
