"""seq2seq: attention encoder–decoders where the scoring function is a one-word switch."""

__version__ = "0.1.0"
