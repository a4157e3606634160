"""Corpora, toy tasks, tokenizers and batching."""
