"""A padded batch's real tokens in a ``PackedSequence``'s row order, for computing on them alone.

In a batch of sentences of mixed lengths, much of a (B, T) grid is padding (the reverse task's
5-25 tokens, drawn at random). Packing the token ids (integers, before the embedding) lets
the embedding, the input projections, the recurrences and the output layer run on the N real
tokens only; what needs the padded grid (attention over a sentence's memory) gets it back with one
``pad``, and leaves it with one ``select``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class PackedTokens:
    """Rows step after step; within step t, the ``batch_sizes[t]`` sentences still running,
    longest first (a ``PackedSequence``'s order, what ``gru.Steps.packed`` steps)."""

    tokens: Tensor  # (N,) token ids, on the batch's device
    positions: Tensor  # (N,) each row's place b * T + t in the flattened (B, T) grid
    batch_sizes: list[int]  # (T',) sentences running at each step, non-increasing
    sorted_indices: Tensor  # (B,) sentences longest first (stable): step t's i-th row's sentence
    batch: int  # B
    steps: int  # T, the padded grid's length (T' <= T)

    def pad(self, rows: Tensor) -> Tensor:
        """rows (N, D) -> (B, T, D), zeros at the padding (differentiable)."""
        grid = rows.new_zeros(self.batch * self.steps, rows.shape[1])  # (B·T, D)
        return grid.index_copy(0, self.positions, rows).view(self.batch, self.steps, -1)

    def select(self, padded: Tensor) -> Tensor:
        """padded (B, T, D) -> rows (N, D) (differentiable)."""
        return padded.reshape(self.batch * self.steps, -1).index_select(0, self.positions)

    def row_sentences(self) -> Tensor:
        """(N,) the sentence (its index in the batch) of each row."""
        return self.positions.div(self.steps, rounding_mode="floor")

    def unsorted_indices(self) -> Tensor:
        """(B,) the inverse of ``sorted_indices``: where each sentence is among the sorted."""
        return torch.argsort(self.sorted_indices)


def pack_tokens(tokens: Tensor, lengths: Tensor) -> PackedTokens:
    """tokens (B, T) of sentences with ``lengths`` (B,) real tokens each, in [1, T], at the
    start of their rows. The lengths are read on the host (one sync on a GPU)."""
    batch, steps = tokens.shape
    lengths = lengths.cpu()
    if batch and not (int(lengths.min()) >= 1 and int(lengths.max()) <= steps):
        raise ValueError(
            f"pack_tokens: every length must lie in [1, {steps}], got {lengths.tolist()}"
        )
    sorted_lengths, sorted_indices = torch.sort(lengths, descending=True, stable=True)
    longest = int(sorted_lengths[0]) if batch else 0
    step_range = torch.arange(longest)  # (T',)
    running = sorted_lengths[None, :] > step_range[:, None]  # (T', B): row i runs at step t
    # (T', B): b * T + t of the i-th sorted sentence at step t, kept where it runs, step by step.
    grid = sorted_indices[None, :] * steps + step_range[:, None]
    positions = grid[running].to(tokens.device)  # (N,)
    return PackedTokens(
        tokens=tokens.reshape(-1).index_select(0, positions),
        positions=positions,
        batch_sizes=running.sum(1).tolist(),
        sorted_indices=sorted_indices.to(tokens.device),
        batch=batch,
        steps=steps,
    )
