"""The GRU recurrence on the CPU as one autograd node, with the cell's elementwise math in C.

ATen's CPU GRU runs each time step as a dozen small kernels (the recurrent GEMM, then adds,
sigmoids, a tanh, a lerp), each an autograd node with its own backward. On the benchmark's
shapes (B=64, H=128-256) those per-step kernels and their bookkeeping cost as much as the GEMMs.
Here a step is one GEMM and one pass of ``csrc/gru.c`` over the step's rows, and the backward
pass is the same by hand, with the recurrent weight's gradient as one GEMM over all steps after
the loop (torch's). The loop over a layer's steps runs in C, with the library's own kernel for
the steps' small GEMMs (a step's 1-64 rows by W_hh, packed once per call into cache-resident
panels: 1.5x torch's mm at 64 rows, 2.7x at 8, see csrc/gru.c), without ~9 us of Python,
ctypes and dispatch per step; ``c_loops`` checks it once against the Python loop over torch's
GEMMs, which runs where it disagrees. Where torch has one thread per direction, a bidirectional
layer's two directions run at once, each on its own thread (``_concurrent``). The parameters are
``nn.GRU``'s own, so checkpoints do not change.

``gru(module, inputs, hx)`` computes what ``module(inputs, hx)`` does for an ``nn.GRU`` (packed
or padded input, any layers, bidirectional, dropout between layers); ``gru_steps`` is one
unidirectional layer over a padded batch (the Luong decoder's cell), ``gru_cell`` one step
without autograd (either decoder's decoding step), and ``tanh_`` the C pass's tanh in place (the
Luong decoding step's attentional layer). The same library holds the attention steps of
``seq2seq.fused_bahdanau`` (additive, the Bahdanau decoder's teacher forcing and decoding) and
``seq2seq.fused_attention`` (dot and bilinear, decoding), and ``seq2seq.dropout``'s keep mask.
``usable`` says when the paths apply: float32 tensors on the CPU, no CPU autocast (mixed
precision), the C library built, and not inside an ONNX export, a trace or ``torch.compile``
(they cannot see into a ctypes call).

The library is compiled on first use with the system's C compiler (``$CC``, default ``cc``; a
fraction of a second) into ``$XDG_CACHE_HOME/seq2seq`` (default ``~/.cache/seq2seq``), keyed by
a hash of the source and flags, and checked against torch's GRU cell when it loads. The C is
plain C99 with no library calls (its exp is a polynomial the compiler vectorises: AVX-512 where
torch's own kernels use it, else AVX2), so any C compiler builds it; where none is found or the
build fails, ``usable`` is false, ATen's GRU runs instead, one warning says so, and
``unavailable_reason()`` says why. Where torch's threads are GNU OpenMP's, it is built with
``-fopenmp`` and splits a step's rows over those same threads. (A 64 x 256 forward step on the
project's 2-core AMD EPYC: 14 us with AVX-512 on two threads, 39 us with AVX2 on one.)

Shape legend: N rows of a packed (or flattened padded) sequence, B batch, T steps, E input
size, H hidden size, D directions (1 or 2), L layers.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import FunctionCtx, once_differentiable
from torch.nn.utils.rnn import PackedSequence

from seq2seq.atomic import write_atomic
from seq2seq.splitmix import shift_right, splitmix64

SOURCE = Path(__file__).with_name("csrc") / "gru.c"
FLOAT_BYTES = 4
COMPILE_TIMEOUT_S = 120  # it takes well under a second; a hung compiler must not hang training
ISA_VARIABLE = "SEQ2SEQ_KERNELS_ISA"  # lowers the instruction set the library is built for

_lock = threading.Lock()
_state: dict[str, Any] = {}  # "library": ctypes.CDLL | None, "reason": str (once loaded or failed)


def cache_dir() -> Path:
    """Where the compiled library is kept: ``$XDG_CACHE_HOME/seq2seq`` or ``~/.cache/seq2seq``."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "seq2seq"


def kernel_isa() -> str:
    """The instruction set the library is built for: ``AVX512``, ``AVX2`` or ``DEFAULT`` (the
    compiler's baseline, SSE2 on x86-64). Torch's own choice for its kernels
    (``get_cpu_capability``: it checks the CPU and the OS state, and ``ATEN_CPU_CAPABILITY``
    lowers it), lowered further by ``SEQ2SEQ_KERNELS_ISA`` (``avx2`` or ``default``; ``auto``,
    the default, keeps torch's). It never goes above torch's: a CPU without AVX-512 gets the
    AVX2 build, one without AVX2 the baseline."""
    levels = ("DEFAULT", "AVX2", "AVX512")
    capability = torch.backends.cpu.get_cpu_capability()
    supported = capability if capability in levels else "DEFAULT"  # e.g. ARM's: no -m flags
    requested = os.environ.get(ISA_VARIABLE, "auto").strip().upper()
    if requested == "AUTO":
        return supported
    if requested not in levels:
        raise RuntimeError(
            f"{ISA_VARIABLE}={os.environ[ISA_VARIABLE]!r} is not an instruction set the kernels "
            "are built for: use auto (what torch uses here), avx2, avx512 or default"
        )
    return min(requested, supported, key=levels.index)


def compile_flags(openmp: bool = True) -> list[str]:
    """The compiler's flags: optimised, position-independent, vectorised (``-fno-trapping-math``
    so that the clamps and selects vectorise), for ``kernel_isa()``: AVX2 and FMA, and AVX-512
    where torch runs its own kernels with it. With ``openmp`` and where torch's threads
    are libgomp's, ``-fopenmp``: the library then shares torch's thread pool (the same
    ``libgomp.so.1``, already loaded) to split a step's rows; otherwise ``-fopenmp-simd``, the
    ``omp simd`` loops without an OpenMP runtime."""
    flags = ["-O3", "-fPIC", "-shared", "-fno-trapping-math"]
    flags.append("-fopenmp" if openmp and torch_uses_libgomp() else "-fopenmp-simd")
    capability = kernel_isa()
    if capability in ("AVX2", "AVX512"):
        flags += ["-mavx2", "-mfma"]
    if capability == "AVX512":
        # zmm loops: the GRU's forward pass is about 2x faster than on ymm. Torch reports AVX512
        # only where the CPU also has AVX-512 DQ (and BW, VL), whose 64-bit multiply the dropout
        # mask's hash needs: about 2x faster than the multiply emulated on 32-bit lanes.
        flags += ["-mavx512f", "-mavx512dq"]
    return flags


def torch_uses_libgomp() -> bool:
    """Whether torch's CPU threads are GNU OpenMP's, loaded in this process (Linux, PyPI's torch).
    A second OpenMP runtime beside torch's (Intel's or LLVM's) would keep its own threads, which
    would compete with torch's for the same cores, so the library uses threads only here."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return False
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return any("/libgomp" in line for line in maps)
    except OSError:  # not Linux
        return False


def build(directory: Path | None = None) -> Path:
    """Compile ``csrc/gru.c`` into ``directory`` (default ``cache_dir()``) unless a build of the
    same source and flags is there; return the library's path. Raises ``RuntimeError`` with the
    compiler's message when it fails. Where the build with OpenMP fails (a compiler without its
    runtime's files), it is built without, single-threaded."""
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C compiler: {compiler!r} is not on PATH (set CC to one)")
    directory = cache_dir() if directory is None else directory
    flags = compile_flags()
    if "-fopenmp" not in flags:
        return _build(compiler, flags, directory)
    try:
        return _build(compiler, flags, directory)
    except RuntimeError:
        return _build(compiler, compile_flags(openmp=False), directory)


def _build(compiler: str, flags: list[str], directory: Path) -> Path:
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join([compiler, *flags]).encode()).hexdigest()
    target = directory / f"gru-{key[:16]}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)

    def compile_into(temporary: Path) -> None:
        command = [compiler, *flags, str(SOURCE), "-o", str(temporary)]
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, check=False, timeout=COMPILE_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as error:
            raise RuntimeError(f"`{' '.join(command)}` took over {COMPILE_TIMEOUT_S} s") from error
        if result.returncode != 0:
            raise RuntimeError(f"`{' '.join(command)}` failed: {result.stderr.strip()[-600:]}")

    # Built beside the target and renamed over it: processes building at once (DDP ranks) each
    # rename a complete library, never load a half-written one.
    write_atomic(target, compile_into)
    return target


def _load() -> ctypes.CDLL:
    library = open_library(build())
    with _float32_references():
        _check(library)
    return library


def _float32_references() -> torch.autocast:
    """The load-time checks compare the kernels with torch's float32 results. They run where the
    kernels are first asked for, which may be inside a bf16-mixed step's autocast (the dropout
    mask asks for them there): without this, their references would be bf16 and a correct
    library would be refused for the rest of the process."""
    return torch.autocast("cpu", enabled=False)


def open_library(path: Path) -> ctypes.CDLL:
    """The compiled library at ``path``, its functions' signatures declared."""
    library = ctypes.CDLL(str(path))
    i64, pointer = ctypes.c_int64, ctypes.c_void_p
    library.seq2seq_gru_forward.argtypes = [i64, i64, pointer, i64, pointer, pointer, pointer]
    library.seq2seq_gru_forward.argtypes += [i64, pointer]
    library.seq2seq_gru_forward.restype = None
    library.seq2seq_gru_backward.argtypes = [i64, i64, pointer, pointer, i64, pointer, pointer]
    library.seq2seq_gru_backward.argtypes += [i64, pointer]
    library.seq2seq_gru_backward.restype = None
    library.seq2seq_tanh.argtypes = [i64, pointer]
    library.seq2seq_tanh.restype = None
    # seq2seq.fused_bahdanau's attention step: rows, (group,) S, A, M, then the arrays and row
    # strides.
    library.seq2seq_additive_forward.argtypes = [i64] * 5 + [pointer] * 6
    library.seq2seq_additive_forward.argtypes += [pointer, i64, pointer, i64]
    library.seq2seq_additive_forward.restype = None
    library.seq2seq_additive_backward.argtypes = [i64] * 4 + [pointer] * 5 + [i64, pointer, i64]
    library.seq2seq_additive_backward.argtypes += [pointer] * 4
    library.seq2seq_additive_backward.restype = None
    # seq2seq.fused_attention's product attention: rows, group, the rows' sentences (or NULL),
    # S, D, V, scale, then the arrays; and its backward pass over packed rows: rows, B, S, D, V,
    # scale, then the arrays.
    library.seq2seq_product_forward.argtypes = [i64, i64, pointer, i64, i64, i64, ctypes.c_float]
    library.seq2seq_product_forward.argtypes += [pointer] * 5 + [i64, pointer, i64]
    library.seq2seq_product_forward.restype = None
    library.seq2seq_product_rows_backward.argtypes = [i64] * 5 + [ctypes.c_float]
    library.seq2seq_product_rows_backward.argtypes += [pointer] * 13
    library.seq2seq_product_rows_backward.restype = None
    # The C loops over a GRU layer's steps: directions, steps, the schedules, B, H, N, then the
    # arrays (W_hh and b_hh as arrays of one pointer per direction), the weight panels' scratch
    # and `concurrent`; the panels' size in floats of a (K, N) weight.
    addresses = ctypes.POINTER(ctypes.c_void_p)
    library.seq2seq_gru_layer_forward.argtypes = [i64, i64, pointer, i64, i64, i64]
    library.seq2seq_gru_layer_forward.argtypes += [pointer, i64, addresses, addresses, pointer]
    library.seq2seq_gru_layer_forward.argtypes += [pointer, i64, pointer, pointer, pointer]
    library.seq2seq_gru_layer_forward.argtypes += [ctypes.c_int]
    library.seq2seq_gru_layer_forward.restype = None
    library.seq2seq_gru_layer_backward.argtypes = [i64, i64, pointer, i64, i64, i64]
    library.seq2seq_gru_layer_backward.argtypes += [pointer, pointer, i64, pointer, pointer, i64]
    library.seq2seq_gru_layer_backward.argtypes += [pointer, addresses, pointer, ctypes.c_int]
    library.seq2seq_gru_layer_backward.restype = None
    library.seq2seq_panel_floats.argtypes = [i64, i64]
    library.seq2seq_panel_floats.restype = i64
    # y = x W^T + bias through a given sgemm: sgemm, rows, out, in, W, ldw, bias, x, y.
    library.seq2seq_affine_rows.argtypes = [pointer, i64, i64, i64, pointer, i64, pointer]
    library.seq2seq_affine_rows.argtypes += [pointer, pointer]
    library.seq2seq_affine_rows.restype = None
    # seq2seq.fused_greedy's loop: sgemm, B, S, H, V, max_steps, bos, eos, the cell's table and
    # weights, keys, values, lens, scale, W_c2 and its row stride, the output layer, limits,
    # the state and scratch, and the outputs; it returns the steps it ran.
    greedy: list[type[ctypes._SimpleCData[Any]]] = [pointer, *[i64] * 7, *[pointer] * 6]
    greedy += [ctypes.c_float, pointer, i64, *[pointer] * 9]
    library.seq2seq_luong_greedy.argtypes = greedy
    library.seq2seq_luong_greedy.restype = i64
    # seq2seq.dropout's keep mask: n, seed, dropped, scale, mask.
    library.seq2seq_dropout_mask.argtypes = [i64, ctypes.c_uint64, i64, ctypes.c_float, pointer]
    library.seq2seq_dropout_mask.restype = None
    return library


def _check(library: ctypes.CDLL) -> None:
    """One step on random rows against torch's own GRU cell: a library that computes something
    else (a miscompile, a compiler that treats the flags differently) must not train a model."""
    generator = torch.Generator().manual_seed(0)
    rows, size = 3, 19  # an odd size exercises the vector loops' remainders
    gi, gh = (torch.randn(rows, 3 * size, generator=generator) * 3 for _ in range(2))
    hidden = torch.randn(rows, size, generator=generator)
    expected = _torch_cell(gi, gh, hidden)
    out = torch.empty(rows, size)
    state = hidden.clone()
    library.seq2seq_gru_forward(
        rows, size, gi.data_ptr(), 3 * size, gh.data_ptr(), state.data_ptr(), out.data_ptr(),
        size, None,
    )  # fmt: skip
    if not torch.allclose(out, expected, atol=1e-5) or not torch.equal(out, state):
        error = (out - expected).abs().max().item()
        raise RuntimeError(f"the compiled GRU step differs from torch's by {error:.3g}")
    values = gi.clone()
    library.seq2seq_tanh(values.numel(), values.data_ptr())
    if not torch.allclose(values, gi.tanh(), atol=1e-6):
        error = (values - gi.tanh()).abs().max().item()
        raise RuntimeError(f"the compiled tanh differs from torch's by {error:.3g}")
    _check_additive(library, generator)
    _check_dropout_mask(library)


def _check_additive(library: ctypes.CDLL, generator: torch.Generator) -> None:
    """The attention kernels against their formulas on random rows: weights = softmax over the
    valid keys of w_v . tanh(q + k) (seq2seq.fused_bahdanau) or of 0.5 q . k
    (seq2seq.fused_attention), context = weights @ memory."""
    rows, keys, size = 2, 3, 19
    # Every draw from the check's own generator: the global one drives training's dropout, and
    # the library loads at the first forward pass, after the run has seeded it.
    query = torch.randn(rows, size, generator=generator)
    score_weight = torch.randn(size, generator=generator)
    projected_keys, memory = torch.randn(2, rows, keys, size, generator=generator)
    lens = torch.tensor([keys, 2])
    scores = torch.tanh(query[:, None] + projected_keys) @ score_weight  # (rows, keys)
    scores[1, 2:] = -torch.inf  # row 1's last key is padding
    expected = torch.softmax(scores, dim=-1)
    weights, context = torch.empty(rows, keys), torch.empty(rows, size)
    library.seq2seq_additive_forward(
        rows, 1, keys, size, size, query.data_ptr(), projected_keys.data_ptr(),
        score_weight.data_ptr(), lens.data_ptr(), memory.data_ptr(), None, weights.data_ptr(),
        keys, context.data_ptr(), size,
    )  # fmt: skip
    # (rows, 1, keys) @ (rows, keys, size) -> (rows, size)
    expected_context = torch.bmm(expected[:, None], memory)[:, 0]
    errors = [(weights - expected).abs().max(), (context - expected_context).abs().max()]
    error = max(value.item() for value in errors)
    if not error <= 1e-5:  # also false for NaN
        raise RuntimeError(f"the compiled attention step differs from torch's by {error:.3g}")
    # seq2seq.fused_attention's product scoring on the same rows: weights = softmax of 0.5 q·k.
    scores = 0.5 * torch.bmm(projected_keys, query[:, :, None])[:, :, 0]  # (rows, keys)
    scores[1, 2:] = -torch.inf
    expected = torch.softmax(scores, dim=-1)
    library.seq2seq_product_forward(
        rows, 1, None, keys, size, size, 0.5, query.data_ptr(), projected_keys.data_ptr(),
        lens.data_ptr(), memory.data_ptr(), weights.data_ptr(), keys, context.data_ptr(), size,
    )  # fmt: skip
    expected_context = torch.bmm(expected[:, None], memory)[:, 0]
    errors = [(weights - expected).abs().max(), (context - expected_context).abs().max()]
    error = max(value.item() for value in errors)
    if not error <= 1e-5:
        raise RuntimeError(f"the compiled product attention differs from torch's by {error:.3g}")


def _check_dropout_mask(library: ctypes.CDLL) -> None:
    """The dropout mask against ``splitmix64``'s bits, at a seed whose top bit is set (the C
    side's arithmetic is unsigned) and a length that ends inside a vector."""
    count, seed, dropped, scale = 37, 0xD1B54A32D192ED03, 1 << 15, 2.0
    mask = torch.empty(count)
    library.seq2seq_dropout_mask(count, seed, dropped, scale, mask.data_ptr())
    levels = shift_right(splitmix64(seed, count), 48)  # the top 16 bits, 0..65535
    expected = torch.where(levels >= dropped, scale, 0.0)
    if not torch.equal(mask, expected):
        wrong = int((mask != expected).sum())
        raise RuntimeError(
            f"the compiled dropout mask differs from SplitMix64's in {wrong} of {count} elements"
        )


def _torch_cell(gi: Tensor, gh: Tensor, hidden: Tensor) -> Tensor:
    """nn.GRU's cell from its two projections (..., 3H) and the state (..., H)."""
    i_r, i_z, i_n = gi.chunk(3, -1)
    h_r, h_z, h_n = gh.chunk(3, -1)
    reset, update = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
    new = torch.tanh(i_n + reset * h_n)
    return (1 - update) * new + update * hidden


def library() -> ctypes.CDLL | None:
    """The compiled kernels, built and checked on first call; None where they cannot be."""
    if "library" not in _state:
        with _lock:
            if "library" not in _state:
                try:
                    _state["library"] = _load()
                except (OSError, RuntimeError) as error:
                    _state["library"], _state["reason"] = None, str(error)
    return _state["library"]


def blas_sgemm() -> int | None:
    """The address of the BLAS ``sgemm_`` torch's own matrix products call, for the C greedy
    loop (``seq2seq.fused_greedy``); None where it is not found or does not compute what
    torch.addmm does (greedy decoding then steps in Python). Found once, on first call."""
    kernels = library()  # before the lock: library() takes it too
    if kernels is None:
        return None
    if "sgemm" not in _state:
        with _lock:
            if "sgemm" not in _state:
                address = _find_sgemm()
                if address is not None:
                    with _float32_references():
                        address = address if _sgemm_agrees(kernels, address) else None
                _state["sgemm"] = address
    return _state["sgemm"]


def c_loops() -> bool:
    """Whether a GRU layer's steps loop in C (``seq2seq_gru_layer_forward`` and its backward,
    with their own small-GEMM kernel): where the library loaded and its loops compute what the
    Python loop over torch's GEMMs does (``_loops_agree``, checked once, on first call)."""
    kernels = library()
    if kernels is None:
        return False
    if "loops" not in _state:
        with _lock:
            if "loops" not in _state:
                with _float32_references():
                    _state["loops"] = _loops_agree(kernels)
    return bool(_state["loops"])


def _find_sgemm() -> int | None:
    """MKL's ``sgemm_``, which x86 builds of torch link into libtorch_cpu and call for float32
    ``mm``; None elsewhere (another BLAS may run its own threads beside torch's, and the C
    loop passes integers in a way only little-endian machines read right)."""
    if sys.byteorder != "little" or not torch.backends.mkl.is_available():
        return None
    for path in sorted((Path(torch.__file__).parent / "lib").glob("*torch_cpu.*")):
        try:
            symbol = ctypes.CDLL(str(path)).sgemm_
        except (OSError, AttributeError):
            continue
        return ctypes.cast(symbol, ctypes.c_void_p).value
    return None


def _sgemm_agrees(kernels: ctypes.CDLL, sgemm: int) -> bool:
    """``seq2seq_affine_rows`` through ``sgemm`` against torch.addmm (and mm, without a bias)
    on random rows: an sgemm that misreads its arguments must not decode."""
    generator = torch.Generator().manual_seed(0)  # not the global stream, as in _check
    rows, inputs, outputs = 5, 19, 23
    x = torch.randn(rows, inputs, generator=generator)
    weight = torch.randn(outputs, inputs, generator=generator)
    bias = torch.randn(outputs, generator=generator)
    for b in (bias, None):
        y = torch.empty(rows, outputs)
        kernels.seq2seq_affine_rows(
            sgemm, rows, outputs, inputs, weight.data_ptr(), inputs,
            None if b is None else b.data_ptr(), x.data_ptr(), y.data_ptr(),
        )  # fmt: skip
        expected = x @ weight.t() if b is None else torch.addmm(b, x, weight.t())
        if not torch.allclose(y, expected, rtol=1e-5, atol=1e-5):
            return False
    return True


def _loops_agree(kernels: ctypes.CDLL, size: int = 23, batch_sizes: Sequence[int] = (6, 5)) -> bool:
    """The C loops (the directions one after the other, and at once) against the Python loop,
    forward and backward, on random rows: both directions over a packed batch of these
    ``batch_sizes``, with biases, by default at a size whose panels and row blocks have
    remainders. They run the same passes and GEMMs of the same sums (their own kernel against
    torch's), so they must agree to rounding."""
    generator = torch.Generator().manual_seed(0)
    steps = Steps.packed(list(batch_sizes))
    rows = steps.rows
    schedules = [_schedule(steps, direction, size, 2) for direction in range(2)]
    # Every draw from the check's own generator, as in _check.
    gates = torch.randn(rows, 6 * size, generator=generator)
    d_outputs = torch.randn(rows, 2 * size, generator=generator)
    weights = [
        torch.randn(shape, generator=generator) / size**0.5
        for _ in range(2)
        for shape in ((3 * size, size), (3 * size,))
    ]
    batch = steps.batch_sizes[0]
    initial = torch.randn(2, batch, size, generator=generator)
    results = []
    for concurrent in (None, False, True):  # None: the Python loop
        finals, outputs = initial.clone(), torch.zeros(rows, 2 * size)
        recurrent, saved = torch.empty(2, batch, 3 * size), torch.empty(2, rows, 5 * size)
        d_states, d_gates = initial.clone(), torch.zeros(rows, 6 * size)
        d_recurrent = torch.empty(2, rows, 3 * size)
        if concurrent is None:
            for direction, schedule in enumerate(schedules):
                weight, bias = weights[2 * direction : 2 * direction + 2]
                _forward_steps(kernels, schedule, gates, weight, bias, finals[direction],
                               outputs, recurrent[direction], saved[direction])  # fmt: skip
                _backward_steps(kernels, schedule, d_states[direction], d_outputs,
                                saved[direction], d_gates, d_recurrent[direction],
                                weight)  # fmt: skip
        else:
            _forward_layer(kernels, schedules, gates, tuple(weights), finals, outputs, recurrent,
                           saved, concurrent)  # fmt: skip
            _backward_layer(kernels, schedules, d_states, d_outputs, saved, d_gates, d_recurrent,
                            list(weights), concurrent)  # fmt: skip
        results.append([finals, outputs, saved, d_states, d_gates, d_recurrent])
    # Values of order 1: two float32 GEMMs of up to 768-term sums differ by a few 1e-6 (measured
    # up to 5.7e-6 at H=128), a wrong kernel by far more.
    return all(
        torch.allclose(value, expected, rtol=1e-5, atol=1e-5)
        for variant in results[1:]
        for value, expected in zip(variant, results[0], strict=True)
    )


def unavailable_reason() -> str | None:
    """Why the kernels cannot be used here (None when they can, or were never asked for)."""
    return _state.get("reason")


def usable(*tensors: Tensor | None) -> bool:
    """Whether ``gru`` / ``gru_steps`` can run on these tensors (the inputs and parameters)."""
    if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():  # type: ignore[attr-defined]
        return False
    if torch.compiler.is_compiling() or torch.is_autocast_enabled("cpu"):
        return False  # autocast: ATen's GRU computes in the autocast dtype, as it always has
    for tensor in tensors:
        if tensor is not None and (tensor.device.type != "cpu" or tensor.dtype != torch.float32):
            return False
    if library() is None:
        warn_unavailable()
        return False
    return True


def warn_unavailable() -> None:
    """Say once per process that ATen's GRU runs instead, and why."""
    if not _state.get("warned"):
        _state["warned"] = True
        warnings.warn(
            f"seq2seq's fused CPU GRU kernels are unavailable ({unavailable_reason()}); "
            "ATen's GRU runs instead (same results, slower on the CPU). To use them, set CC to a C "
            f"compiler and XDG_CACHE_HOME to a writable directory (now {cache_dir()}); "
            "model.fused_rnn=false chooses ATen's GRU and silences this warning.",
            RuntimeWarning,
            stacklevel=3,
        )


@dataclass(frozen=True)
class Steps:
    """Where each time step's rows are in an (N, ·) tensor of rows.

    Step t has ``batch_sizes[t]`` rows (non-increasing over t: packed sequences are sorted by
    length), the first at row ``starts[t]``, the next ``stride`` rows further on.
    """

    batch_sizes: tuple[int, ...]
    starts: tuple[int, ...]
    stride: int

    @staticmethod
    def packed(batch_sizes: list[int]) -> Steps:
        """A ``PackedSequence``'s rows: step after step, each step's rows together."""
        starts = [0]
        for size in batch_sizes[:-1]:
            starts.append(starts[-1] + size)
        return Steps(tuple(batch_sizes), tuple(starts), 1)

    @staticmethod
    def padded(batch: int, steps: int, batch_first: bool) -> Steps:
        """A padded (B, T, ·) or (T, B, ·) tensor's rows: every row active at every step."""
        counts = [batch] * steps
        if batch_first:  # row b * T + t
            return Steps(tuple(counts), tuple(range(steps)), steps)
        return Steps(tuple(counts), tuple(t * batch for t in range(steps)), 1)

    @property
    def rows(self) -> int:
        """How many rows the steps visit: fewer than the tensor's where some are padding."""
        return sum(self.batch_sizes)


class _Recurrence(torch.autograd.Function):
    """gates (N, D·3H) = W_ih x + b_ih of D directions, initial (D, B, H), then each direction's
    W_hh (3H, H) and b_hh (3H,) or None -> outputs (N, D·H), final states (D, B, H).

    Direction 0 runs forward in time, direction 1 backward. A row absent from a step (a short
    sentence in a packed batch) keeps its state: the backward direction starts at each
    sentence's last token, as ``nn.GRU`` on a ``PackedSequence`` does.
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx, gates: Tensor, initial: Tensor, steps: Steps, *weights: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        kernels = library()
        assert kernels is not None  # usable() checked it
        directions, _, size = initial.shape
        gates = gates.contiguous()
        rows, width = gates.shape[0], directions * size
        outputs = gates.new_empty(rows, width)
        finals = initial.clone(memory_format=torch.contiguous_format)  # each step updates it
        needs_grad = any(ctx.needs_input_grad)  # type: ignore[attr-defined]
        # Per direction, r z n gh_n h of every visited row (N', 5H), in the order the steps ran.
        saved = gates.new_empty(directions, steps.rows, 5 * size) if needs_grad else None
        # (D, B, 3H): each direction's W_hh h of one step
        recurrent = gates.new_empty(directions, initial.shape[1], 3 * size)
        schedules = [
            _schedule(steps, direction, size, directions) for direction in range(directions)
        ]
        if c_loops():  # every step of every direction in one C call
            _forward_layer(kernels, schedules, gates, weights, finals, outputs, recurrent, saved,
                           _concurrent(directions))  # fmt: skip
        else:
            for direction, schedule in enumerate(schedules):
                weight, bias = weights[2 * direction], weights[2 * direction + 1]
                assert weight is not None
                _forward_steps(
                    kernels, schedule, gates, weight, bias, finals[direction], outputs,
                    recurrent[direction], None if saved is None else saved[direction],
                )  # fmt: skip
        if saved is not None:
            ctx.save_for_backward(saved, *weights)  # type: ignore[arg-type]  # None: no bias
        ctx.steps = steps  # type: ignore[attr-defined]
        return outputs, finals

    @staticmethod
    @once_differentiable
    def backward(
        ctx: FunctionCtx, d_outputs: Tensor, d_finals: Tensor
    ) -> tuple[Tensor | None, ...]:
        kernels = library()
        assert kernels is not None
        saved, *weights = ctx.saved_tensors  # type: ignore[attr-defined]
        steps: Steps = ctx.steps  # type: ignore[attr-defined]
        directions, rows, size = saved.shape[0], saved.shape[1], saved.shape[2] // 5
        width = directions * size
        d_outputs = d_outputs.contiguous()
        d_states = d_finals.clone(memory_format=torch.contiguous_format)  # (D, B, H)
        d_gates = d_outputs.new_empty(d_outputs.shape[0], 3 * width)
        d_recurrent = d_outputs.new_empty(directions, rows, 3 * size)  # in the steps' run order
        schedules = [
            _schedule(steps, direction, size, directions) for direction in range(directions)
        ]
        if c_loops():  # every step of every direction in one C call
            _backward_layer(kernels, schedules, d_states, d_outputs, saved, d_gates, d_recurrent,
                            weights, _concurrent(directions))  # fmt: skip
        else:
            for direction, schedule in enumerate(schedules):
                _backward_steps(
                    kernels, schedule, d_states[direction], d_outputs, saved[direction],
                    d_gates, d_recurrent[direction], weights[2 * direction],
                )  # fmt: skip
        grads: list[Tensor | None] = []
        for direction in range(directions):
            bias = weights[2 * direction + 1]
            previous = saved[direction, :, 4 * size :]  # (N, H): each row's h before its step
            # All steps' W_hh gradients in one GEMM: (3H, N) @ (N, H) -> (3H, H)
            grads.append(d_recurrent[direction].t() @ previous)
            grads.append(None if bias is None else d_recurrent[direction].sum(0))
        return d_gates, d_states, None, *grads


def _forward_layer(
    kernels: ctypes.CDLL,
    schedules: list[_Schedule],
    gates: Tensor,
    weights: tuple[Tensor | None, ...],
    finals: Tensor,
    outputs: Tensor,
    recurrent: Tensor,
    saved: Tensor | None,
    concurrent: bool,
) -> None:
    """Every direction's steps of ``_Recurrence.forward`` in one C call, with ``concurrent``
    (``_concurrent``) each direction on its own thread. finals (D, B, H) enter as the initial
    states and leave as the final ones; outputs (N, D·H) and saved (D, N', 5H) are written (N'
    visited rows), recurrent (D, B, 3H) is scratch."""
    directions, batch, size = finals.shape
    tables = _tables(schedules)  # (D, 3, T)
    held = [None if tensor is None else tensor.contiguous() for tensor in weights]  # (see below)
    # Each direction's W_hh^T in the C GEMM's panels, packed there once per call.
    panels = gates.new_empty(directions, kernels.seq2seq_panel_floats(size, 3 * size))
    kernels.seq2seq_gru_layer_forward(
        directions, tables.shape[2], tables.data_ptr(), batch, size, sum(schedules[0].counts),
        gates.data_ptr(), schedules[0].gate_stride, _addresses(held[0::2]),
        _addresses(held[1::2]), finals.data_ptr(), outputs.data_ptr(), schedules[0].out_stride,
        recurrent.data_ptr(), None if saved is None else saved.data_ptr(), panels.data_ptr(),
        concurrent,
    )  # fmt: skip


def _backward_layer(
    kernels: ctypes.CDLL,
    schedules: list[_Schedule],
    d_states: Tensor,
    d_outputs: Tensor,
    saved: Tensor,
    d_gates: Tensor,
    d_recurrent: Tensor,
    weights: list[Tensor | None],
    concurrent: bool,
) -> None:
    """Every direction's steps of ``_Recurrence.backward`` in one C call, as in
    ``_forward_layer``: d_states (D, B, H) go from the final states' gradients to the initial
    ones', d_gates (N, D·3H) and d_recurrent (D, N, 3H, in the steps' run order) are written."""
    directions, batch, size = d_states.shape
    tables = _tables(schedules)  # (D, 3, T)
    held = [None if tensor is None else tensor.contiguous() for tensor in weights[0::2]]
    panels = d_states.new_empty(directions, kernels.seq2seq_panel_floats(3 * size, size))
    kernels.seq2seq_gru_layer_backward(
        directions, tables.shape[2], tables.data_ptr(), batch, size, saved.shape[1],
        d_states.data_ptr(), d_outputs.data_ptr(), schedules[0].out_stride, saved.data_ptr(),
        d_gates.data_ptr(), schedules[0].gate_stride, d_recurrent.data_ptr(), _addresses(held),
        panels.data_ptr(), concurrent,
    )  # fmt: skip


def _addresses(tensors: list[Tensor | None]) -> ctypes.Array[ctypes.c_void_p]:
    """The C array of the tensors' data pointers (NULL for None). The caller holds the tensors
    until the call returns: a temporary's memory could be freed before the C code reads it."""
    return (ctypes.c_void_p * len(tensors))(
        *(None if tensor is None else tensor.data_ptr() for tensor in tensors)
    )


def _concurrent(directions: int) -> bool:
    """Whether a layer's directions run at once, each on its own thread with single-threaded
    GEMMs: where torch has exactly as many threads as there are directions (the benchmark's 2
    threads and bidirectional encoder: its forward pass 2,700 -> 2,150-2,430 us at B=64, H=128,
    T=25). With more threads, each GEMM on all of them; with one, nothing to share."""
    return directions > 1 and torch.get_num_threads() == directions


def _forward_steps(
    kernels: ctypes.CDLL,
    schedule: _Schedule,
    gates: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    state: Tensor,
    outputs: Tensor,
    recurrent: Tensor,
    saved: Tensor | None,
) -> None:
    """One direction's steps of ``_Recurrence.forward`` where the C loops are not used
    (``c_loops``): a Python loop of torch GEMMs and C passes (the arithmetic of
    ``_forward_layer``), and the reference ``_loops_agree`` checks those against.
    state (B, H) is updated in place, outputs (N, D·H) and saved (N, 5H) are written."""
    size = state.shape[1]
    weight_t = weight.t()  # (H, 3H)
    done = 0
    for count, gate_at, out_at in schedule.steps():
        step_recurrent = recurrent[:count]
        # (n, H) @ (H, 3H) -> (n, 3H)
        if bias is None:
            torch.mm(state[:count], weight_t, out=step_recurrent)
        else:
            torch.addmm(bias, state[:count], weight_t, out=step_recurrent)
        kernels.seq2seq_gru_forward(
            count, size, _address(gates, gate_at), schedule.gate_stride,
            step_recurrent.data_ptr(), state.data_ptr(), _address(outputs, out_at),
            schedule.out_stride, None if saved is None else _address(saved, done * 5 * size),
        )  # fmt: skip
        done += count


def _backward_steps(
    kernels: ctypes.CDLL,
    schedule: _Schedule,
    d_state: Tensor,
    d_outputs: Tensor,
    saved: Tensor,
    d_gates: Tensor,
    d_recurrent: Tensor,
    weight: Tensor | None,
) -> None:
    """One direction's steps of ``_Recurrence.backward`` in Python, as ``_forward_steps``:
    d_state (B, H) goes from the final states' gradient to the initial ones', d_gates (N, D·3H)
    and d_recurrent (N, 3H, in the steps' run order) are written."""
    assert weight is not None
    size = d_state.shape[1]
    done = saved.shape[0]
    for count, gate_at, out_at in reversed(schedule.steps()):
        done -= count
        step_d_recurrent = d_recurrent[done : done + count]  # (n, 3H)
        kernels.seq2seq_gru_backward(
            count, size, d_state.data_ptr(), _address(d_outputs, out_at), schedule.out_stride,
            _address(saved, done * 5 * size), _address(d_gates, gate_at), schedule.gate_stride,
            step_d_recurrent.data_ptr(),
        )  # fmt: skip
        # dL/dh += d_gh @ W_hh: (n, 3H) @ (3H, H)
        d_state[:count].addmm_(step_d_recurrent, weight)


@dataclass(frozen=True)
class _Schedule:
    """One direction's steps in the order they run: each step's row count and where its first
    gate and output rows start (in floats, in tensors laid out as ``_Recurrence``'s gates and
    outputs), with the row strides."""

    counts: tuple[int, ...]
    gate_offsets: tuple[int, ...]
    out_offsets: tuple[int, ...]
    gate_stride: int
    out_stride: int

    def steps(self) -> list[tuple[int, int, int]]:
        return list(zip(self.counts, self.gate_offsets, self.out_offsets, strict=True))


def _tables(schedules: list[_Schedule]) -> Tensor:
    """The C layer loops' schedule: per direction its counts, gate offsets and output offsets,
    (D, 3, T) int64."""
    return torch.tensor(
        [[schedule.counts, schedule.gate_offsets, schedule.out_offsets] for schedule in schedules],
        dtype=torch.int64,
    )


def _schedule(steps: Steps, direction: int, size: int, directions: int) -> _Schedule:
    order = _order(steps, direction)
    width = directions * size
    counts = tuple(steps.batch_sizes[t] for t in order)
    gate_offsets = tuple(steps.starts[t] * 3 * width + direction * 3 * size for t in order)
    out_offsets = tuple(steps.starts[t] * width + direction * size for t in order)
    return _Schedule(
        counts, gate_offsets, out_offsets, steps.stride * 3 * width, steps.stride * width
    )


def _order(steps: Steps, direction: int) -> range:
    count = len(steps.batch_sizes)
    return range(count) if direction == 0 else range(count - 1, -1, -1)


def _address(tensor: Tensor, offset: int) -> int:
    """The address of element ``offset`` of a contiguous float32 tensor."""
    return tensor.data_ptr() + offset * FLOAT_BYTES


@overload
def gru(module: nn.GRU, inputs: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]: ...


@overload
def gru(
    module: nn.GRU, inputs: PackedSequence, hx: Tensor | None = None
) -> tuple[PackedSequence, Tensor]: ...


def gru(
    module: nn.GRU, inputs: Tensor | PackedSequence, hx: Tensor | None = None
) -> tuple[Tensor | PackedSequence, Tensor]:
    """``module(inputs, hx)`` for an ``nn.GRU`` (check ``usable`` first): outputs of the last
    layer, packed or padded like ``inputs``, and the final states (L·D, B, H)."""
    directions = 2 if module.bidirectional else 1
    size = module.hidden_size
    if isinstance(inputs, PackedSequence):
        rows = inputs.data  # (N, E)
        steps = Steps.packed(inputs.batch_sizes.tolist())
        batch = steps.batch_sizes[0]
    else:
        if inputs.dim() != 3:
            raise ValueError(f"fused_rnn.gru takes a batched (3-D) input, got {inputs.dim()}-D")
        inputs = inputs.contiguous()
        batch, length = inputs.shape[:2] if module.batch_first else inputs.shape[1::-1]
        rows = inputs.view(-1, inputs.shape[-1])  # (B·T or T·B, E)
        steps = Steps.padded(batch, length, module.batch_first)
    if hx is None:
        hx = rows.new_zeros(module.num_layers * directions, batch, size)
    elif isinstance(inputs, PackedSequence) and inputs.sorted_indices is not None:
        hx = hx.index_select(1, inputs.sorted_indices)  # the packed rows' order
    suffixes = ["", "_reverse"][:directions]
    finals = []
    for layer in range(module.num_layers):
        if layer > 0 and module.training and module.dropout > 0:
            rows = F.dropout(rows, module.dropout, training=True)
        names = [f"l{layer}{suffix}" for suffix in suffixes]
        # Both directions' input projections in one GEMM: (N, E) @ (E, D·3H).
        input_weight = torch.cat([getattr(module, f"weight_ih_{name}") for name in names])
        input_bias = None
        if module.bias:
            input_bias = torch.cat([getattr(module, f"bias_ih_{name}") for name in names])
        weights: list[Tensor | None] = []
        for name in names:
            weights.append(getattr(module, f"weight_hh_{name}"))
            weights.append(getattr(module, f"bias_hh_{name}") if module.bias else None)
        gates = F.linear(rows, input_weight, input_bias)  # (N, D·3H)
        initial = hx[layer * directions : (layer + 1) * directions]
        rows, layer_finals = _Recurrence.apply(gates, initial, steps, *weights)
        finals.append(layer_finals)
    final = torch.cat(finals)  # (L·D, B, H)
    if isinstance(inputs, PackedSequence):
        if inputs.unsorted_indices is not None:
            final = final.index_select(1, inputs.unsorted_indices)
        packed = PackedSequence(
            rows, inputs.batch_sizes, inputs.sorted_indices, inputs.unsorted_indices
        )
        return packed, final
    return rows.view(*inputs.shape[:2], directions * size), final


def gru_steps(
    inputs: Tensor, initial: Tensor, params: list[Tensor], batch_sizes: Sequence[int] | None = None
) -> Tensor:
    """One unidirectional GRU layer. ``params`` are W_ih, W_hh and optionally b_ih, b_hh
    (``torch.gru``'s order), so this is ``torch.gru`` with one layer, batch first:

    - over a padded batch: inputs (B, T, E), initial (B, H) -> states (B, T, H);
    - with ``batch_sizes`` (T',), over packed rows (a ``PackedSequence``'s order, as
      ``seq2seq.packing.pack_tokens`` gives): inputs (N, E), initial (B, H) with its rows in the
      sorted order -> states (N, H), the padding never computed.
    """
    weight_ih, weight_hh = params[0], params[1]
    bias_ih, bias_hh = (params[2], params[3]) if len(params) == 4 else (None, None)
    gates = F.linear(inputs, weight_ih, bias_ih)  # (B, T, 3H) or (N, 3H)
    if batch_sizes is not None:
        steps = Steps.packed(list(batch_sizes))
        rows, _ = _Recurrence.apply(gates, initial[None], steps, weight_hh, bias_hh)
        return rows  # (N, H)
    batch, length = inputs.shape[:2]
    steps = Steps.padded(batch, length, batch_first=True)
    rows, _ = _Recurrence.apply(
        gates.view(batch * length, -1), initial[None], steps, weight_hh, bias_hh
    )
    return rows.view(batch, length, -1)  # (B, T, H)


def gru_cell(
    input_gates: Tensor, hidden: Tensor, weight_hh: Tensor, bias_hh: Tensor | None
) -> Tensor:
    """One ``nn.GRUCell`` step without autograd, for decoding: the input projection
    ``W_ih x + b_ih`` (B, 3H, made by the caller) and the state (B, H) -> the new state (B, H).

    A decoding step is one GEMM and one C pass here instead of ATen's half-dozen elementwise
    kernels (``AttentionDecoder.cell_gates``). It saves nothing for a backward pass, so the caller
    must not want gradients; ``usable`` must hold for the tensors.
    """
    kernels = library()
    assert kernels is not None  # usable() checked it
    rows, size = hidden.shape
    if input_gates.stride(-1) != 1:
        input_gates = input_gates.contiguous()
    # (B, H) @ (H, 3H) -> (B, 3H)
    if bias_hh is None:
        recurrent = torch.mm(hidden, weight_hh.t())
    else:
        recurrent = torch.addmm(bias_hh, hidden, weight_hh.t())
    # The kernel overwrites the previous state it reads and writes the new one to a second
    # buffer as well (no aliasing allowed): the caller's state stays as it was.
    state = hidden.clone(memory_format=torch.contiguous_format)
    new = torch.empty_like(state)
    kernels.seq2seq_gru_forward(
        rows, size, input_gates.data_ptr(), input_gates.stride(0), recurrent.data_ptr(),
        state.data_ptr(), new.data_ptr(), size, None,
    )  # fmt: skip
    return new


class _Tanh(torch.autograd.Function):
    """tanh in place through the C pass, with tanh's gradient 1 - tanh^2 from the result."""

    @staticmethod
    def forward(ctx: FunctionCtx, values: Tensor) -> Tensor:
        tanh_(values)
        ctx.mark_dirty(values)
        ctx.save_for_backward(values)
        return values

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: Tensor) -> Tensor:
        (result,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return torch.ops.aten.tanh_backward(grad, result)


def tanh_with_grad_(values: Tensor) -> Tensor:
    """``tanh_`` as an autograd node: the Luong decoder's attentional layer in training, where
    ``torch.tanh`` took 410 us at the benchmark's (64, 16, 256), about 1 % of a training step.
    ``values`` must be contiguous, ``usable``, and not needed by autograd as it was (a layer's
    fresh output): it is overwritten."""
    result: Tensor = _Tanh.apply(values)
    return result


def tanh_(values: Tensor) -> Tensor:
    """tanh in place through the C pass, without autograd (decoding's attentional layer): about
    a third of ``torch.tanh``'s time at (64, 256) on the project's CPU. ``values`` must be
    contiguous and ``usable``."""
    kernels = library()
    assert kernels is not None  # usable() checked it
    assert values.is_contiguous()
    kernels.seq2seq_tanh(values.numel(), values.data_ptr())
    return values
