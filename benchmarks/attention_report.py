"""The attention experiments' plots and report: ``run_all`` measures every claim of
docs/attention.md (``benchmarks.attention_experiments``), draws the plots, and renders the report
and the generated sections of the docs."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display needed, none is opened

import matplotlib.pyplot as plt
import torch

from benchmarks.attention_experiments import (
    BiasResult,
    DimensionRow,
    ExperimentError,
    HeadsCurve,
    IdentifiabilityRow,
    PositionwiseRow,
    RunSummary,
    SaturationRow,
    Settings,
    XorCurve,
    bilinear_accuracy_bound,
    measure_bias,
    measure_dimension,
    measure_heads,
    measure_identifiability,
    measure_positionwise,
    measure_saturation,
    measure_xor,
    summarize_run,
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
    labels = {"additive": "additive w_vᵀtanh(W_q q + W_k k)", "general": "general qᵀWk"}
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


def plot_heads(curves: list[HeadsCurve], path: Path) -> None:
    figure, (loss_axes, divergence_axes) = plt.subplots(1, 2, figsize=(10, 4))
    colours = {("scaled_dot", 1): "tab:orange", ("scaled_dot", 2): "tab:blue",
               ("additive", 1): "tab:red", ("additive", 2): "tab:green"}  # fmt: skip
    for curve in curves:
        key = (curve.scoring, curve.num_heads)
        first_of_kind = curve.seed == min(c.seed for c in curves if (c.scoring, c.num_heads) == key)
        label = f"{curve.scoring}, {curve.num_heads} head{'s' * (curve.num_heads > 1)}"
        style = {"color": colours[key], "alpha": 0.8, "label": label if first_of_kind else None}
        loss_axes.plot(curve.steps, curve.loss, **style)
        if curve.num_heads > 1:
            divergence_axes.plot(curve.steps, curve.divergence, **style)
    loss_axes.set(xlabel="training step", ylabel="held-out mean squared error", yscale="log")
    loss_axes.set_title("retrieve two values: error (one line per seed)")
    divergence_axes.axhline(math.log(2), color="k", ls="--", label="log 2: disjoint one-hot heads")
    divergence_axes.set(xlabel="training step", ylabel="JS divergence between heads (nats)")
    divergence_axes.set_title("how differently the two heads attend")
    for axes in (loss_axes, divergence_axes):
        axes.legend(fontsize="small")
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
    heads: list[HeadsCurve]
    positionwise: list[PositionwiseRow]
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
        heads=measure_heads(settings),
        positionwise=measure_positionwise(settings),
        runs=runs,
        environment={},
    )
    plot_dimension(results.dimension, settings.num_keys, out_dir / "dimension.png")
    plot_saturation(results.saturation, out_dir / "saturation.png")
    plot_xor(results.xor, settings.xor_keys, out_dir / "xor.png")
    plot_heads(results.heads, out_dir / "heads.png")
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
    ``identifiability``, ``xor``, ``heads``, ``positionwise``; ``runs`` for the RNN runs given
    and ``head_runs`` for the Transformer runs given)."""
    sections = {
        "dimension": _dimension_table(results),
        "saturation": _saturation_table(results),
        "bias": _bias_table(results),
        "identifiability": _identifiability_table(results),
        "xor": _xor_table(results),
        "heads": _heads_table(results),
        "positionwise": _positionwise_table(results),
    }
    # RNN runs and Transformer runs fill separate blocks, so refreshing one keeps the other.
    rnn_runs = [run for run in results.runs if not run.head_layers]
    if rnn_runs:
        sections["runs"] = _runs_table(rnn_runs)
    if len(rnn_runs) < len(results.runs):
        sections["head_runs"] = _head_runs_table(results.runs)
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
        "## 5. XOR alignment: additive attention learns it, no bilinear score (general, dot) can",
        "",
        sections["xor"],
        "",
        "![XOR task learning curves](xor.png)",
        "",
        "## 6. Heads learn different patterns",
        "",
        sections["heads"],
        "",
        "![retrieval task: error and head divergence](heads.png)",
        "",
        "## 7. The FFN acts on each position on its own; self-attention does not",
        "",
        sections["positionwise"],
        "",
    ]
    if "runs" in sections:
        lines += ["## The toy task: logged diagnostics of training runs", "", sections["runs"], ""]
    if "head_runs" in sections:
        lines += ["## Transformer runs: how the heads diverge", "", sections["head_runs"], ""]
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
        "general": "general, qᵀWk",
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
            lines.append(f"| {run.attention}, {run.model} | {when} | {cells} | {bleu} |")
    return "\n".join(lines)


def _heads_table(results: Results) -> str:
    settings = results.settings
    size = 2 * settings.heads_value_size
    lines = [
        f"Keys are {settings.heads_keys} one-hot positions, values random N(0, 1) of size "
        f"{settings.heads_value_size}; a query names two positions and the block (size {size}, "
        "W_q, W_k, W_v, W_o as in `seq2seq.attention.MultiHeadAttention`) must return both "
        f"values. Adam (lr {settings.heads_learning_rate}) for {settings.heads_steps} steps of "
        f"{settings.heads_batch_size} fresh examples; error on 2,048 held-out examples (predicting "
        "zeros: 1.0; the least error one head can reach: 1/2, see the docstring of "
        "`retrieval_batch`); heads' divergence = mean pairwise Jensen–Shannon divergence of their "
        "weight rows (0 = the same map, log 2 = 0.693 for one-hot heads on different keys); seeds "
        f"{', '.join(map(str, settings.heads_seeds))}.",
        "",
        "| scoring | heads | held-out error, start | held-out error, end (mean) "
        "| JS between heads, start | JS between heads, end (mean) |",
        "|---|---|---|---|---|---|",
    ]
    for scoring in ("scaled_dot", "additive"):
        for num_heads in (1, 2):
            curves = [c for c in results.heads if (c.scoring, c.num_heads) == (scoring, num_heads)]
            start_loss = sum(c.loss[0] for c in curves) / len(curves)
            end_loss = sum(c.loss[-1] for c in curves) / len(curves)
            js = (
                f"{sum(c.divergence[0] for c in curves) / len(curves):.3f} | "
                f"{sum(c.divergence[-1] for c in curves) / len(curves):.3f}"
                if num_heads > 1
                else "– | –"
            )
            lines.append(f"| {scoring} | {num_heads} | {start_loss:.3f} | {end_loss:.3g} | {js} |")
    return "\n".join(lines)


def _positionwise_table(results: Results) -> str:
    settings = results.settings
    lines = [
        f"One sentence of {settings.ffn_positions} random positions, d_model "
        f"{settings.ffn_size}, d_ff {4 * settings.ffn_size}, eval mode, no positional encodings. "
        "π is a random permutation of the positions; the last column is the share of the "
        "Jacobian ∂y/∂x in its off-diagonal blocks ∂y_i/∂x_j, i ≠ j (0: each output position "
        "depends on its own input position only).",
        "",
        "| block | max \\|f(x[π]) − f(x)[π]\\| | ‖∂y_i/∂x_j, i ≠ j‖ / ‖∂y/∂x‖ |",
        "|---|---|---|",
    ]
    for row in results.positionwise:
        lines.append(
            f"| {row.block} | {row.permutation_max_change:.1e} "
            f"| {row.cross_position_fraction:.3f} |"
        )
    return "\n".join(lines)


def _head_runs_table(runs: list[RunSummary]) -> str:
    """Per Transformer run: each layer's head divergence first and last, and the AER of the last
    layer's average and of the best head."""
    lines = []
    for run in runs:
        layers = run.head_layers
        if not layers:
            continue
        head_aers = {
            key.removeprefix("val/aer/"): value
            for key, value in run.validation.items()
            if key.startswith("val/aer/L")
        }
        best = min(head_aers, key=head_aers.__getitem__) if head_aers else None
        if not lines:
            lines = [
                "| run | when | "
                + " | ".join(f"JS between heads, layer {k.rsplit('L', 1)[1]}" for k in layers)
                + " | val AER, last layer's average | best head's val AER | val BLEU |",
                "|---" * (len(layers) + 5) + "|",
            ]
        for when, values in ((f"step {run.first_step}", run.first), ("end", run.validation)):
            cells = " | ".join(f"{values[k]:.3f}" if k in values else "–" for k in layers)
            aer = f"{values['val/aer']:.3f}" if "val/aer" in values else "–"
            best_cell = f"{head_aers[best]:.3f} ({best})" if best and when == "end" else "–"
            bleu = f"{values['val/bleu']:.1f}" if "val/bleu" in values else "–"
            lines.append(
                f"| {run.attention}, {run.model} | {when} | {cells} | {aer} | {best_cell} "
                f"| {bleu} |"
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
