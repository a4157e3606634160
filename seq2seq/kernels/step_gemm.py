"""A step loop's GEMMs: every step multiplies its few rows (a batch's, or beam search's B·K) by
the same weights.

A BLAS sgemm packs the weight again on every call and splits a small product over the threads
poorly. The C kernels' panel GEMM (``csrc/gru.c``: the weight packed once into column panels,
each step's rows streamed through them, the panels split over the threads) is what the GRU
layers' C loops run; ``StepWeight`` gives the same to the loops that step in Python (the
decoders' step loops and their attention's queries, one C call per step's product) and to the
decoding steps (``modules.DecodingSource.product``: packed once per batch). The Luong greedy
loop in C has its own twin of it, ``step_weight``.

Which of the two is faster depends on the build: with AVX-512 the panels keep a block's sums in
zmm registers, beat torch's GEMM at these shapes on the AMD CPUs measured and match it on the
Intel Xeon; the AVX2 build (half the lanes, as many registers for the sums) loses to it from a
few dozen rows on (docs/performance.md, "A step's GEMMs through the panels"). So
``step_panels`` chooses by the instruction set the library is built for, and torch's ``addmm``
runs otherwise: the same product either way, rounding aside.

Shape legend: R a step's rows, K the product's inner size, N its output columns.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from seq2seq.kernels.library import kernel_isa, library


@functools.cache
def step_panels() -> bool:
    """Whether a step's products go through the C kernels' panels (an AVX-512 build) rather than
    torch's GEMM. Decided once per process, as the library's build is."""
    return kernel_isa() == "AVX512" and library() is not None


class StepWeight:
    """A weight that a loop multiplies each step's rows by: ``into(out, rows)`` writes
    out (R, N) = rows (R, K) @ B, + bias (N,) or + out itself (``accumulate``), where B is
    ``weight.T`` for a layer's weight (N, K) (``transposed``, the default) or ``weight`` (K, N)
    itself (a backward pass's ``d_out @ W``). The weight may be a row-strided view (a column
    block of a wider weight), and so may out (the steps' rows of a padded batch), each with
    unit column stride; rows of another layout are copied first. Every tensor is float32 on
    the CPU.

    With ``panels`` (by default ``step_panels()``) the weight is packed once, here, into the C
    kernels' panels; the object then holds them (and the weight) until the loop drops it."""

    def __init__(self, weight: Tensor, transposed: bool = True, panels: bool | None = None) -> None:
        assert weight.dim() == 2 and weight.stride(1) == 1  # rows of a row-strided block
        self.weight, self.transposed = weight, transposed
        self.inner, self.columns = weight.shape[::-1] if transposed else weight.shape
        self.panels: Tensor | None = None
        if step_panels() if panels is None else panels:
            assert weight.dtype == torch.float32  # what the panels hold
            kernels = library()
            assert kernels is not None  # step_panels() checks it; a caller asking must too
            self.kernels = kernels
            self.panels = weight.new_empty(kernels.seq2seq_panel_floats(self.inner, self.columns))
            kernels.seq2seq_pack_panels(
                self.inner, self.columns, weight.data_ptr(), weight.stride(0), int(transposed),
                self.panels.data_ptr(),
            )  # fmt: skip

    def into(
        self, out: Tensor, rows: Tensor, bias: Tensor | None = None, accumulate: bool = False
    ) -> None:
        """out (R, N) = rows (R, K) @ B + bias, or += rows @ B with ``accumulate``."""
        assert bias is None or not accumulate  # one start: the bias, or what out holds
        assert rows.shape[1] == self.inner and out.shape == (rows.shape[0], self.columns)
        if self.panels is None:
            product = self.weight.t() if self.transposed else self.weight  # (K, N)
            if accumulate:
                out.addmm_(rows, product)
            elif bias is None:
                torch.mm(rows, product, out=out)
            else:
                torch.addmm(bias, rows, product, out=out)
            return
        if rows.stride(1) != 1:
            rows = rows.contiguous()
        assert out.stride(1) == 1  # rows the C side writes by address
        assert rows.dtype == out.dtype == torch.float32  # what the C side reads and writes
        assert bias is None or (bias.dtype == torch.float32 and bias.is_contiguous())
        self.kernels.seq2seq_panel_gemm(
            rows.shape[0], self.inner, self.columns, rows.data_ptr(), rows.stride(0),
            self.panels.data_ptr(), None if bias is None else bias.data_ptr(), int(accumulate),
            out.data_ptr(), out.stride(0),
        )  # fmt: skip
