"""Inference: the Translator, the pickle-free bundle and checkpoint loading, ONNX export."""
