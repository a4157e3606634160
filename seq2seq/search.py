"""Decoding as free functions over any model with ``encode`` and ``decode_step``.

Shape legend: B batch, S source length, L output length (at most the length limit), V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from seq2seq.model import Seq2Seq


@dataclass
class Hypotheses:
    """Decoded token ids and the attention weights that produced them."""

    tokens: Tensor  # (B, L) ids, EOS included, padding after EOS
    lengths: Tensor  # (B,) number of tokens up to and including EOS (or the length limit)
    attention: Tensor  # (B, L, S) weights of each output token over the source, 0 after the end


def max_output_lengths(src_lens: Tensor, a: float, b: int) -> Tensor:
    """The length limit ``a · source_length + b`` for each sentence (B,)."""
    return (src_lens.float() * a).floor().long() + b


@torch.no_grad()
def greedy_search(
    model: Seq2Seq,
    src: Tensor,
    src_lens: Tensor,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    max_len_a: float = 2.0,
    max_len_b: int = 10,
) -> Hypotheses:
    """Batched greedy decoding: the most probable token at each step, until EOS or the limit."""
    batch_size = src.shape[0]
    source, state = model.encode(src, src_lens)
    limits = max_output_lengths(src_lens, max_len_a, max_len_b).to(src.device)  # (B,)
    prev_tokens = torch.full((batch_size,), bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(batch_size, dtype=torch.bool, device=src.device)
    lengths = limits.clone()
    tokens, weights = [], []
    for t in range(max(1, int(limits.max()))):
        logits, state, step_weights = model.decode_step(prev_tokens, state, source)
        next_tokens = logits.argmax(dim=-1)  # (B,)
        next_tokens = next_tokens.masked_fill(finished, pad_id)
        tokens.append(next_tokens)
        weights.append(step_weights * ~finished[:, None])  # (B, S)
        just_finished = ~finished & ((next_tokens == eos_id) | (t + 1 >= limits))
        lengths = torch.where(just_finished, t + 1, lengths)
        finished |= just_finished
        prev_tokens = next_tokens
        if bool(finished.all()):
            break
    return Hypotheses(torch.stack(tokens, 1), lengths, torch.stack(weights, 1))
