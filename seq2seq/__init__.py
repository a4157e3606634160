"""seq2seq: attention encoder–decoders where the scoring function is a one-word switch."""

__version__ = "0.1.0"

# Before anything can run a oneDNN kernel: cap oneDNN where this CPU advertises instructions the
# process cannot execute (seq2seq/onednn_guard.py says why and how).
from seq2seq import onednn_guard

onednn_guard.apply()

# Imported after __version__, which the bundle export reads.
from seq2seq.translator import Translator  # noqa: E402 (after the guard, on purpose)

__all__ = ["Translator", "__version__"]
