"""Controlled experiments that measure the claims of docs/attention.md.

Shape legend: B batch, Tq queries, Tk keys, d query/key size, A attention hidden size.

Each ``measure_*`` function returns plain numbers (dataclasses of floats) computed with the real
scoring functions of ``seq2seq.attention``; ``benchmarks.attention_report.run_all`` runs them,
draws the plots and writes ``report.md`` and ``results.json``. Nothing in the report is typed by
hand.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display needed, none is opened

import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq.analysis.diagnostics import (
    attention_statistics,
    gradient_norm,
    head_divergence,
    valid_pairs,
)
from seq2seq.attention import (
    AdditiveAttention,
    Attention,
    DotProductAttention,
    GeneralAttention,
    MultiHeadAttention,
    masked_softmax,
)
from seq2seq.errors import Seq2SeqError
from seq2seq.models.transformer import PositionWiseFFN, TransformerEncoderLayer


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
    heads_keys: int = 8  # Tk of the two-position retrieval task (claim 6)
    heads_value_size: int = 8  # each retrieved value's size; the block's size is twice that
    heads_steps: int = 600
    heads_batch_size: int = 256
    heads_eval_every: int = 20
    heads_seeds: tuple[int, ...] = (0, 1, 2)
    heads_learning_rate: float = 0.01
    ffn_size: int = 64  # d_model of the position-wise experiment (claim 7); d_ff is 4 times it
    ffn_positions: int = 12

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
            heads_steps=150,
            heads_eval_every=50,
            heads_seeds=(0,),
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
                else GeneralAttention(size, size, temperature="learnable")
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
    if isinstance(attention, GeneralAttention):
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
        else GeneralAttention(2, 2)
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


# ---- claim 6: heads learn different patterns ----------------------------------------------------


def retrieval_batch(
    batch_size: int, num_keys: int, value_size: int, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One batch of the two-position retrieval task: queries (B, 1, 2 Tk), keys (B, Tk, Tk),
    values (B, Tk, Dv), targets (B, 1, 2 Dv).

    The keys are the positions, one-hot; the values are random. A query names two different
    positions p and p' (two one-hots, concatenated) and asks for both values, [v_p ; v_p']. Two
    heads can answer, each attending to one of the two positions. One head cannot: its row
    returns one mixture a v_p + b v_p' (+ other keys' values, independent noise), and the best
    linear read-out of v_p from it leaves error b²/(a² + b²) per coordinate, of v_p' a²/(a² + b²):
    a mean squared error of at least 1/2 whatever a and b are (`ONE_HEAD_ERROR_BOUND`).
    """
    first = torch.randint(0, num_keys, (batch_size,), generator=generator)  # (B,)
    offset = torch.randint(1, num_keys, (batch_size,), generator=generator)
    second = (first + offset) % num_keys  # (B,), never equal to first
    queries = torch.cat([F.one_hot(first, num_keys), F.one_hot(second, num_keys)], -1).float()
    keys = torch.eye(num_keys).expand(batch_size, -1, -1)  # (B, Tk, Tk)
    values = torch.randn(batch_size, num_keys, value_size, generator=generator)  # (B, Tk, Dv)
    rows = torch.arange(batch_size)
    targets = torch.cat([values[rows, first], values[rows, second]], -1)  # (B, 2 Dv)
    return queries[:, None, :], keys, values, targets[:, None, :]


ONE_HEAD_ERROR_BOUND = 0.5  # the retrieval task's least mean squared error with one head


@dataclass
class HeadsCurve:
    scoring: str
    num_heads: int
    seed: int
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)  # held-out mean squared error
    divergence: list[float] = field(default_factory=list)  # mean pairwise JS between heads, nats


def heads_block(scoring: str, num_heads: int, settings: Settings) -> MultiHeadAttention:
    size = 2 * settings.heads_value_size
    head_size = size // num_heads
    scorer: Attention = (
        AdditiveAttention(head_size, head_size, num_hiddens=head_size)
        if scoring == "additive"
        else DotProductAttention(scaled=True)
    )
    return MultiHeadAttention(
        scorer, num_heads, 2 * settings.heads_keys, settings.heads_keys,
        settings.heads_value_size, size,
    )  # fmt: skip


def train_heads(scoring: str, num_heads: int, seed: int, settings: Settings) -> HeadsCurve:
    """Train one multi-head block on fresh retrieval batches; held-out error and head divergence."""
    torch.manual_seed(seed)
    block = heads_block(scoring, num_heads, settings)
    optimizer = torch.optim.Adam(block.parameters(), lr=settings.heads_learning_rate)
    generator = torch.Generator().manual_seed(seed)
    held_out = retrieval_batch(
        2048, settings.heads_keys, settings.heads_value_size,
        torch.Generator().manual_seed(10_000 + seed),
    )  # fmt: skip
    curve = HeadsCurve(scoring, num_heads, seed)

    def evaluate(step: int) -> None:
        queries, keys, values, targets = held_out
        with torch.no_grad():
            context, weights = block(queries, keys, values)  # (B, 1, D), (B, h, 1, Tk)
        query_mask = torch.ones(queries.shape[:2], dtype=torch.bool)  # (B, 1)
        curve.steps.append(step)
        curve.loss.append(float(F.mse_loss(context, targets)))
        curve.divergence.append(float(head_divergence(weights, query_mask)))

    evaluate(0)
    for step in range(1, settings.heads_steps + 1):
        queries, keys, values, targets = retrieval_batch(
            settings.heads_batch_size, settings.heads_keys, settings.heads_value_size, generator
        )
        loss = F.mse_loss(block(queries, keys, values)[0], targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % settings.heads_eval_every == 0 or step == settings.heads_steps:
            evaluate(step)
    return curve


def measure_heads(settings: Settings) -> list[HeadsCurve]:
    return [
        train_heads(scoring, num_heads, seed, settings)
        for scoring in ("scaled_dot", "additive")
        for num_heads in (1, 2)
        for seed in settings.heads_seeds
    ]


# ---- claim 7: the FFN acts on each position on its own ------------------------------------------


@dataclass(frozen=True)
class PositionwiseRow:
    block: str
    permutation_max_change: float  # max |f(x[π]) − f(x)[π]|
    cross_position_fraction: float  # ‖off-diagonal blocks of ∂f/∂x‖_F / ‖∂f/∂x‖_F


def measure_positionwise(settings: Settings) -> list[PositionwiseRow]:
    """Permute the positions of one sentence, and differentiate every output position by every
    input position, for the FFN, multi-head self-attention and a whole encoder layer (eval mode,
    no positional encodings inside any of them)."""
    torch.manual_seed(settings.seed)
    size, positions = settings.ffn_size, settings.ffn_positions
    ffn = PositionWiseFFN(size, 4 * size).eval()
    layer = TransformerEncoderLayer(
        lambda query_size, key_size: DotProductAttention(scaled=True),
        size, 4, 4 * size, dropout=0.0, attention_dropout=0.0, norm_first=False,
    ).eval()  # fmt: skip
    attention = layer.self_attention
    lengths = torch.tensor([positions])
    blocks = {
        "position-wise FFN, max(0, xW₁ + b₁)W₂ + b₂": ffn,
        "multi-head self-attention (4 heads)": lambda x: attention(x, x, x, lengths)[0],
        "encoder layer (self-attention + FFN, residuals, LayerNorm)": lambda x: layer(x, lengths)[
            0
        ],
    }
    x = torch.randn(1, positions, size)  # (1, T, D)
    permutation = torch.randperm(positions)
    rows = []
    for name, block in blocks.items():
        with torch.no_grad():
            change = (block(x[:, permutation]) - block(x)[:, permutation]).abs().max()
        # ∂ output (T, D) / ∂ input (T, D) -> (T, D, T, D); block (i, j) is ∂y_i/∂x_j.
        jacobian = torch.autograd.functional.jacobian(lambda y, f=block: f(y[None])[0], x[0])
        same = torch.eye(positions, dtype=torch.bool)[:, None, :, None].expand_as(jacobian)
        rows.append(
            PositionwiseRow(
                block=name,
                permutation_max_change=float(change),
                cross_position_fraction=float(jacobian[~same].norm() / jacobian.norm()),
            )
        )
    return rows


# ---- the toy task: logged diagnostics of training runs ------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    run: str
    attention: str
    model: str  # "hidden 16" (RNN) or "Transformer, d_model 128"
    first_step: int
    first: dict[str, float]  # attn/* at the first logged training step
    validation: dict[str, float]  # attn/* and val/* at the last validation

    @property
    def head_layers(self) -> list[str]:
        """The ``attn/head_js/L<l>`` keys this run logged (Transformers only), in layer order."""
        keys = [key for key in self.validation if key.startswith("attn/head_js/L")]
        return sorted(keys, key=lambda key: int(key.rsplit("L", 1)[1]))


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

    # The names of the config options (files from before GeneralAttention say Multiplicative...).
    attention = str(config.attention._target_).rsplit(".", 1)[-1]
    if attention == "DotProductAttention":
        attention = "scaled_dot, q·k/√d" if config.attention.get("scaled", True) else "dot, q·k"
    else:
        attention = {
            "AdditiveAttention": "additive, w_vᵀtanh(W_q q + W_k k)",
            "GeneralAttention": "general, qᵀWk",
            "MultiplicativeAttention": "general, qᵀWk",
        }.get(attention, attention)
    model = (
        f"Transformer, d_model {config.model.d_model}"
        if "d_model" in config.model
        else f"hidden {config.model.hidden_size}"
    )
    return RunSummary(
        run=str(run_dir),
        attention=attention,
        model=model,
        first_step=int(train_rows[0]["step"]) + 1,  # Lightning's step column counts from 0
        first=numbers(train_rows[0], ("attn/",)),
        validation=numbers(val_rows[-1], ("attn/", "val/")),
    )
