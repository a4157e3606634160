"""Errors the user can fix. Their messages are one paragraph that names the file, line or config
key and says what to do; entry points print them without a traceback (``seq2seq.cli``)."""


class Seq2SeqError(Exception):
    """Base of every error caused by the user's input rather than by a bug."""


class ConfigError(Seq2SeqError, ValueError):
    """A config value that cannot work (a size of zero, an impossible split...)."""


class ModelFileError(Seq2SeqError, ValueError):
    """A checkpoint or bundle that cannot be used; the message says which file and what to do."""
