"""Attention heatmaps with the source and target words on the axes."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display needed, none is opened

import matplotlib.pyplot as plt
from torch import Tensor


def plot_attention(
    src_tokens: list[str], tgt_tokens: list[str], weights: Tensor, path: str | Path, title: str = ""
) -> Path:
    """Save a heatmap of ``weights`` (len(tgt_tokens), len(src_tokens)) to ``path``."""
    rows, columns = weights.shape
    if (rows, columns) != (len(tgt_tokens), len(src_tokens)):
        raise ValueError(
            f"weights of shape {tuple(weights.shape)} do not match {len(tgt_tokens)} target and "
            f"{len(src_tokens)} source tokens."
        )
    figure, axes = plt.subplots(figsize=(1.0 + 0.45 * columns, 1.0 + 0.4 * rows))
    image = axes.imshow(weights.float().numpy(), cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(range(columns), src_tokens, rotation=60, ha="right")
    axes.set_yticks(range(rows), tgt_tokens)
    axes.set_xlabel("source")
    axes.set_ylabel("output")
    if title:
        axes.set_title(title)
    figure.colorbar(image, ax=axes, fraction=0.04)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
