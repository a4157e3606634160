"""Greedy decoding with the Luong decoder on the CPU in one C call per batch, without autograd.

``greedy_search`` steps ``LuongDecoder.decode_step`` in Python: per step three GEMMs (the cell's
recurrent product, W_c2 h and the output layer) and, around them, a dozen small dispatched ops
(the token-gate rows, the C passes' wrappers, argmax, the writes into the outputs, the finished
rows' test and their removal from the batch). At the reverse task's batch of 64 those ops cost
about as much as the GEMMs. ``csrc/gru.c``'s ``seq2seq_luong_greedy`` runs the same GEMMs
(torch's own ``sgemm_``, or on an AVX-512 build the panels that ``step_gemm`` chooses, each
weight packed once per call) and the same C passes in the same order for every step of a batch,
and drops finished sentences as ``greedy_search`` does, so both give the same tokens.

Shape legend: B sentences, S source length, H state size, V vocabulary, L step limit.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
from torch import Tensor

from seq2seq.kernels import step_gemm
from seq2seq.kernels.attention_parts import StepAttention
from seq2seq.kernels.library import blas_sgemm, library, usable
from seq2seq.normalizers import BISECTION_ITERATIONS
from seq2seq.search import GreedyTask

NORMALIZERS = ("softmax", "sparsemax", "entmax15", "entmax_bisect")  # csrc/gru.c's numbering


class GreedyParts(ctypes.Structure):
    """``greedy_parts`` of ``csrc/gru.c``, field for field: which parts a greedy step's attention
    is composed of (``parts_row``)."""

    _fields_ = [
        ("additive", ctypes.c_int64),
        ("scale", ctypes.c_float),
        ("normalizer", ctypes.c_int64),
        ("alpha", ctypes.c_float),
        ("iterations", ctypes.c_int64),
        ("window_size", ctypes.c_int64),
        ("key_bias", ctypes.c_void_p),
        ("key_bias_len", ctypes.c_int64),
        ("W_q", ctypes.c_void_p),
        ("b_q", ctypes.c_void_p),
        ("w_v", ctypes.c_void_p),
        ("A", ctypes.c_int64),
        ("coverage", ctypes.c_int64),
        ("gamma", ctypes.c_float),
        ("w_c", ctypes.c_void_p),
        ("heads", ctypes.c_int64),
        ("head_size", ctypes.c_int64),
        ("W_c1", ctypes.c_void_p),
        ("b_c1", ctypes.c_void_p),
        ("layer_norm_eps", ctypes.c_float),
        ("W_p", ctypes.c_void_p),
        ("v_p", ctypes.c_void_p),
        ("gammas", ctypes.c_void_p),
        ("W_a", ctypes.c_void_p),
        ("b_a", ctypes.c_void_p),
    ]


@dataclass
class StepParts:
    """A Luong decoder's attention for ``luong_greedy``: its C twins (``StepAttention``) and
    the tensors they read (the queries' W_q (A or h·K, H) and b_q, with several heads and an
    additive score the block's W_q (h·d, H) and b_q in ``heads_weight`` and ``heads_bias``
    before each head's W_q (A, d) and b_q, additive scoring's w_v (A,)
    or [w_v; γ; β] (3, A) with its layer norm, the key bias (P,), the coverage weight: w_c (A,),
    γ (0-d) or each head's γ (h,); with several heads, W_c1 W_o (H, h·d) and W_c1 b_o (H,);
    local-p's W_p (H, H) and v_p (1, H)), kept alive while the loop reads them by address."""

    parts: StepAttention
    query_weight: Tensor | None = None
    query_bias: Tensor | None = None
    score_weight: Tensor | None = None
    key_bias: Tensor | None = None
    coverage_weight: Tensor | None = None
    context_weight: Tensor | None = None
    context_bias: Tensor | None = None
    centre_weight: Tensor | None = None
    centre_vector: Tensor | None = None
    heads_weight: Tensor | None = None
    heads_bias: Tensor | None = None

    @staticmethod
    def applies(parts: StepAttention) -> bool:
        """Whether the greedy loop composes ``parts``: every part, but several heads cover only
        on the logits (a head's γ), as the multi-head block does."""
        return parts.heads == 1 or parts.coverage in ("", "logits")

    def kept_tensors(self) -> tuple[Tensor | None, ...]:
        return (
            self.query_weight, self.query_bias, self.score_weight, self.key_bias,
            self.coverage_weight, self.context_weight, self.context_bias, self.centre_weight,
            self.centre_vector, self.heads_weight, self.heads_bias,
        )  # fmt: skip

    def structure(self) -> GreedyParts:
        parts = self.parts
        # Contiguous copies where needed, kept on self: the loop reads them by address.
        self.kept = tuple(
            None if t is None else t.detach().contiguous() for t in self.kept_tensors()
        )
        (
            query_weight, query_bias, score_weight, key_bias, coverage_weight, context_weight,
            context_bias, centre_weight, centre_vector, heads_weight, heads_bias,
        ) = self.kept  # fmt: skip
        # Additive heads: the block's W_q first (the C struct's W_q), then the score's (W_a).
        first_weight, first_bias, head_weight, head_bias = query_weight, query_bias, None, None
        if heads_weight is not None:
            first_weight, first_bias = heads_weight, heads_bias
            head_weight, head_bias = query_weight, query_bias
        coverage = ("", "logits", "additive").index(parts.coverage)
        several = parts.heads > 1
        gamma = 0.0
        if coverage == 1 and coverage_weight is not None and not several:
            gamma = float(coverage_weight)
        windowed = parts.window in ("local_m", "local_p")
        eps = -1.0 if parts.layer_norm_eps is None else parts.layer_norm_eps
        return GreedyParts(
            parts.score == "additive", parts.scale, NORMALIZERS.index(parts.normalizer),
            parts.alpha, BISECTION_ITERATIONS, parts.window_size if windowed else -1,
            address(key_bias), 0 if key_bias is None else key_bias.numel(), address(first_weight),
            address(first_bias), address(score_weight),
            0 if score_weight is None else score_weight.shape[-1], coverage, gamma,
            address(coverage_weight) if coverage == 2 else None, parts.heads,
            0 if context_weight is None else context_weight.shape[1] // parts.heads,
            address(context_weight), address(context_bias), eps, address(centre_weight),
            address(centre_vector),
            address(coverage_weight) if coverage == 1 and several else None,
            address(head_weight), address(head_bias),
        )  # fmt: skip


def address(tensor: Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


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
    parts: StepParts | None = None,
    coverage: Tensor | None = None,
    feed_weight: Tensor | None = None,
    feed: Tensor | None = None,
) -> tuple[Tensor, Tensor, int] | None:
    """Greedy decoding of a batch: token gates ``table`` (V, 3H), the cell's W_hh (3H, H) and
    b_hh, projected ``keys`` and ``values`` (W_c1 m) (B, S, H), ``scale`` of the product scores,
    ``context_weight`` W_c2 (H, H) (a column block of W_c: rows may be strided), the output
    layer's W_s (V, H) and b_s, the initial states (B, H) and the ``task`` (each sentence's
    token limit, the special ids) -> tokens (B, L) (PAD after each end), weights (B, L, S) (0
    after each end) and the steps run. None where torch's ``sgemm_`` is not at hand (the
    caller steps in Python). With ``parts`` the attention is composed of the C twins
    (``StepParts.applies``; ``scale`` is then theirs), keys (B, S, A) for an additive score;
    ``coverage`` (B, S) is what each sentence attended before (a decoder with coverage), and
    ``feed_weight`` W_if (3H, H) (a column block of W_ih) and ``feed`` (B, H) the input-fed
    decoder's weight of h~_{t-1} and h~_0."""
    sgemm = blas_sgemm()
    tensors = [table, cell_weight, cell_bias, keys, values, output_weight, output_bias, initial]
    if sgemm is None or not usable(context_weight, *tensors) or context_weight.stride(1) != 1:
        return None
    kernels = library()
    assert kernels is not None  # blas_sgemm() found it
    batch, length, key_size = keys.shape
    size, vocabulary = initial.shape[1], output_weight.shape[0]
    heads = 1 if parts is None else parts.parts.heads
    batch //= heads  # keys and values are split into heads: (B·h, S, ·)
    projected = parts is not None and parts.query_weight is not None
    if values.shape[:2] != keys.shape[:2] or (values.shape[2] != size and heads == 1):
        return None  # one head's values are W_c1 m, of the state's size
    if key_size != size and not projected:
        return None  # a product scores the state itself with the keys
    if parts is not None and not usable(*(t for t in parts.kept_tensors() if t is not None)):
        return None
    if feed_weight is not None and (feed is None or feed_weight.stride(1) != 1):
        return None
    table, cell_weight = table.contiguous(), cell_weight.contiguous()
    keys, values = keys.contiguous(), values.contiguous()
    output_weight = output_weight.contiguous()
    cell_bias = None if cell_bias is None else cell_bias.contiguous()
    output_bias = None if output_bias is None else output_bias.contiguous()
    lens = src_lens.to(torch.int64).contiguous()
    limits, max_steps = task.limits.to(torch.int64).contiguous(), task.max_steps
    state = initial.clone(memory_format=torch.contiguous_format)  # (B, H), updated in C
    # The C loop's scratch, per row: 8H + V floats, and the parts' (parts_step).
    scratch = 0
    if parts is not None:  # parts_step's: each head's query, scores, weights, context; local-p's
        covered = length * key_size if parts.parts.coverage else 0  # tanh(W_p h) and p_t
        scratch = heads * (key_size + 2 * length + values.shape[2]) + size + 1 + covered
        if parts.heads_weight is not None:  # additive heads' queries before their W_q
            scratch += parts.heads_weight.shape[0]
    work = initial.new_empty(batch * (8 * size + vocabulary + scratch))
    spans = torch.empty(batch * heads, 2, dtype=torch.int64)
    structure = None if parts is None else parts.structure()
    # Each sentence's coverage and fed vector, updated (and rows moved up) in C.
    coverage = None if coverage is None else coverage.clone(memory_format=torch.contiguous_format)
    feed = None if feed is None else feed.clone(memory_format=torch.contiguous_format)
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
        weights.data_ptr(), None if structure is None else ctypes.addressof(structure),
        spans.data_ptr(), address(coverage), address(feed_weight),
        0 if feed_weight is None else feed_weight.stride(0), address(feed),
        int(step_gemm.step_panels()),
    )  # fmt: skip
    return tokens, weights, int(steps)
