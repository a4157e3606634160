"""Where an attention may look: Luong's local windows, and a learned bias per source position.

Shape legend: B batch, Tq queries, Tk keys (source positions), Dq query size.

Global attention reads every source position. Local attention (Luong, Pham and Manning, 2015,
section 3.2) reads a window [p_t - D, p_t + D] around an aligned position p_t of target step t:

- ``local_m`` (monotonic): p_t = t; within the window the weights are global attention's (eq. 7);
- ``local_p`` (predictive): p_t = S · sigmoid(v_pᵀ tanh(W_p h_t)) (eq. 9), and the weights within
  the window are multiplied by a Gaussian centred there, exp(-(s - p_t)² / 2σ²), σ = D / 2
  (eq. 10).

Positions count from 0, and sentence b has S_b real source tokens, 0 .. S_b - 1 (padding is never
a position): local-m's p_t = min(t, S_b - 1), so a target longer than its source keeps reading
the source's end, and local-p's p_t = (S_b - 1) · sigmoid(...), the same range as the paper's
S · sigmoid(...) over positions 1 .. S. A key s is in the window when |s - round(p_t)| <= D: the
2D + 1 positions around the word nearest p_t (fewer at the sentence's ends), never none. As in
the paper the Gaussian (of the real p_t) is not renormalised: a local-p row sums to at most 1, and
p_t learns through the Gaussian (the window's edges are a step function, with no gradient).

The per-key bias of this project's design notes, e_ti = score(s_t, h_i) + b_i: one learned number
per source position, a static preference for positions (e.g. the first words), which a scalar bias
cannot express (it adds the same to every key, and the softmax ignores it).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seq2seq.errors import ConfigError

WINDOWS = ("global", "local_m", "local_p")


class LocalWindow(nn.Module):
    """Luong's local-m or local-p window of half-width ``size`` (D), for queries of
    ``query_size``; local-p learns W_p (query_size × query_size) and v_p, as in eq. 9."""

    def __init__(self, kind: str, size: int, query_size: int) -> None:
        super().__init__()
        if kind not in ("local_m", "local_p"):
            raise ConfigError(
                f"attention.window={kind!r} is not a window: use global (every source word, the "
                "default), local_m (Luong's monotonic window around p_t = t) or local_p (around a "
                "predicted p_t, with a Gaussian), e.g. seq2seq train attention.window=local_p "
                "attention.window_size=3."
            )
        smallest = 1 if kind == "local_p" else 0  # local-p's Gaussian needs σ = D / 2 > 0
        if type(size) is not int or size < smallest:
            raise ConfigError(
                f"attention.window_size={size!r} must be a whole number >= {smallest} for "
                f"attention.window={kind}: the window's half-width D, so that a query reads the "
                "source positions [p_t - D, p_t + D] (Luong et al. chose D = 10; local_p's "
                "Gaussian has σ = D / 2), e.g. attention.window_size=3."
            )
        self.kind = kind
        self.size = size
        self.W_p: nn.Linear | None = None
        self.v_p: nn.Linear | None = None
        if kind == "local_p":
            self.W_p = nn.Linear(query_size, query_size, bias=False)
            self.v_p = nn.Linear(query_size, 1, bias=False)

    @property
    def needs_positions(self) -> bool:
        """Whether each query's target step t must be given (local-m's p_t = t)."""
        return self.kind == "local_m"

    def extra_repr(self) -> str:
        return f"kind={self.kind}, size={self.size}"

    def centres(self, queries: Tensor, src_lens: Tensor, positions: Tensor | None) -> Tensor:
        """p_t of every query, (B, Tq) float, within [0, S_b - 1]. queries (B, Tq, Dq),
        src_lens (B,), positions (B, Tq): each query's target step t (local-m)."""
        last = (src_lens - 1).clamp(min=0).to(queries.dtype)[:, None]  # (B, 1): S_b - 1
        if self.W_p is not None and self.v_p is not None:
            # eq. 9: (B, Tq, Dq) -> (B, Tq, Dq) -> (B, Tq, 1) -> (B, Tq)
            predicted = self.v_p(torch.tanh(self.W_p(queries))).squeeze(-1)
            return last * torch.sigmoid(predicted)
        if positions is None:
            raise ValueError(
                "attention.window=local_m centres each query's window on its target step t; "
                "the decoder must pass positions (B, Tq)."
            )
        return torch.minimum(positions.to(queries.dtype), last)

    def forward(
        self, queries: Tensor, src_lens: Tensor, positions: Tensor | None, num_keys: int
    ) -> tuple[Tensor, Tensor | None]:
        """Which keys each query may read, ``in_window`` (B, Tq, Tk) bool, and local-p's Gaussian
        factor (B, Tq, Tk) (None for local-m). The caller also masks padding."""
        centres = self.centres(queries, src_lens, positions)  # (B, Tq)
        keys = torch.arange(num_keys, device=queries.device, dtype=centres.dtype)  # (Tk,)
        distance = keys[None, None, :] - centres[:, :, None]  # (B, Tq, Tk): s - p_t
        nearest = keys[None, None, :] - centres.detach().round()[:, :, None]  # s - round(p_t)
        in_window = nearest.abs() <= self.size
        if self.kind == "local_m":
            return in_window, None
        sigma = self.size / 2
        return in_window, torch.exp(-distance.square() / (2 * sigma**2))  # eq. 10


def window_module(kind: str, size: int | None, query_size: int) -> LocalWindow | None:
    """The window ``attention.window`` names (None for global) of ``attention.window_size``."""
    if kind == "global":
        if size is not None:
            raise ConfigError(
                f"attention.window_size={size} is the half-width of a local window, but "
                "attention.window=global reads every source word. Use attention.window=local_m "
                "or local_p with it, or leave attention.window_size=null."
            )
        return None
    return LocalWindow(kind, 10 if size is None else size, query_size)


class KeyBias(nn.Module):
    """e_ti = score(s_t, h_i) / T + b_i: one learned bias per source position, for positions
    0 .. ``max_positions`` - 1 (``data.max_src_len``); later positions (never seen in training)
    get 0. Starts at 0: the plain scores."""

    def __init__(self, max_positions: int) -> None:
        super().__init__()
        if type(max_positions) is not int or max_positions < 1:
            raise ConfigError(
                f"attention.key_bias_positions={max_positions!r} must be a positive whole number: "
                "how many source positions get a learned bias (null: data.max_src_len, or "
                "decoding.max_src_len for data without one)."
            )
        self.bias = nn.Parameter(torch.zeros(max_positions))

    def forward(self, logits: Tensor) -> Tensor:
        """logits (..., Tk) -> logits + b_{0..Tk-1}, (..., Tk)."""
        num_keys = logits.shape[-1]
        # Zeros past the table, without a branch on Tk, so that a traced graph (ONNX) takes any
        # source length: (P + Tk,) cut to (Tk,).
        bias = torch.cat([self.bias, self.bias.new_zeros(num_keys)])[:num_keys]
        return logits + bias.to(logits.dtype)
