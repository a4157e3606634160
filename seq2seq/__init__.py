"""seq2seq: attention encoder–decoders where the scoring function is a one-word switch."""

__version__ = "0.1.0"

# Imported after __version__, which the bundle export reads.
from seq2seq.translator import Translator

__all__ = ["Translator", "__version__"]
