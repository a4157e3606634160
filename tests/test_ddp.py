"""DDP on two CPU processes (gloo): exact pooled metrics, one run directory written by rank zero;
and mixed precision."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from seq2seq.analysis.metrics import corpus_metrics
from seq2seq.data.datamodule import Seq2SeqDataModule
from seq2seq.pipeline import load_checkpoint, scoring_config
from seq2seq.training.distributed import hydra_overrides_for_rank, is_nonzero_rank_from_env
from tests.configs import epoch_target_tokens, evaluate_script, write_toy_files
from tests.scoring import SCORING_FUNCTIONS
from tests.test_pipeline import compose_config, run_training

ROOT = Path(__file__).resolve().parents[1]
# 101 validation sentences in batches of 16: 7 batches, so rank 1 gets a repeated batch.
SIZES = {"train": 640, "val": 101, "test": 40}


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    outputs = tmp_path_factory.mktemp("outputs")
    run_dir = outputs / "run"
    completed = subprocess.run(
        [
            sys.executable, "train.py", "trainer=ddp", "trainer.accelerator=cpu",
            "trainer.devices=2", "trainer.max_epochs=1", "trainer.enable_progress_bar=false",
            "logger=csv", "threads=1", f"data.train_size={SIZES['train']}",
            f"data.val_size={SIZES['val']}", f"data.test_size={SIZES['test']}",
            "data.eval_batch_size=16", "data.batch_size=32", "model.hidden_size=32",
            "model.embedding_size=16", f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    return run_dir, completed.stdout + completed.stderr


def last_logged(run_dir: Path, column: str) -> float:
    with open(run_dir / "metrics.csv", newline="") as file:
        values = [float(row[column]) for row in csv.DictReader(file) if row.get(column)]
    return values[-1]


def test_ddp_val_bleu_equals_single_process_evaluate_script(
    ddp_run: tuple[Path, str], tmp_path: Path
) -> None:
    """The hypotheses first, then the score: on a barely trained model a near-tie argmax could
    flip between summation orders, so both sides run on one thread (the DDP run has threads=1)
    in batches of the same size, and a difference shows as the sentence that differs."""
    run_dir, _ = ddp_run
    data = write_toy_files(tmp_path / "toy", SIZES["train"], SIZES["val"], SIZES["test"])
    hypotheses = tmp_path / "hypotheses.txt"
    single_process = evaluate_script(run_dir / "checkpoints/last.ckpt", data, "val", hypotheses)
    ddp = (run_dir / "val_hypotheses.txt").read_text().splitlines()
    assert hypotheses.read_text().splitlines() == ddp
    assert last_logged(run_dir, "val/bleu") == pytest.approx(single_process, abs=1e-3)


def test_ddp_loss_chrf_entropy_and_aer_equal_a_single_process_evaluation(
    ddp_run: tuple[Path, str],
) -> None:
    run_dir, _ = ddp_run
    module = load_checkpoint(run_dir / "checkpoints/last.ckpt")
    config = compose_config(run_dir, [f"data.{split}_size={n}" for split, n in SIZES.items()])
    datamodule = Seq2SeqDataModule(
        instantiate(config.data.corpus),
        src_tokenizer=module.src_tokenizer,
        tgt_tokenizer=module.tgt_tokenizer,
        eval_batch_size=64,  # other batches than the DDP run's: the metrics must not care
    )
    datamodule.setup()
    alignments = datamodule.alignments["val"]
    module._gold_alignments = lambda split: alignments  # type: ignore[method-assign]
    scores = [s for batch in datamodule.val_dataloader() for s in module.score_batch(batch, "val")]
    expected = corpus_metrics(sorted(scores, key=lambda s: s.index), "none")
    for name in ["loss", "chrf", "entropy", "aer"]:
        assert last_logged(run_dir, f"val/{name}") == pytest.approx(expected[name], rel=1e-4)


def test_only_rank_zero_writes_one_run_directory(ddp_run: tuple[Path, str]) -> None:
    run_dir, output = ddp_run
    assert [path.name for path in run_dir.parent.iterdir()] == ["run"]  # no second run dir
    names = {path.name for path in run_dir.iterdir()}
    assert not any("ddp_process" in name for name in names)  # no rank-1 Hydra log
    assert {"config.yaml", "metrics.csv", "checkpoints", "summary.json"} <= names
    # Pooled: one line per validation sentence, though rank 1 decoded a repeated batch.
    assert len((run_dir / "val_hypotheses.txt").read_text().splitlines()) == SIZES["val"]
    assert "32 sentences per process x 2 process(es)" in output
    # The training totals are summed over both ranks: the epoch's every target token, once.
    sizes = [f"data.{split}_size={size}" for split, size in SIZES.items()]
    epoch = epoch_target_tokens(compose_config(run_dir, sizes))
    assert json.loads((run_dir / "summary.json").read_text())["train_tokens"] == epoch


def test_nonzero_ranks_get_no_hydra_files(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    assert not is_nonzero_rank_from_env() and hydra_overrides_for_rank([]) == []
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert not is_nonzero_rank_from_env()
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert hydra_overrides_for_rank(["a=b"]) == [
        "hydra.output_subdir=null",
        "hydra/job_logging=stdout",
    ]
    # What the user or Lightning's launcher already set is left alone.
    assert hydra_overrides_for_rank(["hydra.output_subdir=null"]) == ["hydra/job_logging=stdout"]


@pytest.mark.parametrize("precision", ["bf16-mixed"])
def test_mixed_precision_trains_without_nans(tmp_path: Path, precision: str) -> None:
    """CPU autocast runs bf16 only; 16-mixed needs a GPU (the masked softmax is tested in every
    dtype in test_attention.py)."""
    result = run_training(
        tmp_path, [f"trainer.precision={precision}", "trainer.max_epochs=1", "attention=additive"]
    )
    for name in ["train/loss", "val/loss", "val/bleu", "val/entropy"]:
        assert math.isfinite(result["metrics"][name]), name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("attention", SCORING_FUNCTIONS)
def test_half_precision_autocast_gives_finite_loss_and_gradients(
    tiny_checkpoint: Path, dtype: torch.dtype, attention: str
) -> None:
    """What 16-mixed does on a GPU, run with CPU autocast: padded batches stay finite, the loss
    is float32."""
    from seq2seq.data.tokenization import PAD_ID
    from seq2seq.inference.bundle import build_model

    torch.manual_seed(0)
    config = dict(load_checkpoint(tiny_checkpoint).model_config)
    chosen = compose_config(Path("."), [f"attention={attention}"]).attention
    config["attention"] = scoring_config(chosen)
    model = build_model(config).train()
    src = torch.randint(4, config["src_vocab_size"], (3, 7))
    src_lens = torch.tensor([7, 4, 1])  # padding, and a one-token sentence
    tgt_in = torch.randint(4, config["tgt_vocab_size"], (3, 5))
    tgt_out = tgt_in.clone()
    tgt_out[2, 2:] = PAD_ID
    with torch.autocast("cpu", dtype=dtype):
        logits, _ = model(src, src_lens, tgt_in, need_weights=False)
        loss = torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID
        )
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is None or torch.isfinite(parameter.grad).all(), name


def test_ddp_config_composes_for_gpus_and_nodes(tmp_path: Path) -> None:
    config = compose_config(tmp_path, ["trainer=ddp", "trainer.devices=4", "trainer.num_nodes=2"])
    assert (config.trainer.strategy, config.trainer.devices, config.trainer.num_nodes) == (
        "ddp",
        4,
        2,
    )
    assert config.trainer.use_distributed_sampler is False  # our sampler shards by rank
    assert os.environ.get("WANDB_MODE") == "disabled"  # conftest keeps W&B off in tests
