"""Every attention switch's training step and decoding against its decoder's default, in-process,
alternating (issue 68): the ratio a comparison of two switches pays in speed.

For each setting (``train.py`` overrides), the config's model is built once (``model.kernels``
as the config says: ``auto`` uses the C kernels where they apply), and one training step
(forward, backward, Adam; dropout off) on a fixed random batch of the toy task's shape (B 64,
S 18, T 19) is timed, then greedy and beam-5 search of that batch. Rounds alternate the
settings, so that the machine's drift is shared; each figure is the median over rounds of a
round's mean. Ratios are the default's time over the setting's (above 1: faster).

With ``--train-py STEPS`` each setting instead trains through ``train.py`` on the toy task for
STEPS updates (one thread, no test), one run at a time, the settings alternating round by round;
each figure is the median over rounds of the run's training tokens/s (the run's
``summary.json``), and the ratio is the setting's over its decoder's default (above 1: faster).

    python -m benchmarks.switch_speed --out docs/benchmark/switch_speed.json
    python -m benchmarks.switch_speed --train-py 100 --rounds 3 \
        --out docs/benchmark/switch_speed_train_py.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.benchmark import machine
from benchmarks.step_benchmark import Step, build_dropout_free, compose, random_batch
from seq2seq.cli import int_at_least
from seq2seq.data.tokenization import BOS_ID, EOS_ID, PAD_ID
from seq2seq.search import beam_search, greedy_search
from seq2seq.training.loss import DecoderLoss

BAHDANAU: tuple[str, ...] = ()
LUONG = ("model.decoder=luong", "attention=dot")
TRANSFORMER = ("model=transformer",)
# (decoder's default, its settings): each setting's overrides, added to the default's.
SETTINGS: dict[tuple[str, ...], list[tuple[str, ...]]] = {
    BAHDANAU: [
        (),
        ("model.kernels=off",),
        ("attention=dot",),
        ("attention=scaled_dot",),
        ("attention=general",),
        ("attention.temperature=2.0",),
        ("attention.normalizer=sparsemax",),
        ("attention.normalizer=entmax15",),
        ("attention=scaled_dot", "attention.normalizer=sparsemax"),
        ("attention.normalizer=entmax", "attention.alpha=1.3"),
        ("attention.window=local_m", "attention.window_size=3"),
        ("attention.window=local_p", "attention.window_size=3"),
        ("attention.key_bias=true",),
        ("attention.coverage=true",),
        ("attention=scaled_dot", "attention.coverage=true", "attention.normalizer=entmax15"),
        ("attention.normalizer=entmax", "attention.alpha=learnable"),
        ("model.num_heads=4",),
        ("model.num_heads=4", "attention=scaled_dot", "attention.normalizer=sparsemax"),
        ("model.num_heads=4", "attention.coverage=true"),
    ],
    LUONG: [
        (),
        ("model.kernels=off",),
        ("attention=scaled_dot",),
        ("attention=general",),
        ("attention=additive",),
        ("attention.normalizer=sparsemax",),
        ("attention.normalizer=entmax15",),
        ("attention.normalizer=entmax", "attention.alpha=learnable"),
        ("attention.window=local_m", "attention.window_size=3"),
        ("attention.key_bias=true",),
        ("attention.coverage=true",),
        ("model.input_feeding=true",),
        ("model.input_feeding=true", "attention.normalizer=sparsemax"),
        ("model.num_heads=4",),
        ("model.num_heads=4", "model.input_feeding=true"),
        ("attention.window=local_p", "attention.window_size=3"),
        ("attention=additive", "attention.layer_norm=true"),
        ("model.num_heads=4", "attention.coverage=true"),
    ],
    # Not a target of issue 68: the normalizers against SDPA's fused softmax.
    TRANSFORMER: [
        (),
        ("attention.normalizer=sparsemax",),
        ("attention.normalizer=entmax15",),
    ],
}
# Several heads on the reference path beside the fused one, each against its own path's default:
# the ratio the formula itself costs where no kernel is involved (--heads-reference).
BAHDANAU_REFERENCE = ("model.kernels=off",)
LUONG_REFERENCE = (*LUONG, "model.kernels=off")
HEADS = {
    BAHDANAU: [(), ("model.num_heads=4",), ("model.num_heads=4", "attention.coverage=true")],
    LUONG: [(), ("model.num_heads=4",), ("model.num_heads=4", "model.input_feeding=true")],
}
HEADS_REFERENCE = {
    BAHDANAU_REFERENCE: HEADS[BAHDANAU], BAHDANAU: HEADS[BAHDANAU],
    LUONG_REFERENCE: HEADS[LUONG], LUONG: HEADS[LUONG],
}  # fmt: skip
ROOT = Path(__file__).resolve().parents[1]
VOCABULARY = 54  # the reverse task's
BATCH, LENGTH = 64, 18


class Setting:
    """One setting's model, its training step and its searches on the shared batch."""

    def __init__(self, overrides: Sequence[str], batch: dict[str, torch.Tensor]) -> None:
        self.overrides = list(overrides)
        config = compose([*self.overrides, "trainer=cpu"])
        self.model = build_dropout_free(config, VOCABULARY, "cpu")
        never_ends(self.model)
        self.step = Step(self.model, DecoderLoss(self.model.decoder), batch, lr=1e-4, grad_clip=1.0)
        self.batch = batch

    def train(self) -> None:
        self.model.train()
        self.step()

    def greedy(self) -> None:
        self.model.eval()
        with torch.no_grad():
            greedy_search(
                self.model, self.batch["src"], self.batch["src_lens"], BOS_ID, EOS_ID, PAD_ID,
                max_len_a=1.0, max_len_b=1,
            )  # fmt: skip

    def beam5(self) -> None:
        self.model.eval()
        with torch.no_grad():
            beam_search(
                self.model, self.batch["src"], self.batch["src_lens"], BOS_ID, EOS_ID, PAD_ID,
                beam_size=5, max_len_a=1.0, max_len_b=1,
            )  # fmt: skip


def never_ends(model: torch.nn.Module) -> None:
    """Take EOS out of ``model``'s reach (its output bias at -10⁴), so that every search runs to
    its maximum length: an untrained model's EOS would otherwise end some settings' searches
    early and others' late, and their times would compare step counts, not steps. (A training
    step moves the bias by about the learning rate: it stays out of reach.)"""
    decoder = model.decoder
    bias = getattr(getattr(decoder, "output_layer", None), "bias", None)
    bias = getattr(decoder, "output_bias", None) if bias is None else bias
    assert isinstance(bias, torch.Tensor)
    with torch.no_grad():
        bias[EOS_ID] = -1e4


class ElementwiseCounter(TorchDispatchMode):
    """The element-wise work of what runs inside it: the elements every ATen op writes, but the
    matrix products' (``FlopCounterMode`` counts those) and views' (no arithmetic). One unit an
    element whatever the op (an add, a tanh, an exp, a sort's element): a count of the work
    the GEMM FLOPs leave out, not a FLOP count."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not func.is_view and func.overloadpacket not in MATRIX_PRODUCTS:
            leaves = out if isinstance(out, tuple | list) else (out,)
            self.elements += sum(t.numel() for t in leaves if isinstance(t, torch.Tensor))
        return out


MATRIX_PRODUCTS = {
    torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm,
    torch.ops.aten.matmul, torch.ops.aten.linear,
}  # fmt: skip


def step_work(overrides: Sequence[str], batch: dict[str, torch.Tensor]) -> dict[str, int]:
    """One training step's (forward and backward) work on the reference path: its matrix
    products' FLOPs as ``torch.utils.flop_counter`` counts them (the GEMMs and bmm's, 2 per
    multiply-add), ``gemm``, and the element-wise work they leave out (tanh, exp, a sort,
    α-entmax's bisection: ``ElementwiseCounter``), ``elementwise``."""
    config = compose([*overrides, "model.kernels=off", "trainer=cpu"])
    model = build_dropout_free(config, VOCABULARY, "cpu").train()
    loss = DecoderLoss(model.decoder)
    with FlopCounterMode(display=False) as counter, ElementwiseCounter() as elementwise:
        Step(model, loss, batch, lr=1e-4, grad_clip=1.0).loss_and_grads()
    return {"gemm": int(counter.get_total_flops()), "elementwise": elementwise.elements}


def search_flops(overrides: Sequence[str], batch: dict[str, torch.Tensor]) -> dict[str, int]:
    """``step_work`` for greedy and beam-5 search of the batch (``Setting.greedy``,
    ``Setting.beam5``): their matrix products on the reference path, and their element-wise
    work (``greedy_elementwise``, ``beam5_elementwise``)."""
    setting = Setting([*overrides, "model.kernels=off"], batch)
    flops = {}
    for kind in ("greedy", "beam5"):
        with FlopCounterMode(display=False) as counter, ElementwiseCounter() as elementwise:
            getattr(setting, kind)()
        flops[kind] = int(counter.get_total_flops())
        flops[f"{kind}_elementwise"] = elementwise.elements
    return flops


def mean_seconds(action: Callable[[], None], repeats: int) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        action()
    return (time.perf_counter() - started) / repeats


DECODERS = {BAHDANAU: "bahdanau", LUONG: "luong", TRANSFORMER: "transformer"}
NAMES = {
    **DECODERS, BAHDANAU_REFERENCE: "bahdanau, reference path",
    LUONG_REFERENCE: "luong, reference path",
}  # fmt: skip


def measure(
    rounds: int,
    steps: int,
    searches: int,
    decoders: Sequence[str] = tuple(DECODERS.values()),
    blocks: dict[tuple[str, ...], list[tuple[str, ...]]] = SETTINGS,
) -> list[dict[str, Any]]:
    """Each block's settings against its first (the block's default), alternating."""
    batch = random_batch(BATCH, LENGTH, VOCABULARY, "cpu")
    rows = []
    for default, settings in blocks.items():
        if NAMES[default].split(",")[0] not in decoders:
            continue
        built = [Setting([*default, *extra], batch) for extra in settings]
        for setting in built:  # warm-up: the library's build, allocator, first-call costs
            setting.train(), setting.greedy(), setting.beam5()
        times: dict[str, list[list[float]]] = {"train": [], "greedy": [], "beam5": []}
        for _ in range(rounds):
            for kind, count in (("train", steps), ("greedy", searches), ("beam5", searches)):
                times[kind].append(
                    [mean_seconds(getattr(setting, kind), count) for setting in built]
                )
        work = [
            {**step_work(extra, batch), **search_flops(extra, batch)}
            for extra in (setting.overrides for setting in built)
        ]
        for index, extra in enumerate(settings):
            row: dict[str, Any] = {
                "decoder": NAMES[default],
                "setting": " ".join(extra) or "(default)",
            }
            names = {
                "gemm": "gemm_flops_added", "elementwise": "elementwise_added",
                "greedy": "greedy_flops_added", "greedy_elementwise": "greedy_elementwise_added",
                "beam5": "beam5_flops_added", "beam5_elementwise": "beam5_elementwise_added",
            }  # fmt: skip
            for key, name in names.items():
                row[name] = round(work[index][key] / work[0][key] - 1, 4)
            for kind, per_round in times.items():
                median = statistics.median(round_[index] for round_ in per_round)
                base = statistics.median(round_[0] for round_ in per_round)
                row[f"{kind}_ms"] = round(1000 * median, 2)
                row[f"{kind}_ratio"] = round(base / median, 3)
            rows.append(row)
    return rows


def train_py_tokens_per_s(
    overrides: Sequence[str], steps: int, directory: Path, checkout: Path = ROOT
) -> float:
    """One short ``train.py`` run of ``overrides`` in ``directory``: ``steps`` updates on one
    thread, no test, no W&B; its training tokens/s (the run's ``summary.json``). ``checkout``:
    the repository whose ``train.py`` and package run (its directory comes first on the path,
    the script's)."""
    command = [
        sys.executable, str(checkout / "train.py"), *overrides, f"+trainer.max_steps={steps}",
        "trainer.max_epochs=1000", "test_after_training=false", "threads=1", "logger=csv",
        "trainer.enable_progress_bar=false", f"run_dir={directory}",
    ]  # fmt: skip
    finished = subprocess.run(
        command, capture_output=True, text=True, cwd=checkout,
        env={**os.environ, "WANDB_MODE": "offline"},
    )  # fmt: skip
    if finished.returncode != 0:
        raise RuntimeError(f"train.py {' '.join(overrides)} failed:\n{finished.stderr[-3000:]}")
    return float(json.loads((directory / "summary.json").read_text())["train_tokens_per_s"])


def measure_train_py(
    rounds: int,
    steps: int,
    decoders: Sequence[str] = tuple(DECODERS.values()),
    blocks: dict[tuple[str, ...], list[tuple[str, ...]]] = SETTINGS,
) -> list[dict[str, Any]]:
    """Every setting of ``decoders`` through ``train.py`` (``train_py_tokens_per_s``), the
    settings alternating within each round: the median tokens/s and its ratio to the default's."""
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for default, settings in blocks.items():
            if DECODERS[default] not in decoders:
                continue
            measured: list[list[float]] = [[] for _ in settings]
            for round_ in range(rounds):
                for index, extra in enumerate(settings):
                    directory = Path(scratch) / DECODERS[default] / f"{round_}-{index}"
                    measured[index].append(
                        train_py_tokens_per_s([*default, *extra], steps, directory)
                    )
            base = statistics.median(measured[0])
            for extra, values in zip(settings, measured, strict=True):
                median = statistics.median(values)
                rows.append({
                    "decoder": NAMES[default],
                    "setting": " ".join(extra) or "(default)",
                    "tokens_per_s": [round(value) for value in values],
                    "median_tokens_per_s": round(median),
                    "ratio": round(median / base, 3),
                })  # fmt: skip
    return rows


def only(
    blocks: dict[tuple[str, ...], list[tuple[str, ...]]], texts: Sequence[str] | None
) -> dict[tuple[str, ...], list[tuple[str, ...]]]:
    """``blocks`` with only the settings whose overrides are one of ``texts`` or, for a text no
    setting is exactly, contain it (each block's default first, what the ratios divide by); all
    of them without ``texts``. A text that matches nothing is refused."""
    if not texts:
        return blocks
    written = {" ".join(extra) for settings in blocks.values() for extra in settings[1:]}
    unmatched = [text for text in texts if not any(text in setting for setting in written)]
    if unmatched:
        raise SystemExit(
            f"--only {' '.join(unmatched)}: no setting's overrides contain it; the settings are "
            f"{'; '.join(sorted(written))}."
        )

    def chosen(extra: tuple[str, ...]) -> bool:
        setting = " ".join(extra)
        return any(setting == t if t in written else t in setting for t in texts)

    return {
        default: [settings[0], *(extra for extra in settings[1:] if chosen(extra))]
        for default, settings in blocks.items()
    }


def train_py_markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| decoder | setting | train.py tokens/s (median) | ratio |",
        "|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['decoder']} | `{row['setting']}` | {row['median_tokens_per_s']:,} "
            f"| {row['ratio']} |"
        )
    return "\n".join(lines)


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| decoder | setting | train: work added | step ms | ratio "
        "| greedy: work added | ms | ratio | beam 5: work added | ms | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def added(row: dict[str, Any], gemm: str, elementwise: str) -> str:
        """GEMM FLOPs / element-wise work added, e.g. ``+8.6% / +12%``."""
        return f"{row.get(gemm, 0):+.1%} / {row.get(elementwise, 0):+.0%}"

    for row in rows:
        lines.append(
            f"| {row['decoder']} | `{row['setting']}` "
            f"| {added(row, 'gemm_flops_added', 'elementwise_added')} "
            f"| {row['train_ms']} | {row['train_ratio']} "
            f"| {added(row, 'greedy_flops_added', 'greedy_elementwise_added')} "
            f"| {row['greedy_ms']} | {row['greedy_ratio']} "
            f"| {added(row, 'beam5_flops_added', 'beam5_elementwise_added')} "
            f"| {row['beam5_ms']} | {row['beam5_ratio']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int_at_least(1), default=5, help="alternations (5)")
    parser.add_argument("--steps", type=int_at_least(1), default=5, help="per round (5)")
    parser.add_argument("--searches", type=int_at_least(1), default=3, help="per round (3)")
    parser.add_argument(
        "--decoders", nargs="+", choices=list(DECODERS.values()), default=list(DECODERS.values()),
        help="the decoders whose settings to measure (all)",
    )  # fmt: skip
    parser.add_argument(
        "--train-py", type=int_at_least(1), metavar="STEPS",
        help="time short train.py runs of STEPS updates instead of in-process steps",
    )  # fmt: skip
    parser.add_argument(
        "--heads-reference", action="store_true",
        help="several heads on the reference path and fused, each against its path's default",
    )  # fmt: skip
    parser.add_argument(
        "--only", nargs="+", metavar="TEXT",
        help="only these settings (exactly, else those whose overrides contain the text), e.g. "
        "model.num_heads=4 or num_heads (all)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="write the report (JSON) here")
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    asked = {
        "rounds": args.rounds, "only": args.only, "decoders": args.decoders,
        "heads_reference": args.heads_reference, "threads": torch.get_num_threads(),
    }  # fmt: skip
    if args.train_py is not None:
        blocks = only(SETTINGS, args.only)
        rows = measure_train_py(args.rounds, args.train_py, args.decoders, blocks)
        asked["threads"] = 1  # train.py's threads=1
        report = {
            "machine": machine(), **asked, "train_py_steps": args.train_py,
            "statistic": "median of the runs' training tokens/s; ratio to the decoder's default",
            "rows": rows,
        }  # fmt: skip
        print(train_py_markdown(rows))
    else:
        blocks = only(HEADS_REFERENCE if args.heads_reference else SETTINGS, args.only)
        rows = measure(args.rounds, args.steps, args.searches, args.decoders, blocks)
        counts = {"steps": args.steps, "searches": args.searches}
        report = {
            "machine": machine(), **asked, **counts, "batch": BATCH, "source_length": LENGTH,
            "target_length": LENGTH + 1,
            "vocabulary": VOCABULARY,
            "statistic": "median over the rounds of a round's mean; ratio = the block's "
            "default's median / the setting's",
            "rows": rows,
        }  # fmt: skip
        print(markdown(rows))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
