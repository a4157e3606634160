"""Errors the user can fix. Their messages are one paragraph that names the file, line or config
key and says what to do; entry points print them without a traceback (``seq2seq.cli``)."""

from __future__ import annotations

import re
from importlib import metadata


class Seq2SeqError(Exception):
    """Base of every error caused by the user's input rather than by a bug."""


class ConfigError(Seq2SeqError, ValueError):
    """A config value that cannot work (a size of zero, an impossible split...)."""


class ModelFileError(Seq2SeqError, ValueError):
    """A checkpoint or bundle that cannot be used; the message says which file and what to do."""


# The features of the extras, as their errors name them.
SERVER = "The translation server (seq2seq serve)"
ONNX = "ONNX export and the onnx backend"
CTRANSLATE2 = "CTranslate2 export and the ctranslate2 backend"


class MissingExtraError(Seq2SeqError, ImportError):
    """An optional feature whose pip extra (``seq2seq[serve]``, ...) is not installed."""


def missing_extra(extra: str, feature: str, missing: str) -> MissingExtraError:
    """The one-paragraph error for ``feature`` when ``missing`` (a package or an import error's
    text) of the ``extra`` is not there: it names the extra and the command that installs it."""
    return MissingExtraError(
        f"{feature} needs seq2seq's optional {extra!r} packages, and {missing} is not installed. "
        f"Install them into the environment that runs seq2seq: pip install 'seq2seq[{extra}]' "
        f"(from a checkout: pip install -e '.[{extra}]')."
    )


def require_extra(extra: str, feature: str) -> None:
    """Raise :class:`MissingExtraError` unless every package of ``seq2seq[extra]`` is installed.

    The packages are read from seq2seq's installed metadata (pyproject.toml's
    ``[project.optional-dependencies]``), so this check and ``pip install`` read one list. Run
    from a source tree that pip never installed, there is no metadata: the feature's own imports
    then say what is missing."""
    try:
        requirements = metadata.requires("seq2seq") or []
    except metadata.PackageNotFoundError:
        return
    in_extra = re.compile(rf"""extra\s*==\s*["']{re.escape(extra)}["']""")
    # A requirement reads "name[extras]>=version; markers": its distribution name comes first.
    names = [
        re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]
        for requirement in requirements
        if in_extra.search(requirement)
    ]
    absent = [name for name in names if not installed(name)]
    if absent:
        raise missing_extra(extra, feature, " and ".join(absent))


def installed(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True
