"""The reference models, plain PyTorch as the papers write them: what the tests define as correct
and what runs on a GPU (``seq2seq.kernels`` accelerates them on the CPU)."""

from seq2seq.models.decoder import AttentionDecoder, BahdanauDecoder, EncodedSource, LuongDecoder
from seq2seq.models.encoder import RNNEncoder
from seq2seq.models.model import EncoderDecoder, Seq2Seq
from seq2seq.models.transformer import Transformer

__all__ = [
    "AttentionDecoder",
    "BahdanauDecoder",
    "EncodedSource",
    "EncoderDecoder",
    "LuongDecoder",
    "RNNEncoder",
    "Seq2Seq",
    "Transformer",
]
