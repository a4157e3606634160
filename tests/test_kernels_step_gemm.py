"""A step loop's GEMMs (``seq2seq.kernels.step_gemm``): the C kernels' panels and torch's GEMM
compute the same products, whichever one this machine's build chooses; the loops that step
their products through them train and decode as the reference either way."""

from __future__ import annotations

import pytest
import torch

from seq2seq.kernels import library as library_module
from seq2seq.kernels import step_gemm
from seq2seq.kernels.modules import DecodingSource
from seq2seq.kernels.step_gemm import StepWeight, step_panels
from tests.test_kernels_bahdanau import PARTS, assert_composed_matches_the_reference, make_composed

pytestmark = pytest.mark.skipif(
    library_module.library() is None, reason=f"no C kernels: {library_module.unavailable_reason()}"
)


@pytest.fixture(params=[True, False], ids=["panels", "torch"])
def panels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Each choice of ``step_panels``, whatever this machine's build would choose."""
    monkeypatch.setattr(step_gemm, "step_panels", lambda: request.param)
    return bool(request.param)


def strided_rows(rows: int, columns: int, stride: int) -> torch.Tensor:
    """Every ``stride``-th row of a (rows · stride, columns) block: a padded batch's step."""
    block = torch.randn(rows * stride, columns)
    return block.as_strided((rows, columns), (stride * columns, 1))


@pytest.mark.parametrize("rows", [1, 5, 64])
@pytest.mark.parametrize("transposed", [True, False])
def test_products_match_torch(panels: bool, transposed: bool, rows: int) -> None:
    """out = rows @ B with a bias, from zero, and accumulated onto out, for a layer's weight
    (B = W^T) and a backward pass's (B = W), with strided rows in and out and a weight that
    is a column block of a wider one (W_c1 of W_c = [W_c1 W_c2])."""
    torch.manual_seed(0)
    inner, columns = 40, 70  # neither a multiple of a panel's width
    wide = torch.randn(columns, inner + 9) if transposed else torch.randn(inner, columns + 9)
    weight = wide[:, :inner] if transposed else wide[:, :columns]
    product = weight.t() if transposed else weight  # (K, N)
    step = StepWeight(weight, transposed=transposed)
    assert (step.panels is not None) == panels
    inputs = strided_rows(rows, inner, 3)
    bias = torch.randn(columns)
    out = strided_rows(rows, columns, 2)
    step.into(out, inputs, bias)
    torch.testing.assert_close(out, torch.addmm(bias, inputs, product), rtol=1e-5, atol=1e-5)
    step.into(out, inputs)
    torch.testing.assert_close(out, inputs @ product, rtol=1e-5, atol=1e-5)
    start = out.clone()
    step.into(out, inputs, accumulate=True)
    torch.testing.assert_close(out, start + inputs @ product, rtol=1e-5, atol=1e-5)


def test_rows_outside_the_product_are_untouched(panels: bool) -> None:
    """A step writes its own rows of a padded block, never the rows between them."""
    torch.manual_seed(1)
    weight = torch.randn(20, 12)
    block = torch.randn(8, 20)
    before = block.clone()
    StepWeight(weight).into(block[::2], torch.randn(4, 12))
    assert torch.equal(block[1::2], before[1::2])


def test_the_choice_follows_the_build() -> None:
    """The panels where the library is built for AVX-512, torch's GEMM elsewhere."""
    assert step_panels() == (library_module.kernel_isa() == "AVX512")


@pytest.mark.parametrize(
    ("decoder", "scoring", "parts", "input_feeding", "num_heads"),
    [
        ("bahdanau", "additive", "softmax", False, 1),
        ("bahdanau", "scaled_dot", "coverage", False, 2),
        ("luong", "general", "softmax", False, 1),
        ("luong", "additive", "sparsemax", False, 2),
        ("luong", "additive", "softmax", True, 1),
        ("luong", "dot", "coverage+sparsemax", True, 1),
        ("luong", "scaled_dot", "coverage", True, 2),
    ],
)
def test_loops_and_decoding_train_and_decode_as_the_reference_either_way(
    panels: bool, decoder: str, scoring: str, parts: str, input_feeding: bool, num_heads: int
) -> None:
    """The step loops (``bahdanau.Recurrence``, ``luong.SequentialRecurrence``, the attention's
    queries), the decoding steps (the cell's W_hh, W_ic, W_if, W_c2 and several heads' folded
    readout, packed once per batch) and the Luong greedy loop in C (``step_weight``) with each
    choice."""
    model = make_composed(scoring, PARTS[parts], decoder, input_feeding, num_heads)
    assert_composed_matches_the_reference(model)


def test_a_source_packs_its_weights_once_and_only_when_decoding(panels: bool) -> None:
    """``DecodingSource.product``: None before the decoding tables are built (teacher forcing,
    validation's forward), then one ``StepWeight`` per weight for the whole batch."""
    model = make_composed("additive", PARTS["softmax"], "bahdanau").eval()
    src, src_lens = torch.tensor([[4, 5, 6]]), torch.tensor([3])
    with torch.no_grad():
        source, state = model.encode(src, src_lens)
        weight = model.decoder.cell.weight_hh
        assert isinstance(source, DecodingSource) and source.product(weight) is None
        model.decode_step(torch.tensor([1]), state, source)
        packed = source.product(weight)
        assert packed is not None and source.product(weight) is packed
        assert (packed.panels is not None) == panels
        assert source.index_select(torch.tensor([0, 0])).product(weight) is packed


def test_no_packed_product_under_autocast_or_for_other_dtypes(panels: bool) -> None:
    """A decoding step under CPU autocast (bf16 validation) or in another dtype keeps torch's
    ops, which compute in the autocast dtype as the reference's do."""
    model = make_composed("additive", PARTS["softmax"], "bahdanau").eval()
    src, src_lens = torch.tensor([[4, 5, 6]]), torch.tensor([3])
    with torch.no_grad():
        source, state = model.encode(src, src_lens)
        model.decode_step(torch.tensor([1]), state, source)
        weight = model.decoder.cell.weight_hh
        assert isinstance(source, DecodingSource)
        assert source.product(weight, torch.zeros(1, 3, dtype=torch.bfloat16)) is None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert source.product(weight, torch.zeros(1, 3)) is None
            logits, _, _ = model.decode_step(torch.tensor([1]), state, source)
        assert logits.dtype == torch.bfloat16
