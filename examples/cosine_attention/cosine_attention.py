"""Cosine attention with a learned temperature: a scoring function that lives outside seq2seq.

score(q, k) = cos(q, k) = q·k / (‖q‖ ‖k‖), content-based addressing as in the Neural Turing
Machine (Graves et al., 2014, eq. 6). Cosines lie in [-1, 1], so softmax(cos / T) at T = 1 is
close to uniform; the temperature is learned and starts low (initial_temperature in the YAML).

Shape legend: B batch, Tq queries, Tk keys, D size (queries and keys have the same size).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq.attention import Attention


class CosineAttention(Attention):
    """``score(q, k) = cos(q, k)``; the model projects keys to the query size when they differ."""

    needs_equal_sizes = True

    def __init__(
        self,
        dropout: float = 0.0,
        temperature: float | str = "learnable",
        initial_temperature: float = 0.1,
        *,
        query_size: int,
        key_size: int,
    ) -> None:
        super().__init__(dropout, temperature, initial_temperature)

    def project_keys(self, keys: Tensor) -> Tensor:
        return F.normalize(keys, dim=-1)  # (B, Tk, D) unit keys, once per source batch

    def score(self, queries: Tensor, projected_keys: Tensor) -> Tensor:
        unit_queries = F.normalize(queries, dim=-1)  # (B, Tq, D)
        return torch.bmm(unit_queries, projected_keys.transpose(1, 2))  # (B,Tq,D)@(B,D,Tk)
