"""One training step of a config's model in several execution modes: eager, ``torch.compile``
and CUDA graphs, on batches of one fixed shape.

Shape legend: B batch, S source length, T target length, H hidden size, M memory size.

The Bahdanau decoder steps its cell and attention T times in Python, so on a GPU each step is a
handful of small kernels whose launches, not their arithmetic, set the pace. Fusing them
(``torch.compile``) or replaying all of them as one recorded graph (CUDA graphs) attacks exactly
that overhead, but both need fixed shapes (a graph records one shape; ``torch.compile`` unrolls
the loop for one T), which is why this measures fixed-shape batches rather than ``train.py``'s
length-bucketed ones.

Each variant runs the same step: the encoder (eager: packing the source needs its lengths on the
host), then the decoder and the summed token cross-entropy (the part each variant executes
differently), backward, gradient clipping and Adam. ``VARIANTS``:

- ``eager``: plain PyTorch;
- ``compile``: the decoder and loss through ``torch.compile`` (Inductor's fused kernels);
- ``compile-cudagraphs``: the same with ``mode="reduce-overhead"`` (Inductor, then CUDA graphs);
- ``cudagraphs``: the decoder and loss recorded by ``torch.cuda.make_graphed_callables``, forward
  and backward each one graph, the kernels eager PyTorch would launch (``DecoderGraphs``, what
  ``train.py cuda_graphs=true`` trains with).

Dropout is off (``build_dropout_free``), and after timing every variant is checked against
eager on the same batch and weights: the relative difference of the loss and of the gradient of
every parameter (``max_grad_rel_diff``).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from benchmarks.benchmark import compose_config, machine, synchronize
from seq2seq.cli import check_device
from seq2seq.data.tokenization import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS
from seq2seq.errors import ConfigError
from seq2seq.models.model import Seq2Seq
from seq2seq.training.cuda_graphs import DecoderGraphs, materialize_grads
from seq2seq.training.loss import DecoderLoss, teacher_forced_loss

VARIANTS = ("eager", "compile", "compile-cudagraphs", "cudagraphs")
GPU_ONLY = ("compile-cudagraphs", "cudagraphs")
FIRST_TOKEN = len(SPECIAL_TOKENS)  # the ids below are PAD, UNK, BOS and EOS


def random_batch(
    batch_size: int, length: int, vocab_size: int, device: str, seed: int = 0
) -> dict[str, Tensor]:
    """A batch of B sentences of lengths in [length // 5, length] (one of each extreme), target
    as long as its source, padded to S = length and T = length + 1 (BOS / EOS)."""
    generator = torch.Generator().manual_seed(seed)
    lens = torch.randint(max(1, length // 5), length + 1, (batch_size,), generator=generator)
    lens[0], lens[-1] = length, max(1, length // 5)
    src = torch.randint(FIRST_TOKEN, vocab_size, (batch_size, length), generator=generator)
    tgt = torch.randint(FIRST_TOKEN, vocab_size, (batch_size, length), generator=generator)
    positions = torch.arange(length + 1)  # (T,)
    src = src.masked_fill(positions[None, :length] >= lens[:, None], PAD_ID)  # (B, S)
    tgt_body = torch.cat([tgt, torch.full((batch_size, 1), PAD_ID)], dim=1)  # (B, T)
    tgt_body = tgt_body.masked_fill(positions[None, :] >= lens[:, None], PAD_ID)
    tgt_in = torch.cat([torch.full((batch_size, 1), BOS_ID), tgt_body[:, :-1]], dim=1)  # (B, T)
    tgt_out = tgt_body.scatter(1, lens[:, None], EOS_ID)  # EOS after the last real token
    batch = {"src": src, "src_lens": lens, "tgt_in": tgt_in, "tgt_out": tgt_out}
    return {name: tensor.to(device) for name, tensor in batch.items()}


def compose(overrides: Sequence[str]) -> Any:
    """The config ``train.py OVERRIDES`` would run."""
    from omegaconf import OmegaConf

    with tempfile.TemporaryDirectory(prefix="seq2seq-step-") as scratch:
        return OmegaConf.create(compose_config(overrides, Path(scratch) / "run"))


def build_dropout_free(config: Any, vocab_size: int, device: str) -> Seq2Seq:
    """``config``'s model with a vocabulary of ``vocab_size`` on both sides, seeded by the config,
    with dropout off: a compiled function or a recorded graph then computes what eager does, so
    the variants can be checked against it. (In the Bahdanau decoder dropout acts twice per batch,
    outside the step loop, so leaving it out hardly changes what is being compared.)"""
    from seq2seq.inference.bundle import build_model
    from seq2seq.pipeline import build_model_config

    torch.manual_seed(config.seed)
    model = build_model(build_model_config(config, vocab_size, vocab_size))
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model.to(device)


class Step:
    """One training step whose decoder-and-loss part is ``decode`` (a variant of DecoderLoss)."""

    def __init__(
        self,
        model: Seq2Seq,
        decode: Callable[..., Tensor],
        batch: dict[str, Tensor],
        lr: float,
        grad_clip: float | None,
        graph_trees: bool = False,
    ) -> None:
        """``graph_trees``: ``decode`` was compiled with mode="reduce-overhead"."""
        self.model, self.decode, self.batch, self.grad_clip = model, decode, batch, grad_clip
        self.graph_trees = graph_trees
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        materialize_grads(model)  # zeroed in place at every step, as cuda_graphs=true trains
        self.tokens = int((batch["tgt_out"] != PAD_ID).sum())

    def loss_and_grads(self) -> Tensor:
        """Forward and backward; the gradients are left in the parameters. -> the mean loss."""
        batch = self.batch
        if self.graph_trees:
            # A new step for CUDA graph trees: the last step's outputs, consumed by its backward,
            # may be overwritten.
            torch.compiler.cudagraph_mark_step_begin()
        loss_sum = teacher_forced_loss(
            self.model,
            self.decode,
            batch["src"],
            batch["src_lens"],
            batch["tgt_in"],
            batch["tgt_out"],
        )
        loss = loss_sum / self.tokens
        loss.backward()
        return loss.detach()

    def __call__(self) -> None:
        self.loss_and_grads()
        if self.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)  # the buffers materialize_grads made stay


def make_decode(variant: str, model: Seq2Seq, batch: dict[str, Tensor]) -> Callable[..., Tensor]:
    """The decoder-and-loss function of ``variant`` for batches of ``batch``'s shape."""
    decoder_loss = DecoderLoss(model.decoder)
    if variant == "eager":
        return decoder_loss
    if variant == "compile":
        return torch.compile(decoder_loss, dynamic=False)
    if variant == "compile-cudagraphs":
        return torch.compile(decoder_loss, mode="reduce-overhead", dynamic=False)
    if variant == "cudagraphs":
        return DecoderGraphs(model.decoder)  # what train.py cuda_graphs=true runs
    raise ConfigError(f"unknown step variant {variant!r}; choose from {', '.join(VARIANTS)}.")


def check_variants(variants: Sequence[str], device: str) -> None:
    unknown = [variant for variant in variants if variant not in VARIANTS]
    if unknown:
        raise ConfigError(
            f"unknown --variants {', '.join(unknown)}; choose from {', '.join(VARIANTS)}."
        )
    needs_gpu = [variant for variant in variants if variant in GPU_ONLY]
    if needs_gpu and device != "cuda":
        raise ConfigError(
            f"--variants {', '.join(needs_gpu)} record CUDA graphs and need --device cuda; on "
            f"the CPU choose from {', '.join(v for v in VARIANTS if v not in GPU_ONLY)}."
        )
    check_device(device)


def difference(variant_step: Step, reference: Step) -> dict[str, float]:
    """Relative differences of one forward + backward, dropout off, from the same weights."""
    results = []
    for step in (reference, variant_step):
        step.optimizer.zero_grad(set_to_none=False)
        loss = step.loss_and_grads()
        grads = {}
        for name, parameter in step.model.named_parameters():
            assert parameter.grad is not None  # Step gave each one a buffer (materialize_grads)
            grads[name] = parameter.grad.detach().clone()
        step.optimizer.zero_grad(set_to_none=False)
        results.append((loss, grads))
    (loss_ref, grads_ref), (loss, grads) = results
    worst = max(
        float((grads[name] - grad).norm() / grad.norm().clamp_min(1e-30))
        for name, grad in grads_ref.items()
    )
    return {
        "loss_rel_diff": float((loss - loss_ref).abs() / loss_ref.abs()),
        "max_grad_rel_diff": worst,
    }


def time_steps(step: Step, device: str, steps: int, chunks: int) -> list[float]:
    """Milliseconds per step, one figure per chunk of ``steps`` steps."""
    per_step = []
    for _ in range(chunks):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        per_step.append(1000 * (time.perf_counter() - start) / steps)
    return per_step


def run_step_benchmark(
    overrides: Sequence[str],
    variants: Sequence[str],
    device: str,
    lengths: Sequence[int],
    vocab_size: int = 54,
    warmup: int = 5,
    steps: int = 20,
    chunks: int = 5,
) -> dict[str, Any]:
    """ms per training step and target tokens/s of every variant at every length (S = T - 1);
    see the module doc. ``vocab_size`` 54 is the reverse task's (50 words and 4 specials)."""
    check_variants(variants, device)
    config = compose(overrides)
    batch_size = int(config.data.batch_size)
    rows: list[dict[str, Any]] = []
    for length in lengths:
        batch = random_batch(batch_size, length, vocab_size, device)
        eager_ms: float | None = None
        for variant in variants:
            try:
                row = measure_variant(
                    config, variant, batch, vocab_size, device, warmup, steps, chunks
                )
            except Exception as error:  # a variant that fails is reported, and the rest still run
                row = {"variant": variant, "error": f"{type(error).__name__}: {error}"[:500]}
            row = {"length": length, "batch_size": batch_size, **row}
            if variant == "eager" and "ms_per_step" in row:
                eager_ms = row["ms_per_step"]
            if eager_ms and "ms_per_step" in row:
                row["speedup_vs_eager"] = eager_ms / row["ms_per_step"]
            rows.append(row)
            print(markdown_row(row), flush=True)  # a long run shows its progress
            if variant.startswith("compile"):
                torch._dynamo.reset()  # the next variant compiles from scratch
    return {
        "overrides": list(overrides),
        "device": device,
        "machine": machine(device),
        "decoder": config.model.decoder._target_,
        "attention": config.attention._target_,
        "warmup_steps": warmup,
        "steps": steps,
        "chunks": chunks,
        "rows": rows,
    }


def measure_variant(
    config: Any,
    variant: str,
    batch: dict[str, Tensor],
    vocab_size: int,
    device: str,
    warmup: int,
    steps: int,
    chunks: int,
) -> dict[str, Any]:
    """Time ``variant``'s step on ``batch``, then check it against eager from the same weights."""
    lr, clip = float(config.optim.optimizer.lr), config.optim.grad_clip
    # Every variant starts from the same weights (the config's seed).
    model = build_dropout_free(config, vocab_size, device)
    started = time.perf_counter()
    decode = make_decode(variant, model, batch)
    step = Step(model, decode, batch, lr, clip, graph_trees=variant == "compile-cudagraphs")
    for _ in range(warmup):  # compiles, records or warms up the caches
        step()
    synchronize(device)
    setup_s = time.perf_counter() - started
    times = time_steps(step, device, steps, chunks)
    reference_model = build_dropout_free(config, vocab_size, device)
    reference_model.load_state_dict(model.state_dict())
    reference = Step(reference_model, DecoderLoss(reference_model.decoder), batch, lr, clip)
    ms = statistics.median(times)
    return {
        "variant": variant,
        "ms_per_step": ms,
        "ms_min": min(times),
        "ms_max": max(times),
        "tgt_tok_per_s": 1000 * step.tokens / ms,
        "setup_s": setup_s,
        **difference(step, reference),
    }


def markdown_row(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"| {row['length']} | {row['variant']} | failed: {row['error']} | | | | | |"
    speedup = row.get("speedup_vs_eager")
    return (
        f"| {row['length']} | {row['variant']} | {row['ms_per_step']:.2f} "
        f"({row['ms_min']:.2f}–{row['ms_max']:.2f}) | {row['tgt_tok_per_s']:,.0f} | "
        f"{f'{speedup:.2f}×' if speedup else ''} | {row['setup_s']:.1f} | "
        f"{row['loss_rel_diff']:.1e} | {row['max_grad_rel_diff']:.1e} |"
    )


def markdown(report: dict[str, Any]) -> str:
    """The report as a markdown table."""
    decoder = str(report["decoder"]).rsplit(".", 1)[-1]
    attention = str(report["attention"]).rsplit(".", 1)[-1]
    where = report["machine"].get("gpu") or report["machine"]["cpu"]
    lines = [
        f"{decoder} + {attention}, one training step (forward, backward, clip, Adam) on {where}, "
        f"median of {report['chunks']} × {report['steps']} steps:",
        "",
        "| S = T − 1 | variant | ms / step | target tok/s | vs eager | set-up s | loss rel. diff "
        "| max grad rel. diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [markdown_row(row) for row in report["rows"]]
    return "\n".join(lines) + "\n"
