"""The training-step benchmark (eager, torch.compile, CUDA graphs): its batches, its loss, its
checks and its command line. The CUDA-graph variants need a GPU and are refused without one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.step_benchmark import (
    Step,
    build_dropout_free,
    check_variants,
    compose,
    random_batch,
    run_step_benchmark,
)
from seq2seq.data.tokenization import BOS_ID, EOS_ID, PAD_ID
from seq2seq.errors import ConfigError
from seq2seq.training.loss import DecoderLoss

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.hidden_size=16", "model.embedding_size=8", "data.batch_size=6", "threads=1"]


def test_random_batch_is_padded_as_the_data_module_pads() -> None:
    batch = random_batch(batch_size=7, length=9, vocab_size=20, device="cpu")
    src, lens, tgt_in, tgt_out = batch["src"], batch["src_lens"], batch["tgt_in"], batch["tgt_out"]
    assert src.shape == (7, 9) and tgt_in.shape == tgt_out.shape == (7, 10)
    assert lens.max() == 9 and lens.min() == 1  # both extremes, so the shape is really used
    positions = torch.arange(10)
    assert torch.equal(src != PAD_ID, positions[None, :9] < lens[:, None])
    assert (tgt_in[:, 0] == BOS_ID).all()
    assert torch.equal(tgt_out.gather(1, lens[:, None])[:, 0], torch.full((7,), EOS_ID))
    assert torch.equal(tgt_out != PAD_ID, positions[None, :] <= lens[:, None])  # + EOS
    # Teacher forcing: the decoder reads at t + 1 what it had to predict at t.
    inside = positions[None, :9] < lens[:, None]
    assert torch.equal(tgt_in[:, 1:][inside], tgt_out[:, :-1][inside])


def test_a_step_updates_the_weights_and_keeps_gradients_in_their_own_buffers() -> None:
    config = compose(TINY)
    model = build_dropout_free(config, vocab_size=20, device="cpu")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    step = Step(model, DecoderLoss(model.decoder), random_batch(6, 8, 20, "cpu"), 1e-3, 1.0)
    buffers = {name: p.grad for name, p in model.named_parameters()}
    step()
    assert all(p.grad is buffers[name] for name, p in model.named_parameters())
    assert all(not torch.equal(p, before[name]) for name, p in model.named_parameters())


def test_eager_against_eager_differs_by_nothing() -> None:
    report = run_step_benchmark(
        TINY, ["eager"], "cpu", [5], vocab_size=20, warmup=1, steps=1, chunks=2
    )
    (row,) = report["rows"]
    assert row["loss_rel_diff"] == 0 and row["max_grad_rel_diff"] == 0
    assert row["ms_per_step"] > 0 and row["tgt_tok_per_s"] > 0
    assert report["decoder"] == "seq2seq.models.BahdanauDecoder"


@pytest.mark.slow
@pytest.mark.parametrize("decoder", ["bahdanau", "luong"])
def test_compiled_step_computes_what_eager_does(decoder: str) -> None:
    report = run_step_benchmark(
        [*TINY, f"model.decoder={decoder}"],
        ["eager", "compile"],
        "cpu",
        [4],
        vocab_size=20,
        warmup=1,
        steps=1,
        chunks=1,
    )
    compiled = report["rows"][1]
    assert "error" not in compiled, compiled
    assert compiled["loss_rel_diff"] < 1e-5 and compiled["max_grad_rel_diff"] < 1e-4


def test_unknown_and_gpu_only_variants_are_refused_on_the_cpu() -> None:
    with pytest.raises(ConfigError, match="unknown --variants fast"):
        check_variants(["eager", "fast"], "cpu")
    with pytest.raises(ConfigError, match="need --device cuda"):
        check_variants(["cudagraphs"], "cpu")


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/benchmark_step.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_script_writes_the_report_and_its_table(tmp_path: Path) -> None:
    out, table = tmp_path / "step.json", tmp_path / "step.md"
    completed = run_script(
        "--json", str(out), "--markdown", str(table), "--variants", "eager", "--lengths", "3,5",
        "--steps", "1", "--chunks", "1", "--warmup", "1", "--", *TINY, "model.decoder=luong",
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [row["length"] for row in report["rows"]] == [3, 5]
    assert report["decoder"] == "seq2seq.models.LuongDecoder"
    assert "| 5 | eager |" in table.read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--variants", "cudagraphs"], "need --device cuda"),
        (["--device", "cuda", "--variants", "eager"], "sees no GPU"),
        (["--lengths", "ten"], "--lengths must be comma-separated integers"),
    ],
)
def test_bad_arguments_get_one_paragraph_and_no_traceback(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    completed = run_script("--json", str(tmp_path / "out.json"), *args, "--", *TINY)
    assert completed.returncode == 2
    assert expected in completed.stderr
    assert "Traceback" not in completed.stderr
