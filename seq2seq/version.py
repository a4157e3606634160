"""The package's version (what bundles record as ``seq2seq_version``)."""

__version__ = "0.1.0"
