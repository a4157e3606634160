"""A user's own scoring function, named by a model config: imported only from trusted modules.

A config's ``_target_`` is an import path. The built-in classes (``bundle.ALLOWED_TARGETS``) are
always built; any other class is imported only when its module is *trusted*: named by the user
on the command line (``--trust-module mypkg``), in code (``Translator.load(...,
trust_modules=["mypkg"])``) or, when training, by the user's own config (the module of
``attention._target_``, and ``trust_modules=[...]``). Trusting ``mypkg`` trusts ``mypkg`` and every
module under it. A trusted entry may also be a ``.py`` file: it is imported at once under its
file name (``path/to/cosine.py`` becomes the module ``cosine``), so a file outside ``PYTHONPATH``
can be trusted too.

Scoring functions and normalizers are pluggable: a scoring function must be a subclass of
``seq2seq.attention.Attention``, a normalizer (``attention.normalizer``) a function or an
``nn.Module`` subclass; anything else a file names is refused even from a trusted module.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from torch import nn

from seq2seq.attention import Attention
from seq2seq.errors import ModelFileError

# Where a user names the modules to trust, for the messages.
HOW_TO_TRUST = (
    "--trust-module MODULE on the command line (seq2seq translate, evaluate, serve ...), "
    "trust_modules=[...] in "
    "Translator.load or seq2seq.inference.bundle.load, trust_modules=[MODULE] when training"
)


# A class from a notebook's or script's own code: only that kind of process can build it again.
MAIN_ONLY = (
    "The class {target!r} was defined in the notebook or script that trained the model (its "
    "__main__), so only Python can load it, in a notebook or script that defines {name} too: "
    "Translator.load(path, trust_modules=['__main__']) (trusting other modules does not cover "
    "it). The command line cannot, its __main__ being the command itself; to use the model "
    "there, put the class in a .py file, train with it imported from that file "
    "(seq2seq.train(..., attention={name})) and pass --trust-module FILE.py. Trust only code "
    "you would run yourself."
)


class PluginError(ModelFileError):
    """A class a model config names that cannot or may not be built; the message says why."""


def trusted_modules(entries: Iterable[str]) -> frozenset[str]:
    """The module names of ``entries`` (module names, or paths to ``.py`` files, which are
    imported now under their file's stem, as the user asked by trusting them)."""
    names = set()
    for entry in entries:
        entry = str(entry).strip()
        if entry.endswith(".py"):
            names.add(import_file(Path(entry)))
        elif entry and all(part.isidentifier() for part in entry.split(".")):
            names.add(entry)
        else:
            raise PluginError(
                f"--trust-module {entry!r} is neither a module name (mypkg or mypkg.attention) "
                "nor a .py file; pass the module that defines the scoring function."
            )
    return frozenset(names)


def import_file(path: Path) -> str:
    """Import the trusted file ``path`` as the module named by its stem; returns that name."""
    name = path.stem
    if not path.is_file():
        raise PluginError(f"--trust-module {path}: there is no such file.")
    if not name.isidentifier():
        raise PluginError(
            f"--trust-module {path}: {name!r} is not a valid module name, so a config could not "
            "name a class in it; rename the file (letters, digits and _)."
        )
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path.resolve():
            return name
        raise PluginError(
            f"--trust-module {path}: a module named {name!r} is already imported from "
            f"{getattr(loaded, '__file__', 'elsewhere')}; rename the file."
        )
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .py file that exists
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        del sys.modules[name]
        raise  # the user's own code failed: its traceback is what they need
    return name


def is_trusted(module: str, trusted: Iterable[str]) -> bool:
    """Whether ``module`` is one of ``trusted`` or inside one of them."""
    return any(module == name or module.startswith(f"{name}.") for name in trusted)


def resolve(target: str, trusted: frozenset[str], origin: str, normalizer: bool = False) -> Any:
    """The scoring-function class ``target`` (``module.Class``) names (with ``normalizer``: a
    normalizer function or module class), imported only if its module is trusted; a
    one-paragraph refusal otherwise."""
    module_name, _, class_name = target.rpartition(".")
    if module_name == "__main__" and not is_trusted(module_name, trusted):
        raise PluginError(f"{origin}: {MAIN_ONLY.format(target=target, name=class_name)}")
    if not module_name or not is_trusted(module_name, trusted):
        raise PluginError(
            f"{origin}: the class {target!r} is not built into seq2seq. Building it "
            f"would import and run the code of the module {module_name or target!r}, so it is "
            f"refused unless you trust that module: pass --trust-module {module_name or target} "
            f"({HOW_TO_TRUST}). Trust only code you "
            "would run yourself."
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise PluginError(
            f"{origin}: {target!r} is in the trusted module {module_name!r}, which cannot be "
            f"imported ({error}). Put the directory that holds it on PYTHONPATH (e.g. "
            "PYTHONPATH=. python ...), or trust the file itself (--trust-module path/to/file.py, "
            "or trust_modules=[path/to/file.py] when training)."
        ) from None
    found = getattr(module, class_name, None)
    if found is None and module_name == "__main__":
        raise PluginError(
            f"{origin}: this process defines no {class_name} in its __main__. "
            + MAIN_ONLY.format(target=target, name=class_name)
        )
    if normalizer:
        is_module = isinstance(found, type) and issubclass(found, nn.Module)
        if not (is_module or (callable(found) and not isinstance(found, type))):
            raise PluginError(
                f"{origin}: {target!r} is not a normalizer (a function of logits and a mask, or "
                "an nn.Module subclass): check attention.normalizer._target_."
            )
        return found
    if not (isinstance(found, type) and issubclass(found, Attention)):
        raise PluginError(
            f"{origin}: {target!r} is not a scoring function (a subclass of "
            "seq2seq.attention.Attention): only scoring functions can be plugged in. Check the "
            "_target_ of the attention config."
        )
    return found
