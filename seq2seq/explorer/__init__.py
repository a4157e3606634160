"""The attention explorer: one self-contained HTML page (no network) where the attention of one
or more models can be explored sentence by sentence (``scripts/explore.py``)."""

from seq2seq.explorer.data import ExplorerModel, explorer_data
from seq2seq.explorer.page import MAX_MODELS, SIDE_BY_SIDE, inline, read_page, write_page

__all__ = [
    "MAX_MODELS", "SIDE_BY_SIDE", "ExplorerModel", "explorer_data", "inline", "read_page",
    "write_page",
]  # fmt: skip
