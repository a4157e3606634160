"""Controlled experiments that measure the claims of docs/attention.md, with plots and a report.

Shape legend: B batch, Tq queries, Tk keys, d query/key size, A attention hidden size.

Each ``measure_*`` function returns plain numbers (dataclasses of floats) computed with the real
scoring functions of ``seq2seq.attention``; ``run_all`` runs them, draws the plots and writes
``report.md`` and ``results.json``. Nothing in the report is typed by hand.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display needed, none is opened

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq.analysis.diagnostics import attention_statistics, gradient_norm, valid_pairs
from seq2seq.attention import (
    AdditiveAttention,
    Attention,
    DotProductAttention,
    MultiplicativeAttention,
    masked_softmax,
)
from seq2seq.errors import Seq2SeqError


class ExperimentError(Seq2SeqError, ValueError):
    """Bad input to the experiments (an unreadable run directory...); the message says the fix."""


@dataclass(frozen=True)
class Settings:
    """Sizes of every experiment; ``quick`` shrinks them to a few seconds in all."""

    seed: int = 0
    dims: tuple[int, ...] = (8, 32, 128, 512, 2048)
    num_keys: int = 16
    num_sentences: int = 64  # B: independent (queries, keys) sets per measurement
    num_queries: int = 16
    input_norms: tuple[float, ...] = (0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256)
    saturation_size: int = 64  # d = A for the additive experiment
    xor_keys: int = 4
    xor_hiddens: int = 16
    xor_steps: int = 400
    xor_batch_size: int = 256
    xor_eval_every: int = 5
    xor_seeds: tuple[int, ...] = (0, 1, 2)
    xor_learning_rate: float = 0.03

    @classmethod
    def quick(cls, seed: int = 0) -> Settings:
        return cls(
            seed=seed,
            dims=(8, 128),
            num_sentences=8,
            input_norms=(0.5, 32, 256),
            saturation_size=32,
            xor_steps=40,
            xor_eval_every=10,
            xor_seeds=(0,),
        )


# ---- claim 1: dot-product scores grow as √d; softmax saturates --------------------------------


@dataclass(frozen=True)
class DimensionRow:
    d: int
    scaled: bool
    score_std: float
    entropy: float
    max_weight: float
    softmax_jacobian: float


def measure_dimension(settings: Settings) -> list[DimensionRow]:
    """Score std, entropy, max weight and softmax-Jacobian norm of q·k and q·k/√d against d.

    Queries and keys have independent unit-variance entries, the regime the √d argument assumes.
    """
    generator = torch.Generator().manual_seed(settings.seed)
    rows = []
    for d in settings.dims:
        shape = (settings.num_sentences, settings.num_queries, d)
        queries = torch.randn(*shape, generator=generator)  # (B, Tq, d)
        keys = torch.randn(settings.num_sentences, settings.num_keys, d, generator=generator)
        for scaled in (False, True):
            stats = attention_statistics(DotProductAttention(scaled=scaled), queries, keys)
            rows.append(
                DimensionRow(
                    d,
                    scaled,
                    stats.score_std,
                    stats.entropy,
                    stats.max_weight,
                    stats.softmax_jacobian,
                )
            )
    return rows


# ---- claim 2: additive scores are bounded, tanh saturates, LayerNorm helps --------------------


@dataclass(frozen=True)
class SaturationRow:
    input_norm: float
    layer_norm: bool
    saturation: float  # fraction of tanh units with |x| > 2
    tanh_slope: float  # mean tanh'(x) = 1 - tanh²(x): the share of gradient a unit lets through
    grad_at_tanh: float  # ‖∂loss/∂x‖ at the tanh inputs x
    grad_weights: float  # ‖∂loss/∂(W_q, W_k)‖: that gradient times the inputs q, k
    max_abs_score: float
    score_bound: float  # ‖w_v‖₁


def measure_saturation(settings: Settings) -> list[SaturationRow]:
    """Tanh saturation and the gradient through it against the norm of q and k.

    The loss is the cross-entropy of the attention weights against a random key per query (learn
    where to look). Both models share W_q, W_k and w_v; one adds LayerNorm before the tanh.
    """
    size = settings.saturation_size
    generator = torch.Generator().manual_seed(settings.seed)
    torch.manual_seed(settings.seed)
    plain = AdditiveAttention(size, size, num_hiddens=size)
    normed = AdditiveAttention(size, size, num_hiddens=size, layer_norm=True)
    normed.load_state_dict(plain.state_dict(), strict=False)  # same weights, plus LayerNorm
    batch, num_queries, num_keys = settings.num_sentences, settings.num_queries, settings.num_keys
    # Unit directions (B, Tq, d) and (B, Tk, d), scaled to each norm below.
    query_directions = F.normalize(
        torch.randn(batch, num_queries, size, generator=generator), dim=-1
    )
    key_directions = F.normalize(torch.randn(batch, num_keys, size, generator=generator), dim=-1)
    valid_lens = torch.randint(1, num_keys + 1, (batch,), generator=generator)
    targets = (torch.rand(batch, num_queries, generator=generator) * valid_lens[:, None]).long()
    is_valid = valid_pairs(valid_lens, None, torch.Size([batch, num_queries, num_keys]))
    rows = []
    for norm in settings.input_norms:
        queries, keys = norm * query_directions, norm * key_directions  # (B,Tq,d), (B,Tk,d)
        for layer_norm, attention in ((False, plain), (True, normed)):
            attention.zero_grad()
            projected_keys = attention.project_keys(keys)
            scores = attention.logits(queries, projected_keys)  # (B, Tq, Tk)
            scores.retain_grad()
            weights = masked_softmax(scores, valid_lens)
            target_weights = weights.gather(-1, targets[..., None])  # (B, Tq, 1)
            loss = -target_weights.clamp(min=1e-30).log().mean()
            loss.backward()
            assert scores.grad is not None
            with torch.no_grad():
                tanh_inputs = attention.preactivations(queries, projected_keys)  # (B,Tq,Tk,A)
                slope = 1 - torch.tanh(tanh_inputs).pow(2)  # tanh'(x)
                # Chain rule through score = w_vᵀ tanh(x): ∂loss/∂x = ∂loss/∂score · w_v ⊙ tanh'(x).
                grad_at_tanh = scores.grad[..., None] * attention.w_v.weight[0] * slope
            rows.append(
                SaturationRow(
                    input_norm=float(norm),
                    layer_norm=layer_norm,
                    saturation=float((tanh_inputs.abs() > 2).double().mean(-1)[is_valid].mean()),
                    tanh_slope=float(slope.double().mean(-1)[is_valid].mean()),
                    grad_at_tanh=float(grad_at_tanh.double().norm()),
                    grad_weights=gradient_norm([attention.W_q.weight, attention.W_k.weight]) or 0.0,
                    max_abs_score=float(scores.detach()[is_valid].abs().max()),
                    score_bound=float(attention.w_v.weight.detach().abs().sum()),
                )
            )
    return rows


# ---- claim 3: a scalar bias does nothing to dot-product weights; one inside tanh does ----------


@dataclass(frozen=True)
class BiasResult:
    dot_shift_max_change: dict[str, float]  # shift c -> max |Δweight|, dot-product
    additive_outside_max_change: float  # w_vᵀ tanh(·) + c: a scalar outside the tanh
    additive_inside_max_change: float  # w_vᵀ tanh(· + b): a bias vector inside the tanh
    additive_inside_mean_tv: float  # mean total-variation distance between the weight rows


def measure_bias(settings: Settings, shifts: Sequence[float] = (-10.0, 0.5, 10.0)) -> BiasResult:
    """Max change of the weights when a bias is added to the score, or inside the tanh."""
    generator = torch.Generator().manual_seed(settings.seed)
    size = 32
    queries = torch.randn(settings.num_sentences, settings.num_queries, size, generator=generator)
    keys = torch.randn(settings.num_sentences, settings.num_keys, size, generator=generator)
    valid_lens = torch.randint(
        1, settings.num_keys + 1, (settings.num_sentences,), generator=generator
    )
    dot = DotProductAttention(scaled=True)
    weights = dot(queries, keys, keys, valid_lens)[1]
    dot_changes = {
        f"{shift:g}": float(
            (masked_softmax(dot.logits(queries, keys) + shift, valid_lens) - weights).abs().max()
        )
        for shift in shifts
    }
    torch.manual_seed(settings.seed)
    additive = AdditiveAttention(size, size, num_hiddens=size, bias=True)
    assert additive.W_q.bias is not None
    with torch.no_grad():
        additive.W_q.bias.zero_()
        plain_scores = additive.logits(queries, additive.project_keys(keys))
        plain_weights = masked_softmax(plain_scores, valid_lens)
        outside = masked_softmax(plain_scores + 3.0, valid_lens)
        additive.W_q.bias.copy_(torch.randn(size, generator=generator))
        inside = additive(queries, keys, keys, valid_lens)[1]
    is_valid_row = valid_pairs(valid_lens, None, weights.shape).any(-1)
    total_variation = 0.5 * (inside - plain_weights).abs().sum(-1)[is_valid_row]
    return BiasResult(
        dot_shift_max_change=dot_changes,
        additive_outside_max_change=float((outside - plain_weights).abs().max()),
        additive_inside_max_change=float((inside - plain_weights).abs().max()),
        additive_inside_mean_tv=float(total_variation.mean()),
    )


# ---- claim 4: only v/T (or W/T) is identifiable -------------------------------------------------


@dataclass(frozen=True)
class IdentifiabilityRow:
    scoring: str
    alpha: float
    same_ratio_max_change: float  # (αv, αT) against (v, T)
    scale_only_max_change: float  # (αv, T) against (v, T): the control


def measure_identifiability(
    settings: Settings, alphas: Sequence[float] = (0.1, 2.0, 10.0)
) -> list[IdentifiabilityRow]:
    """Max weight change when the score's scale and the temperature are multiplied by α."""
    generator = torch.Generator().manual_seed(settings.seed)
    size = 16
    queries = torch.randn(settings.num_sentences, settings.num_queries, size, generator=generator)
    keys = torch.randn(settings.num_sentences, settings.num_keys, size, generator=generator)
    rows = []
    for scoring in ("additive", "general"):
        for alpha in alphas:
            torch.manual_seed(settings.seed)
            attention: Attention = (
                AdditiveAttention(size, size, num_hiddens=size, temperature="learnable")
                if scoring == "additive"
                else MultiplicativeAttention(size, size, temperature="learnable")
            )
            scale = _score_scale(attention)
            assert attention.log_temperature is not None
            with torch.no_grad():
                attention.log_temperature.fill_(math.log(0.7))  # any T, not only the initial 1
                weights = attention(queries, keys, keys)[1]
                scale.mul_(alpha)
                scaled_only = attention(queries, keys, keys)[1]
                attention.log_temperature.add_(math.log(alpha))
                same_ratio = attention(queries, keys, keys)[1]
            rows.append(
                IdentifiabilityRow(
                    scoring,
                    alpha,
                    float((same_ratio - weights).abs().max()),
                    float((scaled_only - weights).abs().max()),
                )
            )
    return rows


def _score_scale(attention: Attention) -> Tensor:
    """The parameter that scales the score linearly: w_v (additive) or W (bilinear)."""
    if isinstance(attention, AdditiveAttention):
        return attention.w_v.weight
    if isinstance(attention, MultiplicativeAttention):
        return attention.W.weight
    raise TypeError(f"{type(attention).__name__} has no score scale parameter")


# ---- claim 5: additive attention learns an XOR pattern that bilinear attention cannot ----------


def xor_batch(
    batch_size: int, num_keys: int, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """One batch of the XOR alignment task: queries (B, 1, 2), keys (B, Tk, 2), targets (B,).

    A query is one of two types, one-hot. Every key is a corner (x1, x2) of {-1, 1}². A type-0
    query must find the one key whose bits differ (x1 XOR x2); the other keys have equal bits. A
    type-1 query must find the one key whose bits are equal, among keys whose bits differ.
    """
    query_type = torch.randint(0, 2, (batch_size,), generator=generator)  # (B,)
    queries = F.one_hot(query_type, 2).float()[:, None, :]  # (B, 1, 2)
    first_bit = torch.randint(0, 2, (batch_size, num_keys), generator=generator) * 2 - 1
    # Distractors get the pattern the query does not look for; the target gets the other one.
    targets = torch.randint(0, num_keys, (batch_size,), generator=generator)  # (B,)
    is_target = F.one_hot(targets, num_keys).bool()  # (B, Tk)
    bits_differ = is_target == (query_type[:, None] == 0)  # (B, Tk)
    second_bit = torch.where(bits_differ, -first_bit, first_bit)
    keys = torch.stack([first_bit, second_bit], dim=-1).float()  # (B, Tk, 2)
    return queries, keys, targets


def xor_accuracy(attention: Attention, queries: Tensor, keys: Tensor, targets: Tensor) -> float:
    """Fraction of queries whose largest attention weight is on the target key."""
    with torch.no_grad():
        weights = attention(queries, keys, keys)[1][:, 0]  # (B, Tk)
    return float((weights.argmax(-1) == targets).double().mean())


def bilinear_accuracy_bound(num_keys: int) -> float:
    """Largest expected accuracy of any score linear in k on the XOR task: 1/2 + 2^-Tk.

    For a fixed query a bilinear score is f(k) = uᵀk, and f(1,-1) + f(-1,1) = 0 = f(1,1) + f(-1,-1).
    So some target pattern t and distractor pattern s have f(t) <= f(s) (ties count as failures):
    the query fails whenever its target is t (probability 1/2) and a distractor is s (probability
    1 - 2^-(Tk-1)). Accuracy <= 1 - (1/2)(1 - 2^-(Tk-1)) = 1/2 + 2^-Tk.
    """
    return 0.5 + 2.0**-num_keys


@dataclass
class XorCurve:
    scoring: str
    seed: int
    steps: list[int] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)


def train_xor(scoring: str, seed: int, settings: Settings) -> XorCurve:
    """Train one scoring function on fresh XOR batches; accuracy on a fixed held-out set."""
    torch.manual_seed(seed)
    attention: Attention = (
        AdditiveAttention(2, 2, num_hiddens=settings.xor_hiddens)
        if scoring == "additive"
        else MultiplicativeAttention(2, 2)
    )
    optimizer = torch.optim.Adam(attention.parameters(), lr=settings.xor_learning_rate)
    generator = torch.Generator().manual_seed(seed)
    held_out = xor_batch(4096, settings.xor_keys, torch.Generator().manual_seed(10_000 + seed))
    curve = XorCurve(scoring, seed, [0], [xor_accuracy(attention, *held_out)])
    for step in range(1, settings.xor_steps + 1):
        queries, keys, targets = xor_batch(settings.xor_batch_size, settings.xor_keys, generator)
        weights = attention(queries, keys, keys)[1][:, 0]  # (B, Tk)
        loss = F.nll_loss(weights.clamp(min=1e-30).log(), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % settings.xor_eval_every == 0 or step == settings.xor_steps:
            curve.steps.append(step)
            curve.accuracy.append(xor_accuracy(attention, *held_out))
    return curve


def measure_xor(settings: Settings) -> list[XorCurve]:
    return [
        train_xor(scoring, seed, settings)
        for scoring in ("additive", "general")
        for seed in settings.xor_seeds
    ]


# ---- the toy task: logged diagnostics of training runs ------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    run: str
    attention: str
    hidden_size: int
    first_step: int
    first: dict[str, float]  # attn/* at the first logged training step
    validation: dict[str, float]  # attn/* and val/* at the last validation


def summarize_run(run_dir: Path) -> RunSummary:
    """The attn/* diagnostics a training run logged to RUN/metrics.csv, first and last."""
    metrics_path, config_path = run_dir / "metrics.csv", run_dir / "config.yaml"
    if not metrics_path.is_file() or not config_path.is_file():
        raise ExperimentError(
            f"{run_dir} is not a finished training run: it needs metrics.csv and config.yaml "
            "(written by python train.py ... with the default logger=csv). Pass a run directory."
        )
    from omegaconf import OmegaConf  # only this report section reads Hydra configs

    config = OmegaConf.load(config_path)
    with open(metrics_path, newline="", encoding="utf-8") as metrics_file:
        rows = list(csv.DictReader(metrics_file))
    train_rows = [row for row in rows if row.get("train/loss") and row.get("attn/entropy")]
    val_rows = [row for row in rows if row.get("val/loss") and row.get("attn/entropy")]
    if not train_rows or not val_rows:
        raise ExperimentError(
            f"{metrics_path} has no attn/* diagnostics at a training step and a validation; "
            "train for at least trainer.log_every_n_steps steps and one validation."
        )

    def numbers(row: dict[str, str], prefixes: tuple[str, ...]) -> dict[str, float]:
        return {k: float(v) for k, v in row.items() if v and k.startswith(prefixes)}

    attention = str(config.attention._target_).rsplit(".", 1)[-1]
    if attention == "DotProductAttention":  # the names of the config options
        attention = "scaled_dot, q·k/√d" if config.attention.get("scaled", True) else "dot, q·k"
    return RunSummary(
        run=str(run_dir),
        attention=attention,
        hidden_size=int(config.model.hidden_size),
        first_step=int(train_rows[0]["step"]) + 1,  # Lightning's step column counts from 0
        first=numbers(train_rows[0], ("attn/",)),
        validation=numbers(val_rows[-1], ("attn/", "val/")),
    )


# ---- plots and the report -----------------------------------------------------------------------


def plot_dimension(rows: list[DimensionRow], num_keys: int, path: Path) -> None:
    figure, (std_axes, entropy_axes) = plt.subplots(1, 2, figsize=(10, 4))
    for scaled, style in ((False, "o-"), (True, "s-")):
        label = "q·k/√d (scaled)" if scaled else "q·k (unscaled)"
        selected = [row for row in rows if row.scaled == scaled]
        dims = [row.d for row in selected]
        std_axes.plot(dims, [row.score_std for row in selected], style, label=label)
        entropy_axes.plot(dims, [row.entropy for row in selected], style, label=label)
    dims = sorted({row.d for row in rows})
    std_axes.plot(dims, [math.sqrt(d) for d in dims], "k:", label="√d")
    std_axes.set(xscale="log", yscale="log", xlabel="d", ylabel="score standard deviation")
    entropy_axes.axhline(math.log(num_keys), color="k", ls=":", label=f"uniform, log {num_keys}")
    entropy_axes.set(xscale="log", xlabel="d", ylabel="attention entropy (nats)", ylim=(0, None))
    for axes in (std_axes, entropy_axes):
        axes.legend()
        axes.grid(alpha=0.3)
    figure.suptitle(f"Random unit-variance q, k; {num_keys} keys")
    _save(figure, path)


def plot_saturation(rows: list[SaturationRow], path: Path) -> None:
    figure, (saturation_axes, gradient_axes) = plt.subplots(1, 2, figsize=(10, 4))
    for layer_norm, style in ((False, "o-"), (True, "s-")):
        label = "with LayerNorm" if layer_norm else "plain tanh"
        selected = [row for row in rows if row.layer_norm == layer_norm]
        norms = [row.input_norm for row in selected]
        saturation_axes.plot(norms, [row.saturation for row in selected], style, label=label)
        gradient_axes.plot(norms, [row.grad_at_tanh for row in selected], style, label=label)
    saturation_axes.set(
        xscale="log", xlabel="‖q‖ = ‖k‖", ylabel="fraction of tanh units with |x| > 2", ylim=(0, 1)
    )
    gradient_axes.set(
        xscale="log", yscale="log", xlabel="‖q‖ = ‖k‖", ylabel="‖∂loss/∂x‖ at the tanh inputs x"
    )
    for axes in (saturation_axes, gradient_axes):
        axes.legend()
        axes.grid(alpha=0.3)
    figure.suptitle("Additive attention: tanh saturation and the gradient before it")
    _save(figure, path)


def plot_xor(curves: list[XorCurve], num_keys: int, path: Path) -> None:
    figure, axes = plt.subplots(figsize=(6.5, 4))
    colours = {"additive": "tab:blue", "general": "tab:orange"}
    labels = {"additive": "additive w_vᵀtanh(W_q q + W_k k)", "general": "bilinear qᵀWk"}
    for curve in curves:
        first_of_kind = curve.seed == min(c.seed for c in curves if c.scoring == curve.scoring)
        axes.plot(
            curve.steps,
            curve.accuracy,
            color=colours[curve.scoring],
            alpha=0.8,
            label=labels[curve.scoring] if first_of_kind else None,
        )
    axes.axhline(
        bilinear_accuracy_bound(num_keys), color="k", ls="--", label="bound for bilinear scores"
    )
    axes.axhline(1 / num_keys, color="gray", ls=":", label="chance")
    axes.set(xlabel="training step", ylabel="held-out accuracy", ylim=(0, 1.02))
    axes.set_title(f"XOR alignment task, {num_keys} keys (one line per seed)")
    # Between the additive curves (at 1) and everything bilinear (below the bound).
    axes.legend(loc="upper right", bbox_to_anchor=(1.0, 0.94), fontsize="small")
    axes.grid(alpha=0.3)
    _save(figure, path)


def _save(figure: Any, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# ---- the report ---------------------------------------------------------------------------------


@dataclass
class Results:
    settings: Settings
    dimension: list[DimensionRow]
    saturation: list[SaturationRow]
    bias: BiasResult
    identifiability: list[IdentifiabilityRow]
    xor: list[XorCurve]
    runs: list[RunSummary]
    environment: dict[str, Any]


def run_all(
    out_dir: Path, quick: bool = False, seed: int = 0, run_dirs: Sequence[Path] = ()
) -> Results:
    """Every experiment; writes the plots, ``report.md`` and ``results.json`` to ``out_dir``."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ExperimentError(
            f"cannot create the output directory {out_dir} ({error.strerror}); "
            "choose another --out."
        ) from None
    runs = [summarize_run(Path(run_dir)) for run_dir in run_dirs]  # fail before the slow part
    settings = Settings.quick(seed) if quick else Settings(seed=seed)
    started = time.perf_counter()
    results = Results(
        settings=settings,
        dimension=measure_dimension(settings),
        saturation=measure_saturation(settings),
        bias=measure_bias(settings),
        identifiability=measure_identifiability(settings),
        xor=measure_xor(settings),
        runs=runs,
        environment={},
    )
    plot_dimension(results.dimension, settings.num_keys, out_dir / "dimension.png")
    plot_saturation(results.saturation, out_dir / "saturation.png")
    plot_xor(results.xor, settings.xor_keys, out_dir / "xor.png")
    results.environment = _environment(time.perf_counter() - started)
    (out_dir / "results.json").write_text(
        json.dumps(asdict(results), indent=1) + "\n", encoding="utf-8"
    )
    (out_dir / "report.md").write_text(render_report(results), encoding="utf-8")
    return results


def _environment(seconds: float) -> dict[str, Any]:
    import os
    import platform

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [
            line.split(":", 1)[1].strip()
            for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines()
            if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    return {
        "seconds": round(seconds, 1),
        "torch": torch.__version__,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }


def render_sections(results: Results) -> dict[str, str]:
    """The report's markdown blocks by name (``dimension``, ``saturation``, ``bias``,
    ``identifiability``, ``xor``, and ``runs`` when run directories were given)."""
    sections = {
        "dimension": _dimension_table(results),
        "saturation": _saturation_table(results),
        "bias": _bias_table(results),
        "identifiability": _identifiability_table(results),
        "xor": _xor_table(results),
    }
    if results.runs:
        sections["runs"] = _runs_table(results.runs)
    return sections


def render_report(results: Results) -> str:
    settings, environment = results.settings, results.environment
    sections = render_sections(results)
    mode = " --quick" if settings == Settings.quick(settings.seed) else ""
    runs = "".join(f" {run.run}" for run in results.runs)
    lines = [
        "# Attention diagnostics: measurements",
        "",
        f"Generated by `python scripts/attention_diagnostics.py --out DIR{mode} --seed "
        f"{settings.seed}{' --runs' + runs if runs else ''}` in {environment['seconds']} s "
        f"(torch {environment['torch']}, {environment['cpu']}, {environment['cores']} cores, "
        f"torch threads: {environment['torch_threads']}). The claims and the arguments behind "
        "them: [docs/attention.md](../attention.md).",
        "",
        "## 1. Dot-product scores grow as √d; scaling keeps their variance at 1",
        "",
        sections["dimension"],
        "",
        "![score std and entropy against d](dimension.png)",
        "",
        "## 2. Additive attention: bounded scores, tanh saturation, LayerNorm",
        "",
        sections["saturation"],
        "",
        "![saturation and gradient against input norm](saturation.png)",
        "",
        "## 3. A scalar bias changes no dot-product weight; a bias inside the tanh does",
        "",
        sections["bias"],
        "",
        "## 4. Only the ratio of the score's scale to the temperature is identifiable",
        "",
        sections["identifiability"],
        "",
        "## 5. XOR alignment: additive attention learns it, bilinear attention cannot",
        "",
        sections["xor"],
        "",
        "![XOR task learning curves](xor.png)",
        "",
    ]
    if "runs" in sections:
        lines += ["## The toy task: logged diagnostics of training runs", "", sections["runs"], ""]
    return "\n".join(lines)


def _dimension_table(results: Results) -> str:
    settings = results.settings
    by_key = {(row.d, row.scaled): row for row in results.dimension}
    lines = [
        f"{settings.num_sentences * settings.num_queries} queries, each against "
        f"{settings.num_keys} keys; entries of q and k are independent N(0, 1). Uniform weights "
        f"would have entropy log {settings.num_keys} = {math.log(settings.num_keys):.2f} nats and "
        f"max weight 1/{settings.num_keys} = {1 / settings.num_keys:.3f}. The last columns are "
        "‖∂weights/∂scores‖_F: 0 when the weights are one-hot, i.e. when no gradient reaches "
        "the scores.",
        "",
        "| d | √d | score std, q·k | score std, q·k/√d | entropy, q·k | entropy, q·k/√d "
        "| max weight, q·k | max weight, q·k/√d | softmax Jacobian, q·k "
        "| softmax Jacobian, q·k/√d |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in settings.dims:
        unscaled, scaled = by_key[(d, False)], by_key[(d, True)]
        lines.append(
            f"| {d} | {math.sqrt(d):.1f} | {unscaled.score_std:.2f} | {scaled.score_std:.3f} "
            f"| {unscaled.entropy:.3f} | {scaled.entropy:.3f} | {unscaled.max_weight:.3f} "
            f"| {scaled.max_weight:.3f} | {unscaled.softmax_jacobian:.3f} "
            f"| {scaled.softmax_jacobian:.3f} |"
        )
    return "\n".join(lines)


def _saturation_table(results: Results) -> str:
    settings = results.settings
    by_key = {(row.input_norm, row.layer_norm): row for row in results.saturation}
    bound = results.saturation[0].score_bound
    largest = max(row.max_abs_score for row in results.saturation if not row.layer_norm)
    lines = [
        f"`AdditiveAttention(d={settings.saturation_size}, A={settings.saturation_size})` at "
        "PyTorch's initialisation; q and k are random directions scaled to the given norm. The "
        "loss is the cross-entropy of the weights against a random key per query. Both models "
        "share W_q, W_k, w_v; the second adds LayerNorm before the tanh. Saturated: |x| > 2 "
        "(tanh' < 0.071).",
        "",
        "| ‖q‖ = ‖k‖ | saturated, plain | saturated, LayerNorm | mean tanh'(x), plain "
        "| mean tanh'(x), LayerNorm | ‖∂loss/∂x‖, plain | ‖∂loss/∂x‖, LayerNorm "
        "| ‖∂loss/∂(W_q,W_k)‖, plain | ‖∂loss/∂(W_q,W_k)‖, LayerNorm |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for norm in settings.input_norms:
        plain, normed = by_key[(float(norm), False)], by_key[(float(norm), True)]
        lines.append(
            f"| {norm:g} | {plain.saturation:.1%} | {normed.saturation:.1%} "
            f"| {plain.tanh_slope:.3f} | {normed.tanh_slope:.3f} | {plain.grad_at_tanh:.2e} "
            f"| {normed.grad_at_tanh:.2e} | {plain.grad_weights:.2e} | {normed.grad_weights:.2e} |"
        )
    lines += [
        "",
        f"Bound: the largest |score| over all norms without LayerNorm is {largest:.3f}, below "
        f"‖w_v‖₁ = {bound:.3f}.",
    ]
    return "\n".join(lines)


def _bias_table(results: Results) -> str:
    bias = results.bias
    lines = [
        "Largest change of any attention weight (random q, k, padded rows included):",
        "",
        "| change to the scoring | max \\|Δ weight\\| |",
        "|---|---|",
    ]
    for shift, change in bias.dot_shift_max_change.items():
        lines.append(f"| scaled dot product, score + {shift} | {change:.1e} |")
    lines += [
        f"| additive, w_vᵀ tanh(W_q q + W_k k) + 3 (a scalar outside the tanh) "
        f"| {bias.additive_outside_max_change:.1e} |",
        f"| additive, w_vᵀ tanh(W_q q + W_k k + b), b ~ N(0, I) (a bias inside the tanh) "
        f"| {bias.additive_inside_max_change:.3f} |",
        "",
        "The bias inside the tanh moves a weight row by a mean total-variation distance of "
        f"{bias.additive_inside_mean_tv:.3f}; the changes of a scalar shift are float32 rounding.",
    ]
    return "\n".join(lines)


def _identifiability_table(results: Results) -> str:
    lines = [
        "Largest change of any attention weight after multiplying the score's scale (w_v, or W) "
        "by α, with the temperature T multiplied by α too, and with T left alone (the control):",
        "",
        "| scoring | α | (αv, αT) vs (v, T) | (αv, T) vs (v, T) |",
        "|---|---|---|---|",
    ]
    for row in results.identifiability:
        lines.append(
            f"| {row.scoring} | {row.alpha:g} | {row.same_ratio_max_change:.1e} "
            f"| {row.scale_only_max_change:.3f} |"
        )
    return "\n".join(lines)


def _xor_table(results: Results) -> str:
    settings = results.settings
    lines = [
        f"{settings.xor_keys} keys per query; Adam (lr {settings.xor_learning_rate}) for "
        f"{settings.xor_steps} steps of {settings.xor_batch_size} fresh examples; accuracy "
        "(largest weight on the target key) on 4,096 held-out examples; seeds "
        f"{', '.join(map(str, settings.xor_seeds))}. Chance: {1 / settings.xor_keys:.3f}. Upper "
        f"bound for any bilinear score: 1/2 + 2^-{settings.xor_keys} = "
        f"{bilinear_accuracy_bound(settings.xor_keys):.4f}.",
        "",
        "| scoring | final accuracy, mean | min | max | first step at 99% (mean) |",
        "|---|---|---|---|---|",
    ]
    names = {
        "additive": f"additive, A = {settings.xor_hiddens}",
        "general": "bilinear (general), qᵀWk",
    }
    for scoring in ("additive", "general"):
        curves = [curve for curve in results.xor if curve.scoring == scoring]
        finals = [curve.accuracy[-1] for curve in curves]
        reached = [
            next((step for step, acc in zip(c.steps, c.accuracy, strict=True) if acc >= 0.99), None)
            for c in curves
        ]
        reached_steps = [step for step in reached if step is not None]
        when = (
            f"{sum(reached_steps) / len(reached_steps):.0f}"
            if len(reached_steps) == len(curves)
            else f"never ({len(curves) - len(reached_steps)} of {len(curves)} seeds)"
        )
        lines.append(
            f"| {names[scoring]} | {sum(finals) / len(finals):.3f} | {min(finals):.3f} "
            f"| {max(finals):.3f} | {when} |"
        )
    return "\n".join(lines)


def _runs_table(runs: list[RunSummary]) -> str:
    metrics = [
        ("attn/score_std", "score std"),
        ("attn/score_row_std", "score std within a row"),
        ("attn/entropy", "entropy (nats)"),
        ("attn/max_weight", "max weight"),
        ("attn/softmax_jacobian", "softmax Jacobian"),
    ]
    header = "| run | when | " + " | ".join(label for _, label in metrics) + " | val BLEU |"
    lines = [header, "|---" * (len(metrics) + 3) + "|"]
    for run in runs:
        for when, values in (
            (f"step {run.first_step}", run.first),
            ("end (last validation)", run.validation),
        ):
            cells = " | ".join(
                f"{values[name]:.3f}" if name in values else "–" for name, _ in metrics
            )
            bleu = f"{values['val/bleu']:.1f}" if "val/bleu" in values else ""
            lines.append(
                f"| {run.attention}, hidden {run.hidden_size} | {when} | {cells} | {bleu} |"
            )
    return "\n".join(lines)


GENERATED_BLOCK = "<!-- generated:{name} -->\n{body}\n<!-- /generated:{name} -->"


def update_docs(path: Path, sections: dict[str, str]) -> list[str]:
    """Replace each ``<!-- generated:NAME -->`` block of ``path`` with its section; returns the
    names replaced. Blocks without a section (no ``--runs`` given) keep their content."""
    import re

    text = path.read_text(encoding="utf-8")
    replaced = []
    for name, body in sections.items():
        pattern = re.compile(
            rf"<!-- generated:{re.escape(name)} -->\n.*?\n<!-- /generated:{re.escape(name)} -->",
            re.DOTALL,
        )
        match = pattern.search(text)
        if match:
            block = GENERATED_BLOCK.format(name=name, body=body)
            text = text[: match.start()] + block + text[match.end() :]
            replaced.append(name)
    path.write_text(text, encoding="utf-8")
    return replaced
