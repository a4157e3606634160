"""seq2seq.kernels.gru and .library: the C-kernel GRU computes nn.GRU's function and gradients,
and the library builds, checks and falls back as it should.

References: ``nn.GRU`` / ``torch.gru`` themselves, run in float64 (so the comparison measures the
fused float32 path's error, not the reference's), on packed and padded batches.

Shape legend: B batch, T steps, E input size, H hidden size.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seq2seq.kernels import accelerate, gru, library, reference
from seq2seq.kernels.modules import FastDecoder, FastRNNEncoder
from tests.test_model import make_batch, make_model

needs_kernels = pytest.mark.skipif(
    library.library() is None, reason=f"no fused GRU here: {library.unavailable_reason()}"
)
LENGTHS = torch.tensor([3, 7, 1, 5])  # unsorted, with a one-token sentence
B, T, E, H = 4, 7, 6, 5


@pytest.fixture(params=["c", "c-concurrent", "python"])
def loop(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test with a layer's steps looped in C (with the library's own GEMM kernel), its
    directions one after the other and at once, and looped in Python over torch's GEMMs (where
    the C loops disagree with it)."""
    if request.param != "python" and not gru.c_loops():
        pytest.skip("the C loops are not used here: the steps loop in Python")
    if request.param == "python":
        monkeypatch.setitem(gru._state, "loops", False)
    concurrent = request.param == "c-concurrent"
    monkeypatch.setattr(gru, "_concurrent", lambda directions: concurrent and directions > 1)
    return str(request.param)


def run(
    module: nn.GRU, x: Tensor, hx: Tensor | None, layout: str, fused: bool
) -> tuple[Tensor, Tensor]:
    """Padded outputs and final states of ``module`` on ``x``, fused or ATen's. ``layout``:
    "padded" (every row all T steps) or "packed" (LENGTHS, packed)."""
    packed = layout != "padded"
    inputs = (
        pack_padded_sequence(x, LENGTHS, batch_first=module.batch_first, enforce_sorted=False)
        if packed
        else x
    )
    outputs, final = gru.gru(module, inputs, hx) if fused else module(inputs, hx)
    if packed:
        outputs, _ = pad_packed_sequence(outputs, batch_first=module.batch_first, total_length=T)
    return outputs, final


def loss_of(outputs: Tensor, final: Tensor) -> Tensor:
    """A loss that weighs every output and final-state element differently."""
    weights = torch.linspace(-1, 1, outputs.numel(), dtype=outputs.dtype).view(outputs.shape)
    return (outputs.sin() * weights).sum() + (final * final.cos()).sum()


def values_and_grads(
    module: nn.GRU, x: Tensor, hx: Tensor | None, layout: str, fused: bool
) -> list[Tensor]:
    leaves = [x, *([hx] if hx is not None else []), *module.parameters()]
    outputs, final = run(module, x, hx, layout, fused)
    grads = torch.autograd.grad(loss_of(outputs, final), leaves)
    return [outputs.detach(), final.detach(), *grads]


@needs_kernels
@pytest.mark.usefixtures("loop")
@pytest.mark.parametrize(
    ("layers", "bidirectional", "bias", "batch_first", "layout", "with_hx"),
    [
        (1, True, True, True, "packed", False),  # the encoder's case
        (2, True, True, True, "packed", True),
        (2, True, True, False, "packed", True),
        (1, False, True, False, "padded", True),
        (3, True, False, False, "padded", False),
        (2, False, True, True, "packed", True),
        (2, False, False, True, "packed", True),
        (1, True, True, False, "packed", True),
    ],
)
def test_gru_matches_nn_gru_and_its_gradients(
    layers: int, bidirectional: bool, bias: bool, batch_first: bool, layout: str, with_hx: bool
) -> None:
    torch.manual_seed(0)
    module = nn.GRU(E, H, layers, bias=bias, batch_first=batch_first, bidirectional=bidirectional)
    x = torch.randn((B, T, E) if batch_first else (T, B, E), requires_grad=True)
    hx = torch.randn(layers * (2 if bidirectional else 1), B, H) if with_hx else None
    hx = None if hx is None else hx.requires_grad_()
    got = values_and_grads(module, x, hx, layout, fused=True)
    reference = module.double()
    x64 = x.detach().double().requires_grad_()
    hx64 = None if hx is None else hx.detach().double().requires_grad_()
    expected = values_and_grads(reference, x64, hx64, layout, fused=False)
    assert len(got) == len(expected)
    for value, want in zip(got, expected, strict=True):
        torch.testing.assert_close(value.double(), want, rtol=1e-5, atol=2e-6)


@needs_kernels
@pytest.mark.usefixtures("two_threads", "loop")
def test_steps_split_over_threads_compute_the_same() -> None:
    """Steps of at least PARALLEL_MIN elements (csrc/gru.c) split their rows over torch's
    threads where the library is built with OpenMP: values and gradients still match nn.GRU."""
    torch.manual_seed(5)
    batch, length, size = 40, 6, 128  # 40 * 128 = 5120 elements per step, over the threshold
    module = nn.GRU(8, size, batch_first=True, bidirectional=True)
    x = torch.randn(batch, length, 8, requires_grad=True)
    lengths = torch.randint(1, length + 1, (batch,))
    results = []
    for fused, dtype in ((True, torch.float32), (False, torch.float64)):
        module.to(dtype)
        inputs = x.detach().to(dtype).requires_grad_()
        packed = pack_padded_sequence(inputs, lengths, batch_first=True, enforce_sorted=False)
        outputs, final = gru.gru(module, packed) if fused else module(packed)
        padded, _ = pad_packed_sequence(outputs, batch_first=True, total_length=length)
        leaves = [inputs, *module.parameters()]
        grads = torch.autograd.grad(loss_of(padded, final), leaves)
        results.append([padded.detach(), final.detach(), *grads])
    for value, want in zip(*results, strict=True):
        torch.testing.assert_close(value.double(), want, rtol=1e-5, atol=5e-6)


@needs_kernels
def test_outputs_are_zero_past_each_length_and_finals_are_each_sentences_own() -> None:
    """A short sentence's backward direction starts at its own last token, so its outputs and
    final states are those of the sentence alone."""
    torch.manual_seed(1)
    module = nn.GRU(E, H, batch_first=True, bidirectional=True)
    x = torch.randn(B, T, E)
    with torch.no_grad():
        outputs, final = run(module, x, None, "packed", fused=True)
        for row, length in enumerate(LENGTHS.tolist()):
            alone, alone_final = module(x[row : row + 1, :length])
            torch.testing.assert_close(outputs[row, :length], alone[0], rtol=1e-5, atol=1e-6)
            assert torch.all(outputs[row, length:] == 0)
            torch.testing.assert_close(final[:, row], alone_final[:, 0], rtol=1e-5, atol=1e-6)


@needs_kernels
def test_dropout_between_layers_is_applied_in_training_only() -> None:
    """With p = 1 every second-layer input is dropped, whichever implementation draws the
    mask, so fused and ATen's agree exactly in meaning; in eval mode dropout is off."""
    torch.manual_seed(2)
    module = nn.GRU(E, H, 2, dropout=1.0, batch_first=True)
    x = torch.randn(B, T, E)
    for training in (True, False):
        module.train(training)
        with torch.no_grad():
            fused, fused_final = gru.gru(module, x)
            aten, aten_final = module(x)
        torch.testing.assert_close(fused, aten, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fused_final, aten_final, rtol=1e-5, atol=1e-6)


@needs_kernels
@pytest.mark.usefixtures("loop")
def test_gru_steps_is_torch_gru_with_the_cells_parameters() -> None:
    torch.manual_seed(3)
    cell = nn.GRUCell(E, H)
    x = torch.randn(B, T, E, requires_grad=True)
    h0 = torch.randn(B, H, requires_grad=True)
    params = [cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh]
    leaves = [x, h0, *params]
    got = gru.gru_steps(x, h0, params)
    got_grads = torch.autograd.grad(got.tanh().pow(2).sum(), leaves)
    leaves64 = [leaf.detach().double().requires_grad_() for leaf in leaves]
    # torch.gru(input, hx, params, has_biases, layers, dropout, train, bidirectional, batch_first)
    x64, h64, params64 = leaves64[0], leaves64[1], leaves64[2:]
    want, _ = torch.gru(x64, h64[None], params64, True, 1, 0.0, True, False, True)
    want_grads = torch.autograd.grad(want.tanh().pow(2).sum(), leaves64)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=2e-6)
    for value, expected in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=2e-6)
    with torch.no_grad():  # inference saves nothing for backward and computes the same
        torch.testing.assert_close(gru.gru_steps(x, h0, params), got.detach())


@needs_kernels
@pytest.mark.usefixtures("loop")
def test_without_biases() -> None:
    torch.manual_seed(4)
    cell = nn.GRUCell(E, H, bias=False)
    x, h0 = torch.randn(B, T, E), torch.randn(B, H)
    with torch.no_grad():
        got = gru.gru_steps(x, h0, [cell.weight_ih, cell.weight_hh])
        want, _ = torch.gru(x, h0[None], [cell.weight_ih, cell.weight_hh], False, 1, 0.0, False,
                            False, True)  # fmt: skip
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@needs_kernels
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.usefixtures("two_threads")
def test_gru_cell_is_nn_gru_cell_and_leaves_the_state_alone(bias: bool) -> None:
    """The decoding step against ``nn.GRUCell`` in float64, fed its input projection through a
    strided view (a row of a wider table, as the token-gate rows can be); rows and size large
    enough for the pass to split over two threads, and odd-sized for the vector remainders."""
    torch.manual_seed(5)
    rows, size, inputs = 37, 131, 9
    cell = nn.GRUCell(inputs, size, bias=bias)
    x, hidden = torch.randn(rows, inputs), torch.randn(rows, size)
    wide = torch.zeros(rows, 3 * size + 7)
    wide[:, 7:] = F.linear(x, cell.weight_ih, cell.bias_ih).detach()
    input_gates = wide[:, 7:]  # row stride 3H + 7
    before = hidden.clone()
    with torch.no_grad():
        got = gru.gru_cell(input_gates, hidden, cell.weight_hh, cell.bias_hh)
    want = cell.double()(x.double(), hidden.double()).detach()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=2e-6)
    assert torch.equal(hidden, before)


@needs_kernels
@pytest.mark.parametrize("count", [1, 1023, 40_001])  # one block, a remainder, threaded blocks
@pytest.mark.usefixtures("two_threads")
def test_tanh_is_torchs_in_place(count: int) -> None:
    values = torch.linspace(-30, 30, count) * torch.rand(count)
    want = torch.tanh(values.double())
    got = gru.tanh_(values)
    assert got.data_ptr() == values.data_ptr()
    torch.testing.assert_close(got.double(), want, rtol=0, atol=5e-7)


@needs_kernels
def test_tanh_with_grad_has_tanhs_value_and_gradient() -> None:
    """In place on a layer's fresh output, as the Luong decoder uses it; float64 reference."""
    torch.manual_seed(6)
    x = (torch.randn(64, 37) * 3).requires_grad_()
    weights = torch.randn(64, 37)
    got = gru.tanh_with_grad_(x * 1.0)  # a fresh non-leaf tensor, like Linear's output
    (got_grad,) = torch.autograd.grad((got * weights).sum(), x)
    x64 = x.detach().double().requires_grad_()
    want = torch.tanh(x64)
    (want_grad,) = torch.autograd.grad((want * weights.double()).sum(), x64)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=5e-7)
    torch.testing.assert_close(got_grad.double(), want_grad, rtol=1e-5, atol=2e-6)


@needs_kernels
@pytest.mark.parametrize("decoder", ["bahdanau", "luong"])
def test_decoding_steps_the_same_with_and_without_the_kernels(decoder: str) -> None:
    """``decode_step`` without autograd: logits, states and weights of several steps agree."""
    assert_decodes_the_same(decoder)


def assert_decodes_the_same(decoder: str) -> None:
    src, src_lens, tgt_in = make_batch()
    model = make_model("general", decoder=decoder).eval()
    steps = []
    with torch.no_grad():
        for fused in (True, False):
            accelerate(model) if fused else reference(model)
            source, state = model.encode(src, src_lens)
            if fused:
                assert isinstance(model.decoder, FastDecoder)
                assert model.decoder.fused_step_applies(state[0])
            outputs = []
            for t in range(tgt_in.shape[1]):
                logits, state, weights = model.decode_step(tgt_in[:, t], state, source)
                outputs += [logits, state[0], weights]
            steps.append(outputs)
    for got, want in zip(*steps, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@needs_kernels
@pytest.mark.parametrize("decoder", ["bahdanau", "luong"])
def test_a_model_trains_the_same_with_and_without_the_kernels(decoder: str) -> None:
    """Seq2Seq's loss and every parameter's gradient, accelerated and not (dropout off, so
    both runs compute one function)."""
    assert_trains_the_same(decoder)


def assert_trains_the_same(decoder: str) -> None:
    src, src_lens, tgt_in = make_batch()
    results = []
    for fused in (True, False):
        model = make_model("dot", decoder=decoder, dropout=0.0).train()
        if fused:
            accelerate(model)
            assert isinstance(model.encoder, FastRNNEncoder)
            assert model.encoder.runs_fused(model.encoder.embedding(src))
        logits, _ = model(src, src_lens, tgt_in)
        loss = logits.log_softmax(-1).sum()
        grads = torch.autograd.grad(loss, list(model.parameters()))
        results.append([loss.detach(), *grads])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize(
    "src_lens", [[6, 4, 4, 1], [1, 4, 4, 6], [4, 6, 1, 4], [3, 3, 2, 2]], ids=str
)
def test_the_encoder_is_the_same_with_and_without_the_kernels(src_lens: list[int]) -> None:
    """The encoder's fused path (the packed tokens' rows) against nn.GRU on the packed batch:
    memory, summary and gradients, in any batch order, with padding columns past the longest
    sentence."""
    torch.manual_seed(4)
    lens = torch.tensor(src_lens)
    src = torch.randint(4, 13, (4, 7))
    src[torch.arange(7)[None, :] >= lens[:, None]] = 0
    results = []
    for fused in (True, False):
        encoder = make_model("dot", dropout=0.0).encoder.train()
        if fused:
            accelerate(encoder)
            assert isinstance(encoder, FastRNNEncoder) and encoder.runs_fused(
                encoder.embedding(src)
            )
        memory, summary = encoder(src, lens)
        grads = torch.autograd.grad(loss_of(memory, summary), list(encoder.parameters()))
        results.append([memory.detach(), summary.detach(), *grads])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)
    assert torch.all(results[0][0][lens[:, None] <= torch.arange(7)[None, :]] == 0)


def test_usable_only_for_float32_on_the_cpu_outside_exports(
    caplog: pytest.LogCaptureFixture,
) -> None:
    library.say_reference.cache_clear()
    caplog.set_level(logging.INFO, logger="seq2seq.kernels")
    x = torch.zeros(2, 3)
    if library.library() is not None:
        assert library.usable(x)
    assert not library.usable(x.double())
    assert not library.usable(x.bfloat16())
    assert not library.usable(x, torch.zeros(1, device="meta"))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16-mixed: ATen's GRU in bf16
        assert not library.usable(x)
    said = [record.getMessage() for record in caplog.records]  # once each, why
    assert len([m for m in said if "computes in torch.float64 on the CPU" in m]) == 1
    assert len([m for m in said if "CPU autocast is on" in m]) == 1


@pytest.mark.parametrize(
    ("compiler", "reason"),
    [
        ("no-such-compiler-here", "no C compiler"),
        ("false", "`false -O3 .*` failed with exit status 1: it printed nothing"),
    ],
    ids=["missing", "failing"],
)
def test_a_missing_or_failing_compiler_falls_back_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, compiler: str, reason: str
) -> None:
    monkeypatch.setattr(library, "_state", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", compiler)
    with pytest.warns(RuntimeWarning, match=f"unavailable .*{compiler}.*model.kernels=off"):
        assert not library.usable(torch.zeros(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process
        assert not library.usable(torch.zeros(1))
    assert re.search(reason, library.unavailable_reason() or "")
    model = make_model("dot", decoder="luong").train()  # still trains, on ATen's GRU
    src, src_lens, tgt_in = make_batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        logits, _ = model(src, src_lens, tgt_in)
    logits.sum().backward()
    assert not [path for path in tmp_path.rglob("*") if path.is_file()]  # nothing half-built


@needs_kernels
def test_a_compiler_error_is_reported_with_its_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(library, "SOURCES", (broken,))
    with pytest.raises(RuntimeError, match=r"failed with exit status [1-9][0-9]*: .*error"):
        library.build(tmp_path / "cache")
    assert not [path for path in (tmp_path / "cache").iterdir() if path.suffix == ".so"]


@needs_kernels
def test_the_library_is_built_once_per_source_and_flags(tmp_path: Path) -> None:
    first = library.build(tmp_path)
    built = first.stat().st_mtime_ns
    assert library.build(tmp_path) == first
    assert first.stat().st_mtime_ns == built  # reused, not rebuilt
    assert os.access(first, os.R_OK)


@needs_kernels
def test_a_failing_openmp_build_falls_back_to_one_without(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A compiler that cannot build with -fopenmp (no OpenMP runtime files) still gets the
    library, single-threaded, rather than no fused GRU at all."""
    compiler = tmp_path / "cc-without-openmp"
    compiler.write_text(
        '#!/bin/sh\ncase " $* " in *" -fopenmp "*) echo "no omp.h" >&2; exit 1;; esac\n'
        f'exec {os.environ.get("CC", "cc")} "$@"\n'
    )
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    monkeypatch.setattr(library, "torch_uses_libgomp", lambda: True)
    assert "-fopenmp" in library.compile_flags()
    built = library.build(tmp_path / "cache")
    assert [path.name for path in (tmp_path / "cache").iterdir()] == [built.name]
    library._check(library.open_library(built))  # it loads and computes torch's GRU step
    assert "-fopenmp-simd" in library.compile_flags(openmp=False)


@needs_kernels
def test_checking_the_library_leaves_the_global_random_stream_alone() -> None:
    """The load-time check runs at a run's first forward pass, after seeding: drawing from the
    global generator there would shift every later dropout mask."""
    kernels = library.library()
    assert kernels is not None
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    library._check(kernels)
    torch.testing.assert_close(torch.rand(3), expected, rtol=0, atol=0)


@needs_kernels
def test_a_blas_that_computes_something_else_is_not_used() -> None:
    """An sgemm that leaves its output alone (as one that misread its integers might) fails
    the check against torch.addmm, so greedy decoding would step in Python."""
    kernels = library.library()
    assert kernels is not None
    signature = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 13)
    does_nothing = signature(lambda *arguments: None)
    address = ctypes.cast(does_nothing, ctypes.c_void_p).value
    assert address is not None
    assert not library._sgemm_agrees(kernels, address)
    if library.blas_sgemm() is not None:
        assert library._sgemm_agrees(kernels, library.blas_sgemm())  # type: ignore[arg-type]


@needs_kernels
@pytest.mark.parametrize("size", [128, 256])  # the benchmark's encoder and decoder
def test_the_c_loops_agree_with_torchs_gemms_at_full_panels_and_row_blocks(size: int) -> None:
    """The default check runs a size with partial panels; these are whole ones, with row counts
    of whole 4-row blocks, remainders and a single row, as a packed batch of 64 has."""
    kernels = library.library()
    assert kernels is not None
    assert gru._loops_agree(kernels, size, [64, 64, 41, 8, 3, 1])


def test_no_sgemm_is_looked_for_where_torch_has_no_mkl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: False)
    assert library._find_sgemm() is None


@needs_kernels
def test_checking_the_c_loop_and_sgemm_leaves_the_global_random_stream_alone() -> None:
    kernels = library.library()
    assert kernels is not None
    address = library._find_sgemm()
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    gru._loops_agree(kernels)
    if address is not None:
        library._sgemm_agrees(kernels, address)
    torch.testing.assert_close(torch.rand(3), expected, rtol=0, atol=0)


def test_directions_run_at_once_where_torch_has_one_thread_per_direction() -> None:
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert gru._concurrent(2)
        assert not gru._concurrent(1)
        torch.set_num_threads(1)
        assert not gru._concurrent(2)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("capability", "requested", "built"),
    [
        ("AVX512", "auto", "AVX512"),
        ("AVX512", "avx2", "AVX2"),
        ("AVX512", "default", "DEFAULT"),
        ("AVX2", "auto", "AVX2"),
        ("AVX2", "avx512", "AVX2"),  # never above what torch found: no illegal instruction
        ("DEFAULT", "avx2", "DEFAULT"),
        ("ZVECTOR", "auto", "DEFAULT"),  # another architecture's: no x86 flags
    ],
)
def test_the_build_targets_torchs_instruction_set_or_a_lower_one(
    monkeypatch: pytest.MonkeyPatch, capability: str, requested: str, built: str
) -> None:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setenv(library.ISA_VARIABLE, requested)
    assert library.kernel_isa() == built
    flags = library.compile_flags()
    assert ("-mavx2" in flags) is (built != "DEFAULT")
    assert ("-mavx512f" in flags) is (built == "AVX512")


def test_an_unknown_instruction_set_is_refused_with_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(library.ISA_VARIABLE, "sse9")
    with pytest.raises(RuntimeError, match=r"SEQ2SEQ_KERNELS_ISA='sse9' .*avx2, avx512 or default"):
        library.compile_flags()


@needs_kernels
@pytest.mark.parametrize("isa", ["avx2", "default"])
def test_a_lower_build_computes_what_the_reference_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, isa: str
) -> None:
    """The library built for AVX2 only (what a CPU without AVX-512 gets), and for the compiler's
    baseline, on any x86 machine: it passes the load-time checks, and both decoders train and
    decode through it as they do without the kernels."""
    monkeypatch.setenv(library.ISA_VARIABLE, isa)
    path = library.build(tmp_path)
    assert "-mavx512f" not in library.compile_flags()
    built = library.open_library(path)
    library._check(built)
    monkeypatch.setattr(library, "_state", {"library": built})  # this build, for the models
    monkeypatch.setattr(gru, "_state", {})
    assert gru.c_loops()  # its loops agree with torch's GEMMs too
    for decoder in ("bahdanau", "luong"):
        assert_trains_the_same(decoder)
        assert_decodes_the_same(decoder)


@needs_kernels
def test_loading_inside_autocast_checks_against_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16-mixed run first asks for the kernels inside autocast (the dropout mask does): the
    load-time checks still compare with float32 references, so the library is not refused."""
    monkeypatch.setattr(library, "_state", {})
    monkeypatch.setattr(gru, "_state", {})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert library.library() is not None, library.unavailable_reason()
        assert gru.c_loops()
        library.blas_sgemm()
    assert library._state.get("sgemm") == library._find_sgemm()  # found and agreeing
