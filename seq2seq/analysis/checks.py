"""Check an attention written by a user: the properties that matter, on random inputs against
float64, and when one fails, the bug that fits the evidence, named (issue 69).

``check(target)`` takes a normalizer function ``(logits, mask) -> weights`` (``mask`` True at a
real key, the shape of the logits), or an attention module with the d2l interface
``forward(queries, keys, values, valid_lens)`` that returns the context, ``(context, weights)``
or the context with the weights left in an ``attention_weights`` attribute (every scoring
function of ``seq2seq.attention`` is one), or a subclass of ``seq2seq.attention.Attention``,
built at each size it is checked at. It returns a ``CheckResult``: one ``Finding`` per
property, which renders as a table (and in a notebook), and raises nothing unless asked
(``raise_for_failures``).

Each property runs over several shapes (batch 1 and many, one query and many, one key and many,
lengths mixed and equal) and seeds; a failure shows the expected and actual value at the first
bad position. Tolerances follow the dtype, as PyTorch's own attention tests set them.

Shape legend: B batch, Tq queries, Tk keys, D query and key size, V value size.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import json
import math
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from seq2seq.attention import Attention, DotProductAttention
from seq2seq.errors import Seq2SeqError

# (B, Tq, Tk, valid lengths): one of each kind the properties must hold on.
SHAPES: tuple[tuple[int, int, int, tuple[int, ...]], ...] = (
    (1, 1, 1, (1,)),
    (1, 4, 6, (6,)),
    (3, 1, 5, (5, 2, 3)),
    (4, 3, 7, (7, 1, 4, 7)),
    (2, 5, 4, (4, 4)),
)
SEEDS = (0, 1, 2)
# Tolerances per dtype against the float64 reference (rtol, atol), as PyTorch's SDPA tests use
# for its low-precision kernels.
TOLERANCES = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1.3e-6, 1e-5),
    torch.bfloat16: (1.6e-2, 2e-2),
    torch.float16: (1e-3, 2e-3),
}


@dataclass
class Finding:
    """One property's outcome: ``passed``, what was seen (``detail``: expected against actual at
    the first bad position), and where it failed, the bug that fits (``bug``, or None). An
    ``info`` finding is a diagnostic, never a failure; a ``warning`` one points to a likely bug
    that no property can call one (an unscaled dot product may be meant: Luong's dot)."""

    name: str
    passed: bool
    detail: str = ""
    bug: str | None = None
    info: bool = False
    warning: bool = False  # an info finding that points to a likely bug (√d missing?)


@dataclass
class CheckResult:
    """What ``check`` found for ``target`` (a ``kind`` of attention): its findings, in order."""

    target: str
    kind: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(f.passed for f in self.findings if not f.info)

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if not f.passed and not f.info]

    @property
    def warnings(self) -> list[Finding]:
        """The diagnostics that point to a likely bug (``Finding.warning``)."""
        return [f for f in self.findings if f.info and f.warning]

    def table(self) -> str:
        """The findings as a markdown table."""
        verdict = "every property holds" if self.passed else f"{len(self.failures)} failed"
        if self.warnings:
            verdict += f"; {len(self.warnings)} warning(s): " + "; ".join(
                f.name for f in self.warnings
            )
        lines = [
            f"**{self.target}** ({self.kind}): {verdict}",
            "",
            "| property | result | likely bug | detail |",
            "|---|---|---|---|",
        ]
        for f in self.findings:
            result = (
                "**warning**"
                if f.warning
                else "info"
                if f.info
                else ("pass" if f.passed else "**FAIL**")
            )
            lines.append(f"| {f.name} | {result} | {f.bug or ''} | {f.detail} |")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def _repr_markdown_(self) -> str:
        return self.table()

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "passed": self.passed}, indent=2)

    def raise_for_failures(self) -> None:
        """Raise ``AttentionCheckError`` naming each failed property and its likely bug."""
        if not self.passed:
            raise AttentionCheckError(self)


class AttentionCheckError(AssertionError):
    """Some property of a checked attention failed (``CheckResult.raise_for_failures``)."""

    def __init__(self, result: CheckResult) -> None:
        self.result = result
        named = "; ".join(
            f"{f.name}: {f.bug or 'see the detail'} ({f.detail})" for f in result.failures
        )
        super().__init__(f"{result.target} fails {len(result.failures)} check(s): {named}")


class TargetError(Seq2SeqError, TypeError):
    """``check`` was given something it cannot check; the message says what it accepts."""


Normalizer = Callable[[Tensor, Tensor], Tensor]


def check(target: Any, name: str | None = None) -> CheckResult:
    """Check ``target`` (module docstring): a normalizer function, an attention module, or a
    subclass of ``seq2seq.attention.Attention``. Neither ``target`` nor torch's random state is
    changed (a module is checked as a copy)."""
    with torch.random.fork_rng():
        return check_target(target, name)


def built(target: functools.partial[Any], label: str) -> nn.Module:
    """The module a partial of a module class builds, or a TargetError saying why it cannot."""
    try:
        module = target()
    except Exception as error:  # the user's constructor may raise anything
        raise TargetError(
            f"{label} could not be built with the arguments given: {type(error).__name__}: {error}"
        ) from None
    return module


def check_target(target: Any, name: str | None) -> CheckResult:
    label = name or str(getattr(target, "__qualname__", type(target).__name__))
    factory = target.func if isinstance(target, functools.partial) else target
    if isinstance(target, functools.partial) and inspect.isclass(factory):
        label = name or factory.__qualname__
    if inspect.isclass(factory) and issubclass(factory, Attention):
        # Built as the decoders build a scoring function (seq2seq.models.decoder).
        scoring: Any = target
        return check_module_factory(lambda size: scoring(query_size=size, key_size=size), label)
    if isinstance(target, nn.Module):
        # A copy: the checks cast it to float64 and switch it to eval mode.
        copied = copy.deepcopy(target)
        return check_module_factory(lambda size: copied, label, sized=False)
    if (
        isinstance(target, functools.partial)
        and inspect.isclass(factory)
        and issubclass(factory, nn.Module)
    ):  # a module class with its arguments, as the command line's --init gives them: built once
        return check_target(built(target, label), label)
    if inspect.isclass(factory) and issubclass(factory, nn.Module):
        raise TargetError(
            f"{label} is a module class: give check() a module built with its arguments (e.g. "
            f"check({label}(num_hiddens=16, num_heads=4)), or functools.partial({label}, ...)), "
            "or a subclass of seq2seq.attention.Attention, which it builds per size."
        )
    if callable(target) and not inspect.isclass(target):
        problem = normalizer_signature_problem(target, label)
        if problem is not None:
            raise TargetError(problem)
        return check_normalizer(target, label)
    raise TargetError(
        f"{label!r} is not something `check` can check: give a normalizer function "
        "(logits, mask) -> weights, an attention module (a subclass of torch.nn.Module, built) "
        "with forward(queries, keys, values, valid_lens), or a subclass of "
        "seq2seq.attention.Attention (built at each size)."
    )


# ---- Normalizers ---------------------------------------------------------------------------


def key_mask(batch: int, queries: int, keys: int, lengths: tuple[int, ...]) -> Tensor:
    """(B, Tq, Tk) bool: True at sentence b's first lengths[b] keys."""
    lens = torch.tensor(lengths)[:, None, None]
    return (torch.arange(keys)[None, None, :] < lens).expand(batch, queries, keys)


def normalizer_signature_problem(normalize: Callable[..., Any], label: str) -> str | None:
    """Why ``normalize`` cannot be called as f(logits, mask), where its signature says so: it
    takes other arguments, or lengths (d2l's ``masked_softmax(X, valid_lens)``)."""
    try:
        signature = inspect.signature(normalize)
    except (TypeError, ValueError):  # a builtin without one: its first call says
        return None
    names = list(signature.parameters)
    function = getattr(normalize, "__name__", "your_function")
    wanted = (
        "check calls a normalizer as f(logits, mask): logits (B, Tq, Tk) and mask a bool tensor "
        "of the same shape, True at a real key"
    )
    try:
        signature.bind(None, None)
    except TypeError:
        return f"{label}({', '.join(names)}) cannot be called with two arguments: {wanted}."
    if len(names) > 1 and "len" in names[1].lower():
        return (
            f"{label}({', '.join(names)}) takes lengths, as d2l's masked_softmax(X, valid_lens) "
            f"does; {wanted}. Check it through a function that turns the mask into lengths, "
            f"e.g. def masked(logits, mask): return {function}(logits, mask.sum(-1)) in your "
            "file "
            "(each row's number of real keys), then check that function."
        )
    return None


def check_normalizer(normalize: Normalizer, label: str) -> CheckResult:
    """The normalizer's properties on its own, then inside each RNN decoder's scaled dot-product
    attention (``NormalizedBy``)."""
    findings = normalizer_findings(normalize)
    if not findings[0].passed:  # the wrong shape: a model could not even be built on it
        return CheckResult(label, "normalizer", findings)
    findings += consequences(
        model_findings(lambda size: NormalizedBy(normalize), "with scaled dot products"), findings
    )
    return CheckResult(label, "normalizer", findings)


class NormalizedBy(DotProductAttention):
    """Scaled dot-product attention whose weights are a user's normalizer's: f(logits, mask),
    the mask (B, Tq, Tk) True at each row's real keys (what ``check`` gives f on its own)."""

    def __init__(self, normalizer: Normalizer) -> None:
        super().__init__(scaled=True)
        self.normalizer = normalizer

    def normalize(
        self,
        logits: Tensor,
        queries: Tensor,
        valid_lens: Tensor | None,
        positions: Tensor | None = None,
    ) -> Tensor:
        keys = torch.arange(logits.shape[-1], device=logits.device)  # (Tk,)
        if valid_lens is None:
            mask = torch.ones_like(logits, dtype=torch.bool)
        else:  # (B,) or (B, Tq) -> (B, Tq, Tk)
            lens = valid_lens[:, None, None] if valid_lens.dim() == 1 else valid_lens[..., None]
            mask = (keys < lens).expand(logits.shape)
        return self.normalizer(logits, mask)


def normalizer_findings(weights_of: Callable[[Tensor, Tensor], Tensor]) -> list[Finding]:
    """The properties of weights = f(logits, mask) over ``SHAPES`` and ``SEEDS``."""
    shape = attempt(NORMALIZER_SHAPE, lambda: shape_finding(weights_of))
    if not shape.passed:  # every other property would fail the same way: say it once
        if shape.bug is None:
            shape.bug = (
                "the weights have the logits' shape (B, Tq, Tk), normalized over the keys (the "
                "last axis): a sum, mean or reshape too many"
            )
        return [shape, *(Finding(name, False, "not run: the shape above is wrong", info=True)
                         for name in NORMALIZER_PROPERTIES)]  # fmt: skip
    findings = [
        shape,
        attempt("padded keys get weight exactly 0", lambda: padding_finding(weights_of)),
        attempt("rows are non-negative and sum to 1", lambda: normalized_finding(weights_of)),
        attempt("a row with no real key gives zeros, not NaN", lambda: empty_finding(weights_of)),
        attempt("more padding changes nothing", lambda: more_padding_finding(weights_of)),
        attempt("permuting the keys permutes the weights", lambda: permutation_finding(weights_of)),
        attempt("low precision matches float64", lambda: dtype_finding(weights_of)),
    ]
    return ranked(findings)


NORMALIZER_SHAPE = "returns weights of the logits' shape"
NORMALIZER_PROPERTIES = (
    "padded keys get weight exactly 0", "rows are non-negative and sum to 1",
    "a row with no real key gives zeros, not NaN", "more padding changes nothing",
    "permuting the keys permutes the weights", "low precision matches float64",
)  # fmt: skip
# A failed property (first) and the properties its bug makes fail too, most fundamental first:
# where the first fails, the others' failures are said to follow from it, so that a student
# fixes the cause before chasing its echoes (dropout in eval mode breaks every comparison; an
# inverted mask, the sums and the empty rows; sentences mixed, the padding they bring along).
ECHOES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("two calls in eval mode agree", (
        "rows are non-negative and sum to 1", "padding never reaches the context",
        "one sentence does not depend on the others", "low precision and autocast match float64",
    )),
    ("padded keys get weight exactly 0", (
        "rows are non-negative and sum to 1", "a row with no real key gives zeros, not NaN",
        "more padding changes nothing", "permuting the keys permutes the weights",
        "padding never reaches the context",
    )),
    ("one sentence does not depend on the others", (
        "padding never reaches the context", "a row with no real key gives zeros, not NaN",
    )),
    ("padding never reaches the context", ("a row with no real key gives zeros, not NaN",)),
)  # fmt: skip


def ranked(findings: list[Finding]) -> list[Finding]:
    """``findings`` with each failure that a more fundamental failure explains (``ECHOES``) said
    to follow from it, its own likely bug kept as the alternative."""
    by_name = {finding.name: finding for finding in findings}
    echoes: set[str] = set()
    for cause, effects in ECHOES:
        if cause in echoes or cause not in by_name or by_name[cause].passed:
            continue
        for effect in effects:
            finding = by_name.get(effect)
            if finding is None or finding.passed or finding.info or effect in echoes:
                continue
            echoes.add(effect)
            own = f" (if not: {finding.bug})" if finding.bug else ""
            finding.bug = f"probably follows from «{cause}»: fix that first{own}"
    return findings


def attempt(name: str, run: Callable[[], Finding]) -> Finding:
    """``run``'s finding, named; an exception from the user's code is a failure that says what
    it was, never a traceback."""
    try:
        finding = run()
    except Exception as error:  # the user's code may raise anything
        message = f"{type(error).__name__}: {error}".splitlines()[0][:300] + users_line(error)
        bug = None
        if "overflow" in message and "Half" in message:
            bug = "a fixed fill too large for float16 (e.g. -1e9): use torch.finfo(dtype).min"
        return Finding(name, False, f"raised {message}", bug)
    finding.name = name
    return finding


# Where a traceback's frames are not the user's: torch's and this package's own files.
NOT_THE_USERS = (str(Path(torch.__file__).parent), str(Path(__file__).parents[1]))


def users_line(error: BaseException) -> str:
    """ " (FILE, line N)" of the last frame of the traceback in the user's own code, or ""."""
    frames = [
        frame for frame in traceback.extract_tb(error.__traceback__)
        if not frame.filename.startswith(NOT_THE_USERS)
    ]  # fmt: skip
    return f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


def cases(dtype: torch.dtype = torch.float64) -> Iterator[tuple[Tensor, Tensor]]:
    """(logits (B, Tq, Tk), mask) over the shapes and seeds."""
    for batch, queries, keys, lengths in SHAPES:
        for seed in SEEDS:
            generator = torch.Generator().manual_seed(seed)
            logits = torch.randn(batch, queries, keys, generator=generator, dtype=torch.float64)
            yield (logits * 3).to(dtype), key_mask(batch, queries, keys, lengths)


def first_bad(bad: Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in bad.nonzero()[0])


def shape_finding(weights_of: Callable[[Tensor, Tensor], Tensor]) -> Finding:
    for logits, mask in cases():
        weights = weights_of(logits, mask)
        if not isinstance(weights, Tensor) or weights.shape != logits.shape:
            got = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
            return Finding("", False, f"expected {tuple(logits.shape)}, got {got}", None)
    return Finding("", True)


def padding_finding(weights_of: Callable[[Tensor, Tensor], Tensor]) -> Finding:
    outputs = [(weights_of(logits, mask), mask) for logits, mask in cases()]
    for weights, mask in outputs:
        padded = ~mask & (weights != 0)
        if padded.any():
            where = first_bad(padded)
            row = where[:-1]
            real = float(weights[row][mask[row]].abs().sum())  # the row's real keys' mass
            bug = (
                "padding leaks: padded keys are not masked (with heads, or the lengths repeated "
                "where rows b·h + i need repeat_interleave)"
            )
            if real < 1e-6:
                bug = "mask inverted: real keys get 0 and padded keys the weight"
            elif any(foreign_lengths(w, m) for w, m in outputs):
                bug = (
                    "a mask, but of other sentences' lengths: some rows' weights stop at a length "
                    "not their own (with heads, lengths repeated with repeat where rows b·h + i "
                    "need repeat_interleave)"
                )
            elif any(silent_rows(w, m).any() for w, m in outputs):
                bug = (
                    "the mask on the wrong axis: it masks the queries past a sentence's length "
                    "(their rows are all 0, or all alike) instead of its padded keys; build it "
                    "(B, 1, Tk) from the keys' positions"
                )
            return Finding(
                "", False, f"expected 0 at {where}, got {float(weights[where]):.4g}", bug
            )
    return Finding("", True)


def foreign_lengths(weights: Tensor, mask: Tensor) -> bool:
    """Whether some sentence's weights stop, in every row alike, at another sentence's length
    (exact zeros from there on) instead of its own: a mask built from the wrong lengths.
    weights, mask (B, Tq, Tk)."""
    keys = weights.shape[-1]
    # Each row's first position of its trailing run of exact zeros (Tk where it has none).
    trailing = (weights == 0).flip(-1).int().cumprod(-1).sum(-1)  # (B, Tq)
    stops = keys - trailing
    own = mask[:, 0].sum(-1)  # (B,)
    for b in range(weights.shape[0]):
        stop = int(stops[b, 0])
        others = {int(own[c]) for c in range(weights.shape[0]) if c != b}
        if (stops[b] == stop).all() and 0 < stop < keys and stop != own[b] and stop in others:
            return True
    return False


def silent_rows(weights: Tensor, mask: Tensor) -> Tensor:
    """(B, Tq): rows with a real key whose weights are all 0, or the same over every key, real
    and padded (a finite fill on the whole row): what a mask along the queries' axis leaves the
    queries past a sentence's length."""
    flat = (weights.amax(-1) - weights.amin(-1) == 0) & (weights.shape[-1] > 1)
    return mask.any(-1) & ((weights.abs().sum(-1) == 0) | flat)


def normalized_finding(weights_of: Callable[[Tensor, Tensor], Tensor]) -> Finding:
    for logits, mask in cases():
        weights = weights_of(logits, mask)
        rows = mask.any(-1)  # (B, Tq): rows with a real key
        sums = weights.sum(-1)
        if (weights < 0).any():
            where = first_bad(weights < 0)
            return Finding("", False, f"expected >= 0 at {where}, got {float(weights[where]):.4g}")
        off = rows & ((sums - 1).abs() > 1e-6)
        if off.any():
            where = first_bad(off)
            bug = None
            column_sums = weights.sum(-2)
            if weights.shape[-2] > 1 and torch.allclose(column_sums, torch.ones_like(column_sums)):
                bug = "softmax over the wrong axis: the columns (queries, dim=-2) sum to 1"
            elif float(sums[where]) < 1:
                bug = (
                    "weights not renormalized over the real keys: masking after the softmax "
                    "(weights * mask) drops the padded keys' share; mask the logits before it"
                )
            else:
                bug = "the weights are not normalized over the real keys of the row"
            return Finding(
                "", False, f"row {where} sums to {float(sums[where]):.6g}, expected 1", bug
            )
    return Finding("", True)


def empty_finding(weights_of: Callable[[Tensor, Tensor], Tensor]) -> Finding:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    mask = key_mask(2, 3, 5, (5, 0))
    # A copy the user's code may write into (d2l's X[~mask] = value), the gradient still ours.
    weights = weights_of(logits.clone(), mask)
    if not torch.isfinite(weights).all():
        return Finding(
            "", False, f"row (1, 0) of a sentence with no real key is {weights[1, 0].tolist()}",
            "-inf fill: a row with every key masked is softmax of -inf only, NaN",
        )  # fmt: skip
    if (weights[1] != 0).any():
        return kept_weight_finding(weights[1, 0])
    (grad,) = torch.autograd.grad(weights.sin().sum(), logits)
    if not torch.isfinite(grad).all():
        return Finding("", False, "the gradient is not finite", "NaN gradient through a -inf fill")
    return Finding("", True)


def kept_weight_finding(row: Tensor) -> Finding:
    """The failure of a row with no real key that still has weights, and what they point to:
    uniform weights are a finite fill's (every logit the same fill); others, padding that was
    never masked."""
    row = row.detach()
    bug = "padding not masked (or the mask inverted): a row with no real key still has weights"
    if torch.allclose(row, row.mean().expand_as(row)):
        bug = (
            "a finite fill (e.g. -1e6) on a row with no real key gives it uniform weights: "
            "zero the row after the softmax"
        )
    return Finding("", False, f"expected zeros, got {[round(float(w), 4) for w in row]}", bug)


def more_padding_finding(weights_of: Callable[[Tensor, Tensor], Tensor]) -> Finding:
    for logits, mask in cases():
        weights = weights_of(logits, mask)
        extra = torch.randn(*logits.shape[:2], 3, dtype=logits.dtype) * 10  # 3 more padded keys
        wider = torch.cat([mask, mask.new_zeros(*mask.shape[:2], 3)], -1)
        padded = weights_of(torch.cat([logits, extra], -1), wider)[..., : logits.shape[-1]]
        bad = ~torch.isclose(padded, weights, rtol=1e-6, atol=1e-9)
        if bad.any():
            where = first_bad(bad)
            return Finding(
                "", False, f"at {where} {float(weights[where]):.6g} became "
                f"{float(padded[where]):.6g} with 3 more padded keys",
                "padding leaks: padded keys take part in the normalization",
            )  # fmt: skip
    return Finding("", True)


def permutation_finding(weights_of: Callable[[Tensor, Tensor], Tensor]) -> Finding:
    for logits, mask in cases():
        keys = logits.shape[-1]
        order = torch.randperm(keys, generator=torch.Generator().manual_seed(keys))
        full = mask.all()  # permute only where every key is real: padding stays at the end
        if not full:
            continue
        weights = weights_of(logits, mask)
        permuted = weights_of(logits[..., order], mask[..., order])
        bad = ~torch.isclose(permuted, weights[..., order], rtol=1e-6, atol=1e-9)
        if bad.any():
            where = first_bad(bad)
            return Finding(
                "", False, f"at {where} expected {float(weights[..., order][where]):.6g}, "
                f"got {float(permuted[where]):.6g}", "the weights depend on the keys' positions",
            )  # fmt: skip
    return Finding("", True)


def dtype_finding(weights_of: Callable[[Tensor, Tensor], Tensor]) -> Finding:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        rtol, atol = TOLERANCES[dtype]
        for logits, mask in cases():
            reference = weights_of(logits, mask)
            weights = weights_of(logits.to(dtype), mask)
            if not torch.isfinite(weights).all():
                where = first_bad(~torch.isfinite(weights))
                return Finding(
                    "", False, f"{dtype} gives {float(weights[where])} at {where}",
                    "a fill or constant that overflows in low precision",
                )  # fmt: skip
            bad = ~torch.isclose(weights.double(), reference, rtol=rtol, atol=atol)
            if bad.any():
                where = first_bad(bad)
                return Finding(
                    "", False, f"{dtype} at {where}: expected {float(reference[where]):.6g}, "
                    f"got {float(weights[where]):.6g}",
                )  # fmt: skip
    return Finding("", True)


# ---- Attention modules ---------------------------------------------------------------------


def check_module_factory(
    build: Callable[[int], nn.Module], label: str, sized: bool = True
) -> CheckResult:
    """The module's properties; ``build(D)`` gives it for queries and keys of size D (the same
    module every time where it is not ``sized``: an attention module; where it is, a scoring
    function built at each size)."""
    result = CheckResult(label, "scoring function" if sized else "attention module")
    try:
        module = build(8)
    except Exception as error:
        raise TargetError(
            f"{label} could not be built for queries and keys of size 8: "
            f"{type(error).__name__}: {error}. An Attention subclass is built as "
            "Cls(query_size=D, key_size=D): give its other arguments (--init num_hiddens=16 "
            "on the command line, functools.partial(AdditiveAttention, num_hiddens=16) in "
            "Python), or a built module."
        ) from error
    size = 8 if sized else module_size(module)
    module = module.double().eval()
    result.findings += attention_findings(module, size, scoring=sized)
    if not sized and result.passed:
        result.findings.append(attempt(SCALE, lambda: scale_info(module, size)))
    elif not sized and result.findings[0].passed:  # its weights cannot be read as intended
        result.findings.append(
            Finding(SCALE, True, "not read while a property fails: fix those first", info=True)
        )
    if sized and result.findings[0].passed:
        result.findings += [
            attempt("√d growth of the logits", lambda: growth_info(build)),
            attempt("tanh saturation", lambda: saturation_info(build)),
            attempt("a scalar bias", lambda: scalar_bias_info(build)),
            attempt("parameters against additive and general", lambda: parameters_info(build)),
        ]
        result.findings += consequences(model_findings(build), result.findings)
    return result


# ---- Inside a model built with it ------------------------------------------------------------

BOS, EOS, PAD = 2, 3, 0  # seq2seq.data.tokenization's ids


def consequences(in_model: list[Finding], own: list[Finding]) -> list[Finding]:
    """``in_model`` with each failure's likely bug pointing at the part's own failures where it
    has any: a model built on a part that fails on its own fails for that reason first (a
    softmax over the wrong axis breaks decoding too; no state is to blame)."""
    failed = [finding.name for finding in own if finding.passed is False]
    if not failed:
        return in_model
    cause = f"follows from the failure(s) above ({'; '.join(failed)}): fix those first"
    return [
        dataclasses.replace(finding, bug=cause) if finding.passed is False else finding
        for finding in in_model
    ]


def model_findings(build: Callable[[int], nn.Module], how: str = "") -> list[Finding]:
    """A scoring function (``how``: in what) inside each RNN decoder (small random models,
    float64, eval mode): teacher forcing equals stepping ``decode_step`` on the same tokens,
    batched beam search over sources of mixed lengths equals one sentence at a time, and the
    model saved as a bundle and a checkpoint save it (its ``state_dict``) and loaded into
    another gives the same outputs."""
    from seq2seq.models.decoder import BahdanauDecoder, LuongDecoder

    findings = []
    for decoder in (BahdanauDecoder, LuongDecoder):
        name = decoder.__name__.removesuffix("Decoder") + (f" {how}" if how else "")
        findings += [
            attempt(f"{name}: teacher forcing equals decoding step by step",
                    functools.partial(in_model, stepping_finding, build, decoder)),
            attempt(f"{name}: batched beam search equals one sentence at a time",
                    functools.partial(in_model, beam_finding, build, decoder)),
            attempt(f"{name}: saved and loaded, the same outputs",
                    functools.partial(saved_finding, build, decoder)),
        ]  # fmt: skip
    return findings


def in_model(
    finding: Callable[[Any], Finding], build: Callable[[int], nn.Module], decoder: type
) -> Finding:
    """``finding`` of a ``small_model`` (built inside ``attempt``: building may raise too)."""
    return finding(small_model(build, decoder))


def small_model(build: Callable[[int], nn.Module], decoder: type, seed: int = 0) -> nn.Module:
    """A random Seq2Seq (float64, eval mode) whose ``decoder`` attends with ``build``'s module,
    built for the decoder's state size (16: the memory's too), from ``seed``."""
    from seq2seq.models.model import Seq2Seq

    def scoring(query_size: int, key_size: int) -> Any:
        return build(query_size)

    torch.manual_seed(seed)
    model = Seq2Seq(
        src_vocab_size=13, tgt_vocab_size=11, attention=scoring, embedding_size=8,
        hidden_size=16, dropout=0.0, decoder=decoder,
    )  # fmt: skip
    return model.double().eval()


def model_batch() -> tuple[Tensor, Tensor, Tensor]:
    """src (B, S) of mixed lengths, src_lens (B,) and tgt_in (B, T) starting with BOS."""
    generator = torch.Generator().manual_seed(0)
    src_lens = torch.tensor([7, 3, 5, 1])
    src = torch.randint(4, 13, (4, 7), generator=generator)
    src[torch.arange(7)[None, :] >= src_lens[:, None]] = PAD
    tgt_in = torch.randint(4, 11, (4, 6), generator=generator)
    tgt_in[:, 0] = BOS
    return src, src_lens, tgt_in


def stepping_finding(model: Any) -> Finding:
    src, src_lens, tgt_in = model_batch()
    with torch.no_grad():
        forced, _ = model(src, src_lens, tgt_in)  # (B, T, V)
        source, state = model.encode(src, src_lens)
        for t in range(tgt_in.shape[1]):
            logits, state, _ = model.decoder.decode_step(tgt_in[:, t], state, source)
            bad = ~torch.isclose(logits, forced[:, t], rtol=1e-6, atol=1e-9)
            if bad.any():
                where = (*first_bad(bad)[:1], t, *first_bad(bad)[1:])
                return Finding(
                    "", False, f"logit {where}: teacher forcing {float(forced[where]):.6g}, "
                    f"a step {float(logits[where[0], where[2]]):.6g}",
                    "state kept in the module between calls, or a mask that sees the future",
                )  # fmt: skip
    return Finding("", True)


def saved_finding(build: Callable[[int], nn.Module], decoder: type) -> Finding:
    """A model's ``state_dict`` through safetensors (a bundle's format; a checkpoint pickles the
    same dict) into a model built from another seed: the teacher-forced logits are the same
    where every tensor the attention reads is a parameter or a persistent buffer."""
    from safetensors.torch import load, save

    src, src_lens, tgt_in = model_batch()
    saved, other = small_model(build, decoder), small_model(build, decoder, seed=1)
    state = {key: value.detach().clone().contiguous() for key, value in saved.state_dict().items()}
    other.load_state_dict(load(save(state)))
    with torch.no_grad():
        before, _ = saved(src, src_lens, tgt_in)  # (B, T, V)
        after, _ = other(src, src_lens, tgt_in)
    bad = ~torch.isclose(after, before, rtol=1e-9, atol=1e-12)
    if bad.any():
        where = first_bad(bad)
        return Finding(
            "", False, f"logit {where}: before saving {float(before[where]):.6g}, after "
            f"loading {float(after[where]):.6g}",
            "a tensor the attention reads that is neither a parameter nor a persistent buffer "
            "(a plain tensor attribute, register_buffer(..., persistent=False)): a checkpoint or "
            "bundle loses it; make it an nn.Parameter or a buffer",
        )  # fmt: skip
    return Finding("", True)


def beam_finding(model: Any) -> Finding:
    from seq2seq.search import beam_search

    src, src_lens, _ = model_batch()
    with torch.no_grad():
        batched = beam_search(model, src, src_lens, BOS, EOS, PAD, beam_size=3, max_len_b=4).best
        for b in range(src.shape[0]):
            length = int(src_lens[b])
            alone = beam_search(
                model, src[b : b + 1, :length], src_lens[b : b + 1], BOS, EOS, PAD,
                beam_size=3, max_len_b=4,
            ).best  # fmt: skip
            tokens = batched.tokens[b, : int(batched.lengths[b])]
            single = alone.tokens[0, : int(alone.lengths[0])]
            if not torch.equal(tokens, single):
                return Finding(
                    "", False, f"sentence {b}: batched {tokens.tolist()}, alone {single.tolist()}",
                    "padding or another sentence reaches a hypothesis (masks or states "
                    "repeated in the wrong order for the beams)",
                )  # fmt: skip
    return Finding("", True)


def module_size(module: nn.Module) -> int:
    """The query size a built module takes: its first linear layer's input, else 8."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear | nn.LazyLinear) and not isinstance(layer, nn.LazyLinear):
            return int(layer.in_features)
    return 8


def run_module(
    module: nn.Module, queries: Tensor, keys: Tensor, values: Tensor, lens: Tensor
) -> tuple[Tensor, Tensor]:
    """(context, weights) of a d2l-interface module (module docstring's three forms)."""
    out = module(queries, keys, values, lens)
    if isinstance(out, tuple) and len(out) == 2:
        return out[0], heads_averaged(out[1], queries.shape[0])
    # d2l's multi-head block keeps them on its inner attention (self.attention.attention_weights).
    weights = next(
        (found for part in module.modules()
         if isinstance(found := getattr(part, "attention_weights", None), Tensor)),
        None,
    )  # fmt: skip
    if not isinstance(out, Tensor) or weights is None:
        raise TargetError(
            "forward returned neither (context, weights) nor a context with the weights in "
            "an attention_weights attribute"
        )
    return out, heads_averaged(weights, queries.shape[0])


def heads_averaged(weights: Tensor, batch: int) -> Tensor:
    """Several heads' weights (B·h, Tq, Tk), d2l's layout (row b·h + i: head i of sentence b),
    as their average (B, Tq, Tk), what the decoders read; other weights as they are."""
    rows = weights.shape[0] if weights.dim() == 3 else 0
    if weights.dim() != 3 or rows == batch or batch == 0 or rows % batch:
        return weights
    return weights.view(batch, rows // batch, *weights.shape[1:]).mean(dim=1)


def module_cases(
    size: int, batch_at_least: int = 1
) -> Iterator[tuple[Tensor, Tensor, Tensor, Tensor]]:
    """(queries, keys, values, valid_lens) over the shapes (of ``batch_at_least`` sentences or
    more) and seeds, float64."""
    for batch, queries, keys, lengths in SHAPES:
        if batch < batch_at_least:
            continue
        for seed in SEEDS:
            generator = torch.Generator().manual_seed(seed)
            q = torch.randn(batch, queries, size, generator=generator, dtype=torch.float64)
            k = torch.randn(batch, keys, size, generator=generator, dtype=torch.float64)
            v = torch.randn(batch, keys, size, generator=generator, dtype=torch.float64)
            yield q, k, v, torch.tensor(lengths)


def attention_findings(module: nn.Module, size: int, scoring: bool = False) -> list[Finding]:
    """Every module property; ``scoring``: the module is a scoring function (an ``Attention``
    subclass), whose interface is its ``score``."""

    def run(q: Tensor, k: Tensor, v: Tensor, lens: Tensor) -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            return run_module(module, q, k, v, lens)

    def as_normalizer(finding: Callable[[Callable[[Tensor, Tensor], Tensor]], Finding]) -> Finding:
        return finding(lambda logits, mask: mask_weights(run, size, mask))

    interface = attempt(INTERFACE, lambda: interface_finding(run, size))
    if not interface.passed and interface.bug is None and scoring:  # it raised
        interface.bug = (
            "score(queries (B, Tq, D), projected_keys (B, Tk, K)) returns the scores (B, Tq, "
            "Tk), which the Attention base class masks, normalizes and averages: a transpose "
            "or reshape too many in score, or projected keys of another size"
        )
    elif not interface.passed and interface.bug is None:  # it raised
        interface.bug = (
            "forward raised at the line shown: the check calls forward(queries, keys, values, "
            "valid_lens) and reads (context, weights), or the context and an "
            "attention_weights attribute (d2l's interface)"
        )
    if not interface.passed:  # every other property would fail the same way: say it once
        return [interface, *(Finding(name, False, "not run: the interface above failed", info=True)
                             for name in MODULE_PROPERTIES)]  # fmt: skip
    return ranked([
        interface,
        attempt("padded keys get weight exactly 0", lambda: as_normalizer(padding_finding)),
        attempt("rows are non-negative and sum to 1", lambda: as_normalizer(normalized_finding)),
        attempt("a row with no real key gives zeros, not NaN", lambda: module_empty(module, size)),
        attempt("padding never reaches the context", lambda: leak_finding(run, size)),
        attempt("one sentence does not depend on the others", lambda: batch_finding(run, size)),
        attempt("low precision and autocast match float64", lambda: module_dtypes(module, size)),
        attempt("gradients reach every parameter, finite", lambda: module_gradients(module, size)),
        attempt("two calls in eval mode agree", lambda: module_repeats(run, size)),
    ])  # fmt: skip


INTERFACE = "forward(q, k, v, valid_lens) gives a context (B, Tq, ·), weights (B, Tq, Tk)"
MODULE_PROPERTIES = (
    "padded keys get weight exactly 0", "rows are non-negative and sum to 1",
    "a row with no real key gives zeros, not NaN", "padding never reaches the context",
    "one sentence does not depend on the others", "low precision and autocast match float64",
    "gradients reach every parameter, finite", "two calls in eval mode agree",
)  # fmt: skip


def interface_finding(
    run: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]], size: int
) -> Finding:
    """One call on 4 sentences: the context and weights come back in their shapes (the
    context's last size is the module's own: Dv, or an output projection's)."""
    batch, queries, keys, _ = SHAPES[3]
    q, k, v, lens = next(
        case for case in module_cases(size) if case[0].shape[:2] == (batch, queries)
    )
    context, weights = run(q, k, v, lens)
    last = context.shape[-1] if context.dim() == 3 else v.shape[-1]
    wanted = {"context": (batch, queries, last), "weights": (batch, queries, keys)}
    got = {"context": tuple(context.shape), "weights": tuple(weights.shape)}
    wrong = [name for name in wanted if got[name] != wanted[name]]
    if not wrong:
        return Finding(INTERFACE, True)
    bug = (
        "the context is weights @ values (then any output projection), (B, Tq, ·): a sum, "
        "mean or reshape too many, or the weights multiplied with the keys"
        if "context" in wrong
        else "the weights are the scores of the queries against the keys, normalized over the "
        "keys: (B, Tq, Tk)"
    )
    detail = "; ".join(f"{name}: expected {wanted[name]}, actual {got[name]}" for name in wrong)
    return Finding(
        INTERFACE, False, f"{detail} (queries {tuple(q.shape)}, keys {tuple(k.shape)}, values "
        f"{tuple(v.shape)})", bug,
    )  # fmt: skip


def module_dtypes(module: nn.Module, size: int) -> Finding:
    """The context in float32, bfloat16 and float16 (the module cast), and float32 under CPU
    autocast to bfloat16, against float64, at each dtype's tolerance."""
    q, k, v, lens = next(module_cases(size, batch_at_least=2))
    with torch.no_grad():
        reference, _ = run_module(module, q, k, v, lens)
        for dtype, autocast in (
            (torch.float32, False), (torch.bfloat16, False), (torch.float16, False),
            (torch.float32, True),
        ):  # fmt: skip
            copied = copy.deepcopy(module).to(dtype)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                context, _ = run_module(copied, q.to(dtype), k.to(dtype), v.to(dtype), lens)
            label = "float32 under autocast (bfloat16)" if autocast else str(dtype)
            if not torch.isfinite(context).all():
                return Finding(
                    "", False, f"{label} gives a context that is not finite",
                    "a fill or constant that overflows in low precision (-1e9 in float16)",
                )  # fmt: skip
            rtol, atol = TOLERANCES[torch.bfloat16 if autocast else dtype]
            # A product over D terms rounds D times: its tolerance grows with √D.
            atol *= math.sqrt(size)
            bad = ~torch.isclose(context.double(), reference, rtol=rtol, atol=atol)
            if bad.any():
                where = first_bad(bad)
                return Finding(
                    "", False, f"{label} at {where}: expected {float(reference[where]):.6g}, "
                    f"got {float(context[where]):.6g}",
                )  # fmt: skip
    return Finding("", True)


def module_gradients(module: nn.Module, size: int) -> Finding:
    """Every parameter gets a finite gradient from the context (training mode, dropout off)."""
    copied = copy.deepcopy(module).train()
    for layer in copied.modules():
        if isinstance(layer, nn.Dropout):
            layer.p = 0.0
    q, k, v, lens = next(module_cases(size, batch_at_least=2))
    inputs = {"queries": q, "keys": k, "values": v}
    for tensor in inputs.values():
        tensor.requires_grad_()
    context, _ = run_module(copied, q, k, v, lens)
    context.sin().sum().backward()
    for name, tensor in inputs.items():
        if tensor.grad is None or not torch.isfinite(tensor.grad).all():
            return Finding(
                "", False, f"the {name}' gradient is missing or not finite", "NaN gradient"
            )
    for name, parameter in copied.named_parameters():
        if parameter.grad is None:
            return Finding(
                "", False, f"{name} gets no gradient",
                "a parameter the forward pass never uses (or uses through .data / detach)",
            )  # fmt: skip
        if not torch.isfinite(parameter.grad).all():
            return Finding("", False, f"{name}'s gradient is not finite", "NaN gradient")
    return Finding("", True)


def module_repeats(
    run: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]], size: int
) -> Finding:
    q, k, v, lens = next(module_cases(size, batch_at_least=2))
    first, _ = run(q, k, v, lens)
    second, _ = run(q, k, v, lens)
    if not torch.equal(first, second):
        where = first_bad(first != second)
        return Finding(
            "", False, f"at {where} {float(first[where]):.6g} then {float(second[where]):.6g}",
            "randomness in eval mode (dropout called as a function, or torch.rand in forward)",
        )  # fmt: skip
    return Finding("", True)


def mask_weights(
    run: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]], size: int, mask: Tensor
) -> Tensor:
    """The module's weights for random queries and keys where ``mask`` (B, Tq, Tk) marks each
    sentence's real keys (every query of a sentence has the same)."""
    batch, queries, keys = mask.shape
    generator = torch.Generator().manual_seed(batch * 100 + queries * 10 + keys)
    q = torch.randn(batch, queries, size, generator=generator, dtype=torch.float64)
    k = torch.randn(batch, keys, size, generator=generator, dtype=torch.float64)
    v = torch.randn(batch, keys, size, generator=generator, dtype=torch.float64)
    _, weights = run(q, k, v, mask[:, 0].sum(-1))
    return weights


def module_empty(module: nn.Module, size: int) -> Finding:
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, size, generator=generator, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 4, size, generator=generator, dtype=torch.float64)
    v = torch.randn(2, 4, size, generator=generator, dtype=torch.float64)
    context, weights = run_module(module, q.clone(), k, v, torch.tensor([4, 0]))  # as above
    if not (torch.isfinite(weights).all() and torch.isfinite(context).all()):
        return Finding(
            "", False, "a sentence with no real key gives NaN weights or context",
            "-inf fill: a row with every key masked is softmax of -inf only, NaN",
        )  # fmt: skip
    if (weights[1] != 0).any():
        return kept_weight_finding(weights[1, 0])
    other = empty_context_finding(module, q, k, v, context)
    if other is not None:
        return other
    (grad,) = torch.autograd.grad(context.sin().sum(), q)
    if not torch.isfinite(grad).all():
        return Finding("", False, "the queries' gradient is not finite", "NaN gradient")
    return Finding("", True)


def empty_context_finding(
    module: nn.Module, q: Tensor, k: Tensor, v: Tensor, context: Tensor
) -> Finding | None:
    """Sentence 1 of (q, k, v) has no real key: its context must be what the module makes of
    nothing (zeros, or an output projection's bias), whatever its queries, keys and values; a
    failure where the queries or the keys and values reach it anyway (None: it holds)."""
    lens = torch.tensor([k.shape[1], 0])
    generator = torch.Generator().manual_seed(1)
    other_q, nothing_v = q.detach().clone(), v.clone()
    other_q[1] = torch.randn(q.shape[1:], generator=generator, dtype=q.dtype)
    nothing_v[1] = 0.0
    with torch.no_grad():
        nothing, _ = run_module(module, q.detach(), k, nothing_v, lens)  # no values
        moved, _ = run_module(module, other_q, k, nothing_v, lens)  # other queries too
    for reference, bug in (
        (nothing, "keys or values reach a sentence's context outside the weights (an average "
         "of the values, or lengths applied to the wrong sentences)"),
        (moved, "the queries reach the context outside the weights: a residual (context + "
         "queries) inside the attention; add it in the layer around the attention instead"),
    ):  # fmt: skip
        seen = context if reference is nothing else nothing
        bad = ~torch.isclose(seen[1], reference[1], rtol=1e-6, atol=1e-9)
        if bad.any():
            where = first_bad(bad)
            got, want = float(seen[1][where].detach()), float(reference[1][where])
            return Finding(
                "", False, f"its weights are zeros, but its context at {(1, *where)} is {got:.6g}"
                f", then {want:.6g} with {'other queries' if reference is moved else 'no values'}"
                " (it should not move: a sentence with no key has nothing to attend to)", bug,
            )  # fmt: skip
    return None


def leak_finding(
    run: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]], size: int
) -> Finding:
    for q, k, v, lens in module_cases(size):
        context, _ = run(q, k, v, lens)
        keys = k.shape[1]
        padded = torch.arange(keys)[None, :, None] >= lens[:, None, None]  # (B, Tk, 1)
        noisy_k = torch.where(padded, torch.randn_like(k) * 100, k)
        noisy_v = torch.where(padded, torch.randn_like(v) * 100, v)
        changed, _ = run(q, noisy_k, noisy_v, lens)
        real = lens > 0
        bad = ~torch.isclose(changed, context, rtol=1e-6, atol=1e-9) & real[:, None, None]
        if bad.any():
            where = first_bad(bad)
            return Finding(
                "", False, f"context at {where} moved from {float(context[where]):.6g} to "
                f"{float(changed[where]):.6g} when only padded keys and values changed",
                "padding leaks into the context: no mask, or one on the wrong axis; with heads, "
                "lengths repeated where rows b·h + i need repeat_interleave, or heads split by a "
                "bare reshape (reshape to (B, T, h, d), then transpose)",
            )  # fmt: skip
    return Finding("", True)


def batch_finding(
    run: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]], size: int
) -> Finding:
    for q, k, v, lens in module_cases(size):
        if q.shape[0] < 2:
            continue
        context, _ = run(q, k, v, lens)
        for b in range(q.shape[0]):
            alone, _ = run(q[b : b + 1], k[b : b + 1], v[b : b + 1], lens[b : b + 1])
            bad = ~torch.isclose(alone[0], context[b], rtol=1e-6, atol=1e-9)
            if bad.any():
                where = (b, *first_bad(bad))
                return Finding(
                    "", False, f"sentence {b} alone gives {float(alone[0][where[1:]]):.6g} at "
                    f"{where}, in the batch {float(context[where]):.6g}",
                    "batch mixing: a reshape, transpose or mask broadcast mixes sentences",
                )  # fmt: skip
    return Finding("", True)


def growth_info(build: Callable[[int], nn.Module]) -> Finding:
    """The logits' spread against the size D (information): unscaled dot products grow as √D."""
    spreads = []
    for size in (16, 64, 256):
        module = build(size).double().eval()
        generator = torch.Generator().manual_seed(size)
        q = torch.randn(8, 6, size, generator=generator, dtype=torch.float64)
        k = torch.randn(8, 6, size, generator=generator, dtype=torch.float64)
        with torch.no_grad():
            logits = (
                module.score(q, module.project_keys(k)) if isinstance(module, Attention) else None
            )
        if logits is None:
            return Finding("", True, "no score() to read", info=True)
        spreads.append(float(logits.std()))
    ratio = spreads[-1] / spreads[0]
    grows = ratio > math.sqrt(256 / 16) / 2
    detail = f"logit std at D = 16, 64, 256: {', '.join(f'{s:.3g}' for s in spreads)}"
    return Finding(
        "", True, detail + (" (grows as √D: √d missing? scale by 1/√D)" if grows else ""),
        info=True, warning=grows,
    )  # fmt: skip


SCALE = "1/√d in its dot products"


def scale_info(module: nn.Module, size: int) -> Finding:
    """Whether a built module's weights are dot products of its projected queries and keys, and
    with or without 1/√d (information). A built module has one size, so the logits' growth with
    D cannot be watched; instead its projections are read with hooks on its linear layers (the
    one applied to the queries and the one applied to the keys; none: the inputs themselves),
    and each way of splitting their features into h heads of d is tried, with and without
    1/√d, against the module's own weights (the heads' average where it has several)."""
    generator = torch.Generator().manual_seed(0)
    batch, queries, keys, lengths = SHAPES[3]
    q = torch.randn(batch, queries, size, generator=generator, dtype=torch.float64)
    k = torch.randn(batch, keys, size, generator=generator, dtype=torch.float64)
    v = torch.randn(batch, keys, size, generator=generator, dtype=torch.float64)
    lens = torch.tensor(lengths)
    seen: list[tuple[Tensor, Tensor]] = []  # (input, output) of every linear layer called
    hooks = [
        layer.register_forward_hook(lambda _, inputs, output: seen.append((inputs[0], output)))
        for layer in module.modules()
        if isinstance(layer, nn.Linear)  # a LazyLinear is one too
    ]
    try:
        with torch.no_grad():
            _, weights = run_module(module, q, k, v, lens)
    finally:
        for hook in hooks:
            hook.remove()

    def projected(x: Tensor) -> Tensor:
        return next((out for inp, out in seen if inp is x or torch.equal(inp, x)), x)

    q_proj, k_proj = projected(q), projected(k)  # (B, Tq, D'), (B, Tk, D')
    if q_proj.shape[-1] != k_proj.shape[-1]:
        return Finding(
            "", True, "not read: its projected queries and keys differ in size", info=True
        )
    fits = heads_fits(q_proj, k_proj, lens, weights)
    (heads, scaled), best = min(fits.items(), key=lambda item: item[1])
    if best > 1e-6:
        return Finding(
            "", True, "not a dot product of its projected queries and keys (additive, a "
            "temperature, or a projection that is not an nn.Linear): no √d to read", info=True,
        )  # fmt: skip
    d = q_proj.shape[-1] // heads
    shape = f"{heads} head{'s' if heads > 1 else ''} of d = {d}"
    if scaled or d == 1:
        return Finding("", True, f"dot products over {shape}, scaled by 1/√d", info=True)
    match = "exactly" if best < 1e-12 else f"to {best:.0e}"
    return Finding(
        "", True, f"dot products over {shape} without 1/√d (its weights are softmax(q·k) "
        f"{match}; softmax(q·k/√d) differs by {fits[(heads, True)]:.2g}): √d missing? Unscaled dot "
        "products spread as √d and the softmax saturates on one key; scaled dot-product "
        "attention divides by √d (Luong's dot deliberately does not)", info=True, warning=True,
    )  # fmt: skip


def heads_fits(
    q_proj: Tensor, k_proj: Tensor, lens: Tensor, weights: Tensor
) -> dict[tuple[int, bool], float]:
    """For every split of the D' features into h heads, with 1/√d (True) and without: the
    largest difference between ``weights`` (B, Tq, Tk) and the heads' average of the masked
    softmax of their dot products, over the rows with a real key."""
    batch, queries, features = q_proj.shape
    real = torch.arange(k_proj.shape[1]) < lens[:, None, None]  # (B, 1, Tk)
    rows = lens > 0
    fits = {}
    for heads in (h for h in range(1, features + 1) if features % h == 0):
        d = features // heads
        q_h = q_proj.reshape(batch, queries, heads, d).transpose(1, 2)  # (B, h, Tq, d)
        k_h = k_proj.reshape(batch, -1, heads, d).transpose(1, 2)  # (B, h, Tk, d)
        products = q_h @ k_h.transpose(-1, -2)  # (B, h, Tq, Tk)
        for scaled in (True, False):
            logits = products / math.sqrt(d) if scaled else products
            masked = logits.masked_fill(~real[:, None], float("-inf"))
            candidate = torch.softmax(masked, dim=-1).nan_to_num(0.0).mean(1)  # (B, Tq, Tk)
            fits[(heads, scaled)] = float((candidate - weights)[rows].abs().max())
    return fits


class TanhOutputs(TorchDispatchMode):
    """The outputs of every tanh that runs inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[Tensor] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket is torch.ops.aten.tanh:
            self.outputs.append(out.detach())
        return out


def saturation_info(build: Callable[[int], nn.Module]) -> Finding:
    """The share of tanh units past 0.99 in magnitude (information): an additive score's tanh
    saturates as the projections grow, and a saturated unit passes almost no gradient."""
    size = 64
    module = build(size).double().eval()
    generator = torch.Generator().manual_seed(size)
    q = torch.randn(8, 6, size, generator=generator, dtype=torch.float64)
    k = torch.randn(8, 6, size, generator=generator, dtype=torch.float64)
    with torch.no_grad(), TanhOutputs() as tanh:
        run_module(module, q, k, k, torch.full((8,), 6))
    if not tanh.outputs:
        return Finding("", True, "no tanh in the score", info=True)
    values = torch.cat([t.flatten() for t in tanh.outputs])
    share = float((values.abs() > 0.99).double().mean())
    hint = " (LayerNorm before the tanh keeps it in range)" if share > 0.1 else ""
    return Finding("", True, f"{share:.1%} of tanh units past ±0.99 at D = {size}{hint}", info=True)


def scalar_bias_info(build: Callable[[int], nn.Module]) -> Finding:
    """Whether a one-number parameter changes the weights (information): a scalar added to
    every logit of a row changes nothing after a softmax."""
    module = build(16).double().eval()
    scalars = [(n, p) for n, p in module.named_parameters() if p.numel() == 1]
    if not scalars:
        return Finding("", True, "no one-number parameter", info=True)
    q, k, v, lens = next(module_cases(16, batch_at_least=2))
    with torch.no_grad():
        _, before = run_module(module, q, k, v, lens)
        found = []
        for name, parameter in scalars:
            parameter.add_(1.0)
            _, after = run_module(module, q, k, v, lens)
            parameter.sub_(1.0)
            moves = not torch.allclose(after, before, rtol=1e-9, atol=1e-12)
            found.append(f"{name}: {'changes the weights' if moves else 'changes nothing'}")
    useless = any(text.endswith("changes nothing") for text in found)
    hint = " (a scalar added to every logit cancels in the softmax: it cannot learn)"
    return Finding(
        "", True, "; ".join(found) + (hint if useless else ""), info=True, warning=useless
    )


def parameters_info(build: Callable[[int], nn.Module]) -> Finding:
    """Its parameter count at D = 256 beside additive scoring's (A = 256) and general's."""
    from seq2seq.attention import AdditiveAttention, GeneralAttention

    size = 256

    def count(module: nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    own = count(build(size))
    additive = count(AdditiveAttention(query_size=size, key_size=size, num_hiddens=size))
    general = count(GeneralAttention(query_size=size, key_size=size))
    return Finding(
        "", True, f"{own:,} at D = 256 (additive: {additive:,}; general: {general:,})", info=True
    )
