"""Errors the user can fix. Their messages are one paragraph that names the file, line or config
key and says what to do; entry points print them without a traceback (``seq2seq.cli``)."""

from __future__ import annotations

import json
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
ONNX = "ONNX (seq2seq export --onnx, --backend onnx)"
CTRANSLATE2 = "CTranslate2 (seq2seq export --format ctranslate2, --backend ctranslate2)"
ALIGN = "The eflomal word aligner (seq2seq align --eflomal)"


class MissingExtraError(Seq2SeqError, ImportError):
    """An optional feature whose pip extra (``serve``, ``onnx``, ...) is not installed."""


def missing_extra(
    extra: str, feature: str, missing: list[str], detail: str = ""
) -> MissingExtraError:
    """The one-paragraph error for ``feature`` when the ``missing`` requirements of ``extra``
    (as pyproject.toml writes them, e.g. ``orjson>=3.8``) are not installed, or, with
    ``detail`` (an import error's text), cannot be loaded: it names them, the extra, and a pip
    command that installs them here."""
    names = [requirement_name(requirement) for requirement in missing]
    listing = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    state = f"cannot be loaded ({detail})" if detail else "is not installed"
    if len(names) > 1:
        state = state.replace("is not", "are not").replace("cannot be", "cannot all be")
    return MissingExtraError(
        f"{feature} needs the packages of seq2seq's optional {extra!r} extra; {listing} {state}. "
        f"Install them into the environment that runs seq2seq: {install_command(extra, missing)}."
    )


def install_command(extra: str, missing: list[str]) -> str:
    """How to install ``extra`` where seq2seq came from (PEP 610's direct_url.json): from its
    checkout (``pip install -e 'DIR[extra]'``) or its wheel (``'seq2seq[extra] @ URL'``);
    otherwise the ``missing`` requirements by name. Never ``pip install 'seq2seq[extra]'``:
    seq2seq on PyPI is another project."""
    try:
        origin = json.loads(metadata.distribution("seq2seq").read_text("direct_url.json") or "")
    except (metadata.PackageNotFoundError, json.JSONDecodeError):
        origin = {}
    url = str(origin.get("url", ""))
    if url.startswith("file://") and "dir_info" in origin:
        editable = "-e " if origin["dir_info"].get("editable") else ""
        return f"pip install {editable}'{url.removeprefix('file://')}[{extra}]'"
    if url.startswith("file://") and url.endswith(".whl"):
        return f"pip install 'seq2seq[{extra}] @ {url}'"
    return "pip install " + " ".join(f"'{requirement}'" for requirement in missing)


def require_extra(extra: str, feature: str) -> None:
    """Raise :class:`MissingExtraError` unless every package of ``extra`` is installed.

    The packages are read from seq2seq's installed metadata (pyproject.toml's
    ``[project.optional-dependencies]``), so this check and ``pip install`` read one list. Run
    from a source tree that pip never installed, there is no metadata: the feature's own imports
    then say what is missing."""
    try:
        requirements = metadata.requires("seq2seq") or []
    except metadata.PackageNotFoundError:
        return
    in_extra = re.compile(rf"""extra\s*==\s*["']{re.escape(extra)}["']""")
    wanted = [r.split(";")[0].strip() for r in requirements if in_extra.search(r)]
    absent = [requirement for requirement in wanted if not installed(requirement_name(requirement))]
    if absent:
        raise missing_extra(extra, feature, absent)


def requirement_name(requirement: str) -> str:
    """The distribution a requirement names: ``orjson`` of ``orjson>=3.8; extra == "serve"``."""
    return re.split(r"[\s\[<>=!~;@]", requirement, maxsplit=1)[0]


def installed(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True
