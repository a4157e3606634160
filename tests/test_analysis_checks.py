"""seq2seq.analysis.checks: every built-in part passes, and a catalogue of attentions written
with the usual bugs, as a student would write them, fails with the bug named."""

from __future__ import annotations

import importlib.util
import math
from functools import partial
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from seq2seq.analysis.checks import INTERFACE, AttentionCheckError, TargetError, check
from seq2seq.attention import AdditiveAttention, DotProductAttention, GeneralAttention
from seq2seq.normalizers import entmax15, softmax, sparsemax

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("normalizer", [softmax, sparsemax, entmax15])
def test_the_built_in_normalizers_pass(normalizer: object) -> None:
    result = check(normalizer)
    assert result.passed, result.table()


@pytest.mark.parametrize(
    "scoring",
    [
        DotProductAttention,
        partial(DotProductAttention, scaled=False),
        GeneralAttention,
        partial(AdditiveAttention, num_hiddens=16),
    ],
    ids=["scaled_dot", "dot", "general", "additive"],
)
def test_the_built_in_scoring_functions_pass(scoring: object) -> None:
    result = check(scoring)
    assert result.passed and result.kind == "scoring function", result.table()


def test_a_users_example_passes() -> None:
    path = ROOT / "examples" / "cosine_attention" / "cosine_attention.py"
    spec = importlib.util.spec_from_file_location("cosine_attention", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = check(module.CosineAttention)
    assert result.passed, result.table()


# ---- The catalogue: normalizers (logits, mask) -> weights, mask True at a real key ---------


def mask_inverted(logits: Tensor, mask: Tensor) -> Tensor:
    return torch.softmax(logits.masked_fill(mask, -1e4), dim=-1)


def softmax_over_queries(logits: Tensor, mask: Tensor) -> Tensor:
    return torch.softmax(logits.masked_fill(~mask, -1e4), dim=-2)


def minus_inf_fill(logits: Tensor, mask: Tensor) -> Tensor:
    return torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)


def fill_too_large_for_float16(logits: Tensor, mask: Tensor) -> Tensor:
    weights = torch.softmax(logits.masked_fill(~mask, -1e9), dim=-1)
    return weights * mask.any(-1, keepdim=True)  # empty rows handled: only the fill is wrong


def unmasked(logits: Tensor, mask: Tensor) -> Tensor:
    return torch.softmax(logits, dim=-1)


CATALOGUE = {
    mask_inverted: ("padded keys get weight exactly 0", "mask inverted"),
    softmax_over_queries: ("rows are non-negative and sum to 1", "softmax over the wrong axis"),
    minus_inf_fill: ("a row with no real key gives zeros, not NaN", "-inf fill"),
    fill_too_large_for_float16: ("low precision matches float64", "too large for float16"),
    unmasked: ("padded keys get weight exactly 0", "padding leaks"),
}


@pytest.mark.parametrize("broken", list(CATALOGUE), ids=lambda f: f.__name__)
def test_each_catalogued_bug_is_named(broken: object) -> None:
    prop, bug = CATALOGUE[broken]  # type: ignore[index]
    result = check(broken)
    assert not result.passed
    failed = {f.name: f for f in result.failures}
    assert prop in failed, result.table()
    assert bug in (failed[prop].bug or ""), result.table()
    if prop == INTERFACE:  # the other properties would fail for the same reason: said once
        assert len(result.failures) == 1 and result.kind == "attention module", result.table()
        assert all("not run" in f.detail for f in result.findings[1:]), result.table()
    with pytest.raises(AttentionCheckError, match=bug.split(":")[0]):
        result.raise_for_failures()


# ---- The catalogue: d2l-style modules forward(queries, keys, values, valid_lens) ---------------


class D2LScaledDot(nn.Module):
    """d2l's DotProductAttention with its masked softmax (a -1e6 fill), the weights in an
    attribute: padded keys get exactly 0 in float64, but an empty row gets uniform weights."""

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor, valid_lens: Tensor) -> Tensor:
        scores = queries @ keys.transpose(1, 2) / math.sqrt(queries.shape[-1])
        mask = torch.arange(keys.shape[1])[None, None, :] < valid_lens[:, None, None]
        self.attention_weights = torch.softmax(scores.masked_fill(~mask, -1e6), dim=-1)
        return self.attention_weights @ values


class MaskOnQueries(nn.Module):
    """The mask built along the queries' axis: padding reaches the context."""

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, valid_lens: Tensor
    ) -> tuple[Tensor, Tensor]:
        scores = queries @ keys.transpose(1, 2)
        mask = torch.arange(queries.shape[1])[None, :, None] < valid_lens[:, None, None]
        weights = torch.softmax(scores.masked_fill(~mask, -1e4), dim=-1)
        return weights @ values, weights


class BatchMixing(nn.Module):
    """Heads split with a view that crosses sentences (view instead of a transpose first)."""

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, valid_lens: Tensor
    ) -> tuple[Tensor, Tensor]:
        batch = queries.shape[0]
        mixed = queries.transpose(0, 1).reshape(batch, queries.shape[1], -1)  # wrong order
        scores = mixed @ keys.transpose(1, 2)
        mask = torch.arange(keys.shape[1])[None, None, :] < valid_lens[:, None, None]
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
        return weights @ values, weights


class UnusedParameter(D2LScaledDot):
    """A projection built and never applied."""

    def __init__(self) -> None:
        super().__init__()
        self.W_q = nn.Linear(8, 8)


class DropoutInEval(nn.Module):
    """Dropout called as a function, training=True: random in eval mode."""

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, valid_lens: Tensor
    ) -> tuple[Tensor, Tensor]:
        scores = queries @ keys.transpose(1, 2)
        mask = torch.arange(keys.shape[1])[None, None, :] < valid_lens[:, None, None]
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
        weights = nn.functional.dropout(weights, 0.5, training=True)
        return weights @ values, weights


class SummedContext(D2LScaledDot):
    """The context summed over its features: (B, Tq) instead of (B, Tq, Dv)."""

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor, valid_lens: Tensor) -> Tensor:
        return super().forward(queries, keys, values, valid_lens).sum(-1)


class NoValidLens(nn.Module):
    """Written for another interface: forward(queries, keys, values)."""

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor) -> Tensor:
        return torch.softmax(queries @ keys.transpose(1, 2), -1) @ values


class QueryInContext(nn.Module):
    """The query added to the context (a residual inside the attention): every property of the
    weights holds, but a sentence with no real key gets its queries as its context."""

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, valid_lens: Tensor
    ) -> tuple[Tensor, Tensor]:
        scores = queries @ keys.transpose(1, 2) / math.sqrt(queries.shape[-1])
        mask = torch.arange(keys.shape[1])[None, None, :] < valid_lens[:, None, None]
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
        return weights @ values + queries, weights


class LeakyDot(nn.Module):
    """No mask at all: every key, padded or not, in the softmax."""

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, valid_lens: Tensor
    ) -> tuple[Tensor, Tensor]:
        weights = torch.softmax(queries @ keys.transpose(1, 2), -1)
        return weights @ values, weights


class MaskOnQueryAxis(nn.Module):
    """The mask built from the queries' positions (B, Tq, 1), the usual way a student gets the
    axis wrong: rows of queries past the length masked, the padded keys kept."""

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, valid_lens: Tensor
    ) -> tuple[Tensor, Tensor]:
        scores = queries @ keys.transpose(1, 2)
        mask = torch.arange(queries.shape[1])[None, :, None] < valid_lens[:, None, None]
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
        return weights @ values, weights


MODULES = {
    QueryInContext: ("a row with no real key gives zeros, not NaN", "a residual"),
    MaskOnQueryAxis: ("padded keys get weight exactly 0", "the mask on the wrong axis"),
    SummedContext: (INTERFACE, "a sum, mean or reshape too many"),
    NoValidLens: (INTERFACE, "forward(queries, keys, values, valid_lens)"),
    UnusedParameter: ("gradients reach every parameter, finite", "never uses"),
    DropoutInEval: ("two calls in eval mode agree", "randomness in eval mode"),
    D2LScaledDot: ("a row with no real key gives zeros, not NaN", "uniform weights"),
    MaskOnQueries: ("padded keys get weight exactly 0", "the mask on the wrong axis"),
    LeakyDot: ("padded keys get weight exactly 0", "padding leaks"),
    BatchMixing: ("one sentence does not depend on the others", "batch mixing"),
}


@pytest.mark.parametrize("module", list(MODULES), ids=lambda m: m.__name__)
def test_each_catalogued_module_bug_is_named(module: type[nn.Module]) -> None:
    prop, bug = MODULES[module]
    result = check(module())
    failed = {f.name: f for f in result.failures}
    assert prop in failed, result.table()
    assert bug in (failed[prop].bug or ""), result.table()


class StaleKeys(DotProductAttention):
    """Caches the first batch's projected keys and serves them to every later batch."""

    def project_keys(self, keys: Tensor) -> Tensor:
        if not hasattr(self, "cached"):
            self.cached = keys
        return self.cached


def test_state_kept_between_calls_fails_inside_a_model() -> None:
    result = check(StaleKeys)
    failed = {f.name for f in result.failures}
    assert "Bahdanau: batched beam search equals one sentence at a time" in failed, result.table()


class UnsavedScale(DotProductAttention):
    """Keeps a random scale as a plain tensor attribute: not a parameter, so a checkpoint or
    bundle (its state_dict) leaves it behind and a loaded model scores with another."""

    def __init__(self, query_size: int, key_size: int) -> None:
        super().__init__(scaled=True)
        self.scale = torch.rand(()) + 0.5

    def score(self, queries: Tensor, keys: Tensor) -> Tensor:
        return super().score(queries, keys) * self.scale.to(queries.dtype)


def test_state_outside_the_state_dict_fails_once_saved_and_loaded() -> None:
    result = check(UnsavedScale)
    failed = {f.name: f for f in result.failures}
    saved = "Bahdanau: saved and loaded, the same outputs"
    assert saved in failed and "nn.Parameter or a buffer" in (failed[saved].bug or "")
    assert "Bahdanau: teacher forcing equals decoding step by step" not in failed


def test_a_normalizer_runs_inside_a_model_too() -> None:
    """softmax passes there as on its own; the in-model findings are named for what they ran."""
    names = [f.name for f in check(softmax).findings]
    assert (
        "Luong with scaled dot products: batched beam search equals one sentence at a time" in names
    )
    assert all(f.passed for f in check(softmax).findings if "with scaled dot products" in f.name)


def test_what_cannot_be_checked_is_one_paragraph() -> None:
    with pytest.raises(TargetError, match="normalizer function"):
        check(42)
    with pytest.raises(TargetError, match=r"functools\.partial"):
        check(AdditiveAttention)  # needs num_hiddens


def test_a_normalizer_that_raises_or_returns_the_wrong_shape_fails_without_a_traceback() -> None:
    def raises(logits: Tensor, mask: Tensor) -> Tensor:
        raise ValueError("not written yet")

    result = check(raises)
    assert all("raised ValueError: not written yet" in f.detail for f in result.failures)
    flat = check(lambda logits, mask: logits.flatten())
    assert "expected (1, 1, 1)" in flat.failures[0].detail


def test_the_checker_is_seq2seq_check() -> None:
    import seq2seq

    assert seq2seq.check is check and "check" in dir(seq2seq)


def test_the_result_renders_and_serializes() -> None:
    result = check(minus_inf_fill)
    assert "| a row with no real key gives zeros, not NaN | **FAIL** | -inf fill" in result.table()
    assert result._repr_markdown_() == result.table()
    assert '"passed": false' in result.to_json()


class ScalarBiasDot(DotProductAttention):
    """A learned scalar added to every score: the softmax does not see it."""

    def __init__(self, query_size: int, key_size: int) -> None:
        super().__init__(scaled=False)
        self.b = nn.Parameter(torch.zeros(()))

    def score(self, queries: Tensor, projected_keys: Tensor) -> Tensor:
        return super().score(queries, projected_keys) + self.b


def test_the_seeds_diagnostics_are_information_not_failures() -> None:
    result = check(ScalarBiasDot)
    info = {f.name: f.detail for f in result.findings if f.info}
    assert "grows as √D" in info["√d growth of the logits"]
    assert "b: changes nothing" in info["a scalar bias"]
    assert info["parameters against additive and general"].startswith("1 at D = 256")
    assert "no tanh" in info["tanh saturation"]
    assert result.passed, result.table()  # information never fails a check


def test_a_checked_module_and_the_random_state_are_left_as_they_were() -> None:
    module = D2LScaledDot().train()
    parameterised = UnusedParameter()
    state = torch.random.get_rng_state()
    check(module), check(parameterised)
    assert module.training and parameterised.W_q.weight.dtype == torch.float32
    assert torch.equal(torch.random.get_rng_state(), state)


def test_a_module_class_is_asked_for_as_an_instance() -> None:
    with pytest.raises(TargetError, match=r"give check\(\) a module built with its arguments"):
        check(D2LScaledDot)
    # With its arguments, as --init gives them on the command line: built once and checked.
    assert check(partial(MultiHead, 16, 4)).passed
    with pytest.raises(TargetError, match="could not be built with the arguments given"):
        check(partial(MultiHead, "sixteen", 4))  # nn.Linear refuses a size that is not a number


def test_a_module_of_fixed_sizes_takes_values_of_its_size() -> None:
    """nn.Linear(16, 16) for W_v, as most tutorials build it: values come at the queries' size."""
    block = MultiHead(16, 4)
    block.W_v = nn.Linear(16, 16)
    assert check(block).passed


def lengths_softmax(x: Tensor, valid_lens: Tensor) -> Tensor:
    """d2l's masked_softmax signature: lengths, not a mask."""
    return torch.softmax(x, -1)


def test_a_normalizer_of_another_signature_is_one_paragraph() -> None:
    with pytest.raises(
        TargetError, match=r"takes lengths, as d2l's masked_softmax.*mask.sum\(-1\)"
    ):
        check(lengths_softmax)
    with pytest.raises(TargetError, match="cannot be called with two arguments"):
        check(lambda logits: torch.softmax(logits, -1))


def test_a_wrong_shape_is_said_once_and_the_rest_not_run() -> None:
    result = check(lambda logits, mask: torch.softmax(logits, -1).sum(-1))
    assert [f.name for f in result.failures] == ["returns weights of the logits' shape"]
    assert "a sum, mean or reshape too many" in (result.failures[0].bug or "")
    assert all("not run" in f.detail for f in result.findings[1:7]), result.table()


def test_failures_that_follow_from_another_are_said_to() -> None:
    """An inverted mask also breaks the rows' sums; dropout in eval mode every comparison: those
    rows name the cause to fix first, and their own guess as the alternative."""
    inverted = {f.name: f for f in check(mask_inverted).failures}
    assert "mask inverted" in (inverted["padded keys get weight exactly 0"].bug or "")
    for name, finding in inverted.items():
        if name != "padded keys get weight exactly 0" and not name.startswith(
            ("Bahdanau", "Luong")
        ):
            assert (finding.bug or "").startswith("probably follows from «padded keys"), name
    random = {f.name: f for f in check(DropoutInEval()).failures}
    assert "randomness in eval mode" in (random["two calls in eval mode agree"].bug or "")
    for name in ("padding never reaches the context", "one sentence does not depend on the others"):
        if name in random:
            assert (random[name].bug or "").startswith("probably follows from «two calls"), name


def test_a_forgotten_scale_is_a_warning_in_the_verdict() -> None:
    """Information never fails a check, but a likely bug is said in the first line."""
    result = check(MultiHead(16, 4, scaled=False))
    assert result.passed and [f.name for f in result.warnings] == ["1/√d in its dot products"]
    assert "1 warning(s): 1/√d in its dot products" in result.table().splitlines()[0]
    assert not check(MultiHead(16, 4)).warnings


def test_an_empty_row_that_keeps_weights_is_named_by_what_it_shows() -> None:
    """Uniform weights on a row with no real key are a finite fill's; other weights, padding
    never masked."""
    empty = "a row with no real key gives zeros, not NaN"
    inverted = {f.name: f for f in check(mask_inverted).failures}
    assert "padding not masked" in (inverted[empty].bug or "")
    module = {f.name: f for f in check(D2LScaledDot()).failures}
    assert "uniform weights" in (module[empty].bug or "")


def mask_after_softmax(logits: Tensor, mask: Tensor) -> Tensor:
    return torch.softmax(logits, dim=-1) * mask


def test_a_mask_after_the_softmax_and_in_model_consequences_are_named() -> None:
    """Rows that sum below 1 name the mask applied after the softmax; a model built on a part
    that fails on its own blames those failures, not state kept between calls."""
    failed = {f.name: f for f in check(mask_after_softmax).failures}
    assert "masking after the softmax" in (failed["rows are non-negative and sum to 1"].bug or "")
    over_queries = {f.name: f for f in check(softmax_over_queries).failures}
    in_model = [f for name, f in over_queries.items() if "with scaled dot products" in name]
    assert in_model and all("follows from the failure" in (f.bug or "") for f in in_model)


# ---- 1/√d in a built module: read from its projections, not from its size ---------------------


class MultiHead(nn.Module):
    """h heads of scaled dot-product attention on W_q q, W_k k, W_v v, through W_o (with a bias:
    a sentence with no real key gets W_o's bias as its context); the weights the heads' average
    (as the multi-head exercise writes it); ``scaled`` False: √d forgotten."""

    def __init__(self, size: int, heads: int, scaled: bool = True) -> None:
        super().__init__()
        self.heads, self.scaled = heads, scaled
        self.W_q, self.W_k = nn.Linear(size, size), nn.Linear(size, size)
        self.W_v, self.W_o = nn.LazyLinear(size), nn.Linear(size, size)

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, valid_lens: Tensor
    ) -> tuple[Tensor, Tensor]:
        def split(x: Tensor) -> Tensor:  # (B, T, D) -> (B, h, T, d)
            return x.reshape(x.shape[0], x.shape[1], self.heads, -1).transpose(1, 2)

        q, k, v = split(self.W_q(queries)), split(self.W_k(keys)), split(self.W_v(values))
        scores = q @ k.transpose(-1, -2)  # (B, h, Tq, Tk)
        if self.scaled:
            scores = scores / math.sqrt(q.shape[-1])
        real = torch.arange(keys.shape[1]) < valid_lens.view(-1, 1, 1, 1)
        weights = torch.softmax(scores.masked_fill(~real, float("-inf")), -1).nan_to_num(0.0)
        context = (weights @ v).transpose(1, 2).flatten(2)  # (B, Tq, D)
        return self.W_o(context), weights.mean(1)


@pytest.mark.parametrize(
    ("module", "said"),
    [
        (MultiHead(16, 4), "dot products over 4 heads of d = 4, scaled by 1/√d"),
        (MultiHead(16, 4, scaled=False), "dot products over 4 heads of d = 4 without 1/√d"),
        (D2LScaledDot(), "not read while a property fails"),  # its uniform empty rows
        (DotProductAttention(scaled=False), "over 1 head of d = 8 without 1/√d"),
        (AdditiveAttention(8, 8, num_hiddens=8), "not a dot product"),
    ],
    ids=["heads", "heads without √d", "d2l", "dot", "additive"],
)
def test_a_built_module_says_whether_its_dot_products_are_scaled(
    module: nn.Module, said: str
) -> None:
    """A built module has one size, so √d is read from its projections (hooks on its linear
    layers) against each split into heads; information, never a failure."""
    result = check(module)
    info = {f.name: f.detail for f in result.findings if f.info}
    assert said in info["1/√d in its dot products"], result.table()
    if "without" in said:
        assert "√d missing?" in info["1/√d in its dot products"]
    assert "1/√d in its dot products" not in {f.name for f in result.failures}
    if not isinstance(module, D2LScaledDot):  # whose empty rows are uniform (the catalogue's)
        assert result.passed, result.table()


class D2LHeads(MultiHead):
    """d2l's multi-head block: the per-head weights (B·h, Tq, Tk) on an inner attention module,
    the context from the heads as d2l's transpose_output joins them."""

    def __init__(self, size: int, heads: int, lengths: str = "repeat_interleave") -> None:
        super().__init__(size, heads)
        self.attention = nn.Module()
        self.lengths = lengths

    def forward(  # type: ignore[override]
        self, queries: Tensor, keys: Tensor, values: Tensor, valid_lens: Tensor
    ) -> Tensor:
        h = self.heads

        def split(x: Tensor) -> Tensor:  # (B, T, D) -> (B·h, T, d), row b·h + i
            return x.reshape(x.shape[0], x.shape[1], h, -1).transpose(1, 2).flatten(0, 1)

        q, k, v = split(self.W_q(queries)), split(self.W_k(keys)), split(self.W_v(values))
        # The bug a student makes: repeat (row i·B + b) where the rows are b·h + i.
        lens = valid_lens.repeat(h) if self.lengths == "repeat" else valid_lens.repeat_interleave(h)
        real = torch.arange(keys.shape[1]) < lens[:, None, None]
        scores = (q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])).masked_fill(~real, float("-inf"))
        self.attention.attention_weights = torch.softmax(scores, -1).nan_to_num(0.0)
        context = self.attention.attention_weights @ v  # (B·h, Tq, d)
        joined = context.unflatten(0, (-1, h)).transpose(1, 2).flatten(2)  # (B, Tq, D)
        return self.W_o(joined)


def test_d2l_multi_head_weights_per_head_are_read_as_their_average() -> None:
    """d2l keeps (B·h, Tq, Tk) weights on self.attention: averaged over the heads, as read."""
    result = check(D2LHeads(16, 4))
    assert result.passed, result.table()
    failed = {f.name: f for f in check(D2LHeads(16, 4, lengths="repeat")).failures}
    assert "repeat_interleave" in (failed["padded keys get weight exactly 0"].bug or "")


class OtherLengths(nn.Module):
    """Each sentence masked with the next one's length (lengths rolled): a mask, not its own."""

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, valid_lens: Tensor
    ) -> tuple[Tensor, Tensor]:
        lens = valid_lens.roll(1)
        real = torch.arange(keys.shape[1])[None, None, :] < lens[:, None, None]
        scores = (queries @ keys.transpose(1, 2)).masked_fill(~real, float("-inf"))
        weights = torch.softmax(scores, -1).nan_to_num(0.0)
        return weights @ values, weights


def test_a_mask_of_other_sentences_lengths_is_named() -> None:
    failed = {f.name: f for f in check(OtherLengths()).failures}
    assert "other sentences' lengths" in (failed["padded keys get weight exactly 0"].bug or "")


def d2l_masked_softmax(x: Tensor, valid_lens: Tensor) -> Tensor:
    """d2l's own, with its in-place fill of the logits."""
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    lens = valid_lens.reshape(-1)
    x[~(torch.arange(shape[-1])[None, :] < lens[:, None])] = -1e6
    return torch.softmax(x.reshape(shape), dim=-1)


def wrapped(logits: Tensor, mask: Tensor) -> Tensor:
    return d2l_masked_softmax(logits, mask.sum(-1))


def test_d2l_masked_softmax_through_the_wrapper_the_message_gives() -> None:
    """The refusal names the function as Python can call it; wrapped, its in-place fill does not
    trip the check, which names its uniform empty rows."""
    with pytest.raises(TargetError, match=r"return d2l_masked_softmax\(logits, mask.sum\(-1\)\)"):
        check(d2l_masked_softmax)
    failed = {f.name: f for f in check(wrapped).failures}
    empty = failed["a row with no real key gives zeros, not NaN"]
    assert "uniform weights" in (empty.bug or ""), empty
