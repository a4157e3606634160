"""Greedy decoding with the Luong decoder on the CPU in one C call per batch, without autograd.

``greedy_search`` steps ``LuongDecoder.decode_step`` in Python: per step three GEMMs (the cell's
recurrent product, W_c2 h and the output layer) and, around them, a dozen small dispatched ops
(the token-gate rows, the C passes' wrappers, argmax, the writes into the outputs, the finished
rows' test and their removal from the batch). At the reverse task's batch of 64 those ops cost
about as much as the GEMMs. ``csrc/gru.c``'s ``seq2seq_luong_greedy`` runs the same GEMMs
(torch's own ``sgemm_``) and the same C passes in the same order for every step of a batch, and
drops finished sentences as ``greedy_search`` does, so both give the same tokens.

Shape legend: B sentences, S source length, H state size, V vocabulary, L step limit.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seq2seq.kernels.library import blas_sgemm, library, usable
from seq2seq.search import GreedyTask


def luong_greedy(
    table: Tensor,
    cell_weight: Tensor,
    cell_bias: Tensor | None,
    keys: Tensor,
    values: Tensor,
    src_lens: Tensor,
    scale: float,
    context_weight: Tensor,
    output_weight: Tensor,
    output_bias: Tensor | None,
    initial: Tensor,
    task: GreedyTask,
) -> tuple[Tensor, Tensor, int] | None:
    """Greedy decoding of a batch: token gates ``table`` (V, 3H), the cell's W_hh (3H, H) and
    b_hh, projected ``keys`` and ``values`` (W_c1 m) (B, S, H), ``scale`` of the product scores,
    ``context_weight`` W_c2 (H, H) (a column block of W_c: rows may be strided), the output
    layer's W_s (V, H) and b_s, the initial states (B, H) and the ``task`` (each sentence's
    token limit, the special ids) -> tokens (B, L) (PAD after each end), weights (B, L, S) (0
    after each end) and the steps run. None where torch's ``sgemm_`` is not at hand (the
    caller steps in Python)."""
    sgemm = blas_sgemm()
    tensors = [table, cell_weight, cell_bias, keys, values, output_weight, output_bias, initial]
    if sgemm is None or not usable(context_weight, *tensors) or context_weight.stride(1) != 1:
        return None
    kernels = library()
    assert kernels is not None  # blas_sgemm() found it
    batch, length, size = keys.shape
    vocabulary = output_weight.shape[0]
    if values.shape != keys.shape or initial.shape != (batch, size):
        return None  # the loop scores and averages vectors of the state's size
    table, cell_weight = table.contiguous(), cell_weight.contiguous()
    keys, values = keys.contiguous(), values.contiguous()
    output_weight = output_weight.contiguous()
    cell_bias = None if cell_bias is None else cell_bias.contiguous()
    output_bias = None if output_bias is None else output_bias.contiguous()
    lens = src_lens.to(torch.int64).contiguous()
    limits, max_steps = task.limits.to(torch.int64).contiguous(), task.max_steps
    state = initial.clone(memory_format=torch.contiguous_format)  # (B, H), updated in C
    work = initial.new_empty(batch * (8 * size + vocabulary))  # the C loop's scratch
    rows = torch.empty(batch, dtype=torch.int64)
    prev = torch.empty(batch, dtype=torch.int64)
    tokens = torch.full((batch, max_steps), task.pad_id, dtype=torch.int64)
    weights = initial.new_zeros(batch, max_steps, length)
    steps = kernels.seq2seq_luong_greedy(
        sgemm, batch, length, size, vocabulary, max_steps, task.bos_id, task.eos_id,
        table.data_ptr(),
        cell_weight.data_ptr(), None if cell_bias is None else cell_bias.data_ptr(),
        keys.data_ptr(), values.data_ptr(), lens.data_ptr(), scale, context_weight.data_ptr(),
        context_weight.stride(0), output_weight.data_ptr(),
        None if output_bias is None else output_bias.data_ptr(), limits.data_ptr(),
        state.data_ptr(), work.data_ptr(), rows.data_ptr(), prev.data_ptr(), tokens.data_ptr(),
        weights.data_ptr(),
    )  # fmt: skip
    return tokens, weights, int(steps)
