"""seq2seq: attention encoder–decoders where the scoring function is a one-word switch.

``from seq2seq import Translator`` loads the inference stack on first use (PEP 562), so that
importing the reference model (``seq2seq.attention``, ``seq2seq.models``) loads nothing else;
``seq2seq.train``, ``compare`` and ``explore`` (``seq2seq.api``) load training the same way, and
``seq2seq.check`` the attention checker (``seq2seq.analysis.checks``).
"""

from typing import TYPE_CHECKING, Any

# Before anything can run a oneDNN kernel: cap oneDNN where this CPU advertises instructions the
# process cannot execute (seq2seq/onednn_guard.py says why and how).
from seq2seq import onednn_guard
from seq2seq.version import __version__

onednn_guard.apply()

if TYPE_CHECKING:
    from seq2seq.analysis.checks import check
    from seq2seq.api import Run, compare, explore, train
    from seq2seq.inference.translator import Translator

__all__ = ["Run", "Translator", "__version__", "check", "compare", "explore", "train"]


def __getattr__(name: str) -> Any:
    if name == "Translator":
        from seq2seq.inference.translator import Translator

        return Translator
    if name == "check":
        from seq2seq.analysis.checks import check

        return check
    if name in (
        "train",
        "compare",
        "explore",
        "Run",
    ):  # seq2seq.api: Hydra and Lightning, on first use
        from seq2seq import api

        return getattr(api, name)
    raise AttributeError(f"module 'seq2seq' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The loaded names and the lazy ones, so that tab completion offers ``seq2seq.train``."""
    return sorted({*globals(), *__all__})
