"""Attention heatmaps with the source and target words on the axes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display needed, none is opened

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.image import AxesImage
from matplotlib.patches import Rectangle
from torch import Tensor

from seq2seq.analysis.alignment import exact_zeros


def draw_attention(
    axes: Axes,
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    weights: Tensor | Sequence[Sequence[float]],
    title: str = "",
    zeros: Sequence[Sequence[int]] | None = None,
) -> AxesImage:
    """Draw ``weights`` (len(tgt_tokens), len(src_tokens)) on ``axes``, tokens as tick labels,
    hatching the exact zeros: ``zeros`` (per row, the columns exactly 0) where the weights were
    rounded, else those of a tensor; rounded weights without ``zeros`` get none (a weight that
    rounds to 0 is not one)."""
    matrix = weights.float().numpy() if isinstance(weights, Tensor) else weights
    rows, columns = len(matrix), len(matrix[0]) if len(matrix) else 0
    if (rows, columns) != (len(tgt_tokens), len(src_tokens)):
        raise ValueError(
            f"weights of shape {(rows, columns)} do not match {len(tgt_tokens)} target and "
            f"{len(src_tokens)} source tokens."
        )
    # The explorer's scale (reversed viridis: light yellow 0, dark violet 1), so that a map reads
    # the same in a PNG and on the page.
    image = axes.imshow(matrix, cmap="viridis_r", vmin=0.0, vmax=1.0, aspect="auto")
    # Exact zeros (a sparse normalizer's, a window's) hatched, so that no small weight looks like
    # one: imshow draws both the same colour.
    if zeros is None and isinstance(weights, Tensor):
        zeros = exact_zeros(weights)
    exact = [(row, column) for row, columns in enumerate(zeros or []) for column in columns]
    for row, column in exact:
        corner = (float(column) - 0.5, float(row) - 0.5)
        axes.add_patch(
            Rectangle(corner, 1, 1, fill=False, hatch="////", edgecolor="#c8c8c8", linewidth=0)
        )
    axes.set_xticks(range(columns), list(src_tokens), rotation=60, ha="right")
    axes.set_yticks(range(rows), list(tgt_tokens))
    axes.set_xlabel("source")
    axes.set_ylabel("output")
    if title:
        axes.set_title(title)
    return image


def plot_attention(
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    weights: Tensor | Sequence[Sequence[float]],
    path: str | Path,
    title: str = "",
) -> Path:
    """Save a heatmap of ``weights`` (len(tgt_tokens), len(src_tokens)) to ``path``."""
    figure, axes = plt.subplots(figsize=(1.0 + 0.45 * len(src_tokens), 1.0 + 0.4 * len(tgt_tokens)))
    try:
        image = draw_attention(axes, src_tokens, tgt_tokens, weights, title)
        figure.colorbar(image, ax=axes, fraction=0.04)
        path = Path(path)
        # The saved image's bounds grow to the tick labels, however long the tokens: a fixed
        # figure with tight_layout cannot fit long words around a one-token axis, and warns.
        figure.savefig(path, dpi=120, bbox_inches="tight")
    finally:
        plt.close(figure)
    return path


def plot_attention_grid(
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    weights: Tensor,
    path: str | Path,
    title: str = "",
) -> Path:
    """Save every layer's and head's map, weights (L, h, len(tgt_tokens), len(src_tokens)), as a
    grid: one row per layer, one column per head."""
    layers, heads = weights.shape[:2]
    cell = (0.6 + 0.3 * len(src_tokens), 0.6 + 0.27 * len(tgt_tokens))
    figure, grid = plt.subplots(
        layers, heads, figsize=(cell[0] * heads, cell[1] * layers), squeeze=False
    )
    try:
        for layer in range(layers):
            for head in range(heads):
                axes = grid[layer][head]
                draw_attention(
                    axes, src_tokens, tgt_tokens, weights[layer, head],
                    f"layer {layer + 1}, head {head + 1}",
                )  # fmt: skip
                if head:
                    axes.set_ylabel("")
                if layer < layers - 1:
                    axes.set_xlabel("")
        if title:
            figure.suptitle(title)
        path = Path(path)
        figure.savefig(path, dpi=100, bbox_inches="tight")
    finally:
        plt.close(figure)
    return path
