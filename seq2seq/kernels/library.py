"""The C kernels' library: compiled on first use, checked, and loaded once per process.

``csrc/gru.c`` holds the GRU cell's forward and backward passes and the loops over a layer's
steps (``seq2seq.kernels.gru``), dot-product and general attention over the Luong decoder's
packed rows (``seq2seq.kernels.product_attention``), the Luong decoder's greedy loop
(``seq2seq.kernels.greedy``) and the dropout keep mask (``seq2seq.kernels.dropout``);
``csrc/attention.c`` the parts of one attention, each the twin of its Python function by name
(scores, normalizers, windows, the context: ``seq2seq.kernels.attention_parts``), which both
decoders compose. Both are compiled into one library.

It is compiled on first use with the system's C compiler (``$CC``, default ``cc``; a fraction of
a second) into ``$XDG_CACHE_HOME/seq2seq`` (default ``~/.cache/seq2seq``), keyed by a hash of the
source and flags, and checked against torch's results when it loads. The C is plain C99 with no
library calls (its exp is a polynomial the compiler vectorises), built for the instruction set
torch itself uses here (``kernel_isa``: AVX-512, AVX2 or the compiler's baseline;
``SEQ2SEQ_KERNELS_ISA`` lowers it), so any C compiler builds it and no CPU gets instructions it
lacks. Where none is found or the build fails, ``usable`` is false, the reference modules run
instead, one warning says so, and ``unavailable_reason()`` says why. Where torch's threads are
GNU OpenMP's, it is built with ``-fopenmp`` and splits a step's rows over those same threads.

``usable`` says when the kernels apply: float32 tensors on the CPU, no CPU autocast (mixed
precision), the library built, and not inside an ONNX export, a trace or ``torch.compile`` (they
cannot see into a ctypes call).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seq2seq.atomic import write_atomic
from seq2seq.kernels.splitmix import shift_right, splitmix64

CSRC = Path(__file__).with_name("csrc")
# Compiled together into one library; the header is what they share (the vectorising exp).
SOURCES = (CSRC / "gru.c", CSRC / "attention.c")
HEADERS = (CSRC / "vector_math.h",)
FLOAT_BYTES = 4
COMPILE_TIMEOUT_S = 120  # it takes well under a second; a hung compiler must not hang training
ISA_VARIABLE = "SEQ2SEQ_KERNELS_ISA"  # lowers the instruction set the library is built for

log = logging.getLogger(__name__)

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
        # zmm loops: twice the lanes of ymm for the GRU's loops. Torch reports AVX512 only where
        # the CPU also has AVX-512 DQ (and BW, VL), whose 64-bit multiply the dropout mask's hash
        # needs (else emulated on 32-bit lanes).
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
    """Compile ``csrc/gru.c`` and ``csrc/attention.c`` into ``directory`` (default
    ``cache_dir()``) unless a build of the same sources and flags is there; return the
    library's path. Raises ``RuntimeError`` with the compiler's message when it fails. Where the
    build with OpenMP fails (a compiler without its runtime's files), it is built without,
    single-threaded."""
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
    text = b"".join(path.read_bytes() for path in (*SOURCES, *HEADERS))
    key = hashlib.sha256(text + " ".join([compiler, *flags]).encode()).hexdigest()
    target = directory / f"gru-{key[:16]}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)

    def compile_into(temporary: Path) -> None:
        command = [compiler, *flags, *map(str, SOURCES), "-o", str(temporary)]
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, check=False, timeout=COMPILE_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as error:
            raise RuntimeError(f"`{' '.join(command)}` took over {COMPILE_TIMEOUT_S} s") from error
        if result.returncode != 0:
            said = result.stderr.strip()[-600:] or "it printed nothing"
            raise RuntimeError(
                f"`{' '.join(command)}` failed with exit status {result.returncode}: {said}"
            )

    # Built beside the target and renamed over it: processes building at once (DDP ranks) each
    # rename a complete library, never load a half-written one.
    write_atomic(target, compile_into)
    return target


def _load() -> ctypes.CDLL:
    library = open_library(build())
    with float32_references():
        _check(library)
    return library


def float32_references() -> torch.autocast:
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
    declare_attention_parts(library)
    # seq2seq.kernels.product_attention's product attention: rows, group, the rows' sentences
    # (or NULL), S, D, V, scale, then the arrays; and its backward pass over packed rows: rows,
    # B, S, D, V, scale, then the arrays.
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
    # A weight into panels (K, N, the weight, its row stride, transposed, the panels) and a
    # step's rows through them (rows, K, N, A, lda, panels, bias, accumulate, C, ldc).
    library.seq2seq_pack_panels.argtypes = [i64, i64, pointer, i64, ctypes.c_int, pointer]
    library.seq2seq_pack_panels.restype = None
    library.seq2seq_panel_gemm.argtypes = [i64, i64, i64, pointer, i64, pointer, pointer]
    library.seq2seq_panel_gemm.argtypes += [ctypes.c_int, pointer, i64]
    library.seq2seq_panel_gemm.restype = None
    # y = x W^T + bias through a given sgemm: sgemm, rows, out, in, W, ldw, bias, x, y.
    library.seq2seq_affine_rows.argtypes = [pointer, i64, i64, i64, pointer, i64, pointer]
    library.seq2seq_affine_rows.argtypes += [pointer, pointer]
    library.seq2seq_affine_rows.restype = None
    # seq2seq.kernels.greedy's loop: sgemm, B, S, H, V, max_steps, bos, eos, the cell's table and
    # weights, keys, values, lens, scale, W_c2 and its row stride, the output layer, limits,
    # the state and scratch, the outputs, the parts (a GreedyParts, or NULL) with their spans
    # scratch and the coverage, input feeding's W_if, its row stride and the fed vector, and
    # whether to pack the weights into panels (step_gemm.step_panels); it returns the steps.
    greedy: list[type[ctypes._SimpleCData[Any]]] = [pointer, *[i64] * 7, *[pointer] * 6]
    greedy += [ctypes.c_float, pointer, i64, *[pointer] * 9, pointer, pointer, pointer]
    greedy += [pointer, i64, pointer, ctypes.c_int]
    library.seq2seq_luong_greedy.argtypes = greedy
    library.seq2seq_luong_greedy.restype = i64
    # seq2seq.kernels.dropout's keep mask: n, seed, dropped, scale, mask.
    library.seq2seq_dropout_mask.argtypes = [i64, ctypes.c_uint64, i64, ctypes.c_float, pointer]
    library.seq2seq_dropout_mask.restype = None
    return library


def declare_attention_parts(library: ctypes.CDLL) -> None:
    """The signatures of ``csrc/attention.c``'s parts (its comments say what each argument is)."""
    i64, pointer, real = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    context = [i64, i64, i64, i64, pointer, i64, pointer, pointer, pointer, i64]
    signatures: dict[str, list[Any]] = {
        # rows, group, S, lengths, spans; rows, group, S, D, lengths, centres, spans
        "seq2seq_global_window": [i64, i64, i64, pointer, pointer],
        "seq2seq_local_window": [i64, i64, i64, i64, pointer, pointer, pointer],
        # rows, group, S, A, scale, q, keys, w_v, spans, saved, logits
        "seq2seq_additive_score": [i64, i64, i64, i64, real, *[pointer] * 6],
        # rows, group, S, A, scale, saved, q, keys, w_v, spans, d_logits, d_q, d_keys, d_w_v
        "seq2seq_additive_score_backward": [i64, i64, i64, i64, real, *[pointer] * 9],
        # rows, group, S, A, scale, eps, q, keys, params, spans, saved_u, saved_normed,
        # saved_rstd, logits; rows, group, S, A, scale, eps, saved_u, saved_normed, saved_rstd,
        # q, keys, params, spans, d_logits, d_q, d_keys, d_params
        "seq2seq_additive_layer_norm_score": [i64, i64, i64, i64, real, real, *[pointer] * 8],
        "seq2seq_additive_layer_norm_score_backward": [i64] * 4 + [real, real, *[pointer] * 11],
        # rows, group, S, D, scale, q, keys, spans, logits
        "seq2seq_product_score": [i64, i64, i64, i64, real, *[pointer] * 4],
        # rows, group, S, D, scale, q, keys, spans, d_logits, d_q, d_keys
        "seq2seq_product_score_backward": [i64, i64, i64, i64, real, *[pointer] * 6],
        # rows, group, S, A, spans, keys, coverage, w_c, covered; the same without keys, then
        # w_c, d_covered, d_keys, d_coverage, d_w_c
        "seq2seq_additive_coverage": [i64, i64, i64, i64, *[pointer] * 5],
        "seq2seq_additive_coverage_backward": [i64, i64, i64, i64, *[pointer] * 7],
        # rows, S, spans, gamma, coverage, logits; the same, d_logits, d_coverage, d_gamma
        "seq2seq_coverage": [i64, i64, pointer, real, pointer, pointer],
        "seq2seq_coverage_backward": [i64, i64, pointer, real, *[pointer] * 4],
        # rows, S, D, spans, centres, weights, stride, normalized; rows, S, D, spans, centres,
        # normalized, d_weights, d_centres
        "seq2seq_local_p_gaussian": [i64, i64, i64, pointer, pointer, pointer, i64, pointer],
        "seq2seq_local_p_gaussian_backward": [i64, i64, i64, *[pointer] * 5],
        # rows, H, v_p, lengths, sentence_of, features, gates, centres; rows, heads, H, v_p,
        # lengths, features, gates, d_centres, d_predicted, d_projected
        "seq2seq_local_p_centres": [i64, i64, *[pointer] * 6],
        "seq2seq_local_p_centres_backward": [i64, i64, i64, *[pointer] * 7],
        # rows, S, spans, logits, d_logits, d_temperature
        "seq2seq_temperature_backward": [i64, i64, *[pointer] * 4],
        # rows, S, P, bias, spans, logits; rows, S, P, spans, d_logits, d_bias
        "seq2seq_key_bias": [i64, i64, i64, pointer, pointer, pointer],
        "seq2seq_key_bias_backward": [i64, i64, i64, pointer, pointer, pointer],
        # rows, S, spans, alpha, iterations, logits, weights, weights' stride
        "seq2seq_entmax_bisect": [i64, i64, pointer, real, i64, pointer, pointer, i64],
        # rows, S, alpha, spans, weights, weights' stride, d_weights, d_alpha (rows,)
        "seq2seq_entmax_alpha_backward": [i64, i64, real, pointer, pointer, i64, pointer, pointer],
        # rows, S, alpha, spans, weights, weights' stride, d_weights, d_logits
        "seq2seq_entmax_backward": [i64, i64, real, pointer, pointer, i64, pointer, pointer],
        # rows, group, S, V, weights, weights' stride, spans, values, context, its stride
        "seq2seq_attention_context": context,
        # rows, group, S, V, weights, stride, spans, values, d_context, stride, the weights'
        # own gradient or NULL, stride, d_weights, d_values
        "seq2seq_attention_context_backward": [*context, pointer, i64, pointer, pointer],
    }
    for normalizer in ("softmax", "sparsemax", "entmax15"):
        # rows, S, spans, logits, weights, weights' stride
        signatures[f"seq2seq_{normalizer}"] = [i64, i64, pointer, pointer, pointer, i64]
    for name, argtypes in signatures.items():
        function = getattr(library, name)
        function.argtypes, function.restype = argtypes, None


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
    valid keys of w_v . tanh(q + k) (csrc/attention.c's parts, as seq2seq.kernels.bahdanau
    composes them) or of 0.5 q . k (seq2seq.kernels.product_attention), context = weights @
    memory."""
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
    logits, spans = torch.empty(rows, keys), torch.empty(rows, 2, dtype=torch.int64)
    library.seq2seq_global_window(rows, 1, keys, lens.data_ptr(), spans.data_ptr())
    library.seq2seq_additive_score(
        rows, 1, keys, size, 1.0, query.data_ptr(), projected_keys.data_ptr(),
        score_weight.data_ptr(), spans.data_ptr(), None, logits.data_ptr(),
    )  # fmt: skip
    library.seq2seq_softmax(
        rows, keys, spans.data_ptr(), logits.data_ptr(), weights.data_ptr(), keys
    )
    library.seq2seq_attention_context(
        rows, 1, keys, size, weights.data_ptr(), keys, spans.data_ptr(), memory.data_ptr(),
        context.data_ptr(), size,
    )  # fmt: skip
    # (rows, 1, keys) @ (rows, keys, size) -> (rows, size)
    expected_context = torch.bmm(expected[:, None], memory)[:, 0]
    errors = [(weights - expected).abs().max(), (context - expected_context).abs().max()]
    error = max(value.item() for value in errors)
    if not error <= 1e-5:  # also false for NaN
        raise RuntimeError(f"the compiled attention step differs from torch's by {error:.3g}")
    # seq2seq.kernels.product_attention's product scoring on the same rows: weights = softmax of
    # 0.5 q·k.
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
    loop (``seq2seq.kernels.greedy``); None where it is not found or does not compute what
    torch.addmm does (greedy decoding then steps in Python). Found once, on first call."""
    kernels = library()  # before the lock: library() takes it too
    if kernels is None:
        return None
    if "sgemm" not in _state:
        with _lock:
            if "sgemm" not in _state:
                address = _find_sgemm()
                if address is not None:
                    with float32_references():
                        address = address if _sgemm_agrees(kernels, address) else None
                _state["sgemm"] = address
    return _state["sgemm"]


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


def unavailable_reason() -> str | None:
    """Why the kernels cannot be used here (None when they can, or were never asked for)."""
    return _state.get("reason")


def usable(*tensors: Tensor | None) -> bool:
    """Whether ``gru`` / ``gru_steps`` can run on these tensors (the inputs and parameters)."""
    if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():  # type: ignore[attr-defined]
        return False
    if torch.compiler.is_compiling():
        return False
    if torch.is_autocast_enabled("cpu"):  # ATen's GRU computes in the autocast dtype, as always
        say_reference(
            "CPU autocast is on (trainer.precision=bf16-mixed or 16-mixed), and the C kernels "
            "compute outside autocast"
        )
        return False
    for tensor in tensors:
        if tensor is None:
            continue
        if tensor.device.type != "cpu":
            return False  # not said: CPU kernels stand aside on a GPU as a matter of course
        if tensor.dtype != torch.float32:
            say_reference(
                f"the model computes in {tensor.dtype} on the CPU, and the C kernels in float32"
            )
            return False
    if library() is None:
        warn_unavailable()
        return False
    return True


@functools.cache
def say_reference(reason: str) -> None:
    """Say once per process, and per ``reason``, why the kernels stand aside for a model."""
    log.info(
        "model.kernels=auto: %s, so PyTorch's own modules run there (the same model and "
        "checkpoints, at its speed).",
        reason,
    )


def warn_unavailable() -> None:
    """Say once per process that the reference modules run instead, and why."""
    if not _state.get("warned"):
        _state["warned"] = True
        warnings.warn(
            f"seq2seq's CPU kernels are unavailable ({unavailable_reason()}); the reference "
            "modules run instead (same results, slower on the CPU). To use the kernels, fix what "
            f"the parentheses say: set CC to a C compiler, {ISA_VARIABLE} to auto, avx2, avx512 "
            "or default, or XDG_CACHE_HOME to a directory where seq2seq/ can be written (the "
            f"library goes to {cache_dir()}); model.kernels=off chooses the reference and "
            "silences this warning.",
            RuntimeWarning,
            stacklevel=3,
        )
