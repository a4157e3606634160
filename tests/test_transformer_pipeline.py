"""The Transformer, multi-head RNN attention and the small-data training options through the
real config: training, checkpoints, bundles, averaging."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from seq2seq import Translator
from seq2seq.attention import MultiHeadAttention
from seq2seq.errors import ConfigError
from seq2seq.inference.averaging import average_checkpoints, kept_checkpoints
from seq2seq.inference.bundle import export_bundle, load, read_checkpoint
from seq2seq.models import Transformer
from seq2seq.pipeline import train
from tests.configs import TINY_TRANSFORMER, evaluate_script, write_toy_files
from tests.test_pipeline import ATTENTIONS, CONF, ROOT

DATA = [
    "data.train_size=300",
    "data.val_size=40",
    "data.test_size=40",
    "data.batch_size=32",
    "trainer.enable_progress_bar=false",
    "logger=csv",
]
SENTENCES = ["the dog sees a cat .", "my friends do not sing .", ""]


def run(run_dir: Path, overrides: list[str]) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"run_dir={run_dir}", *DATA, *overrides])
    return train(cfg)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_a_transformer_with_every_scoring_function_runs(tmp_path: Path, attention: str) -> None:
    result = run(
        tmp_path, [*TINY_TRANSFORMER, f"attention={attention}", "trainer.fast_dev_run=true"]
    )
    assert result["metrics"]["train/loss"] > 0 and 0 <= result["metrics"]["val/bleu"] <= 100


@pytest.mark.parametrize("decoder", ["bahdanau", "luong"])
def test_multi_head_attention_in_an_rnn_model_runs_and_reloads(
    tmp_path: Path, decoder: str
) -> None:
    result = run(
        tmp_path,
        [
            "model.hidden_size=32", "model.embedding_size=16", f"model.decoder={decoder}",
            "attention=scaled_dot", "model.num_heads=4", "trainer.max_epochs=1",
        ],
    )  # fmt: skip
    trained = load(result["best_checkpoint"])
    attention = trained.model.decoder.attention
    assert isinstance(attention, MultiHeadAttention) and attention.num_heads == 4
    assert trained.model_config["num_heads"] == 4


@pytest.mark.parametrize("model", ["transformer", "rnn"])
def test_the_old_spelling_attention_num_heads_names_the_key_to_use(
    tmp_path: Path, model: str
) -> None:
    """One key for the heads of every attention: attention.num_heads (the RNN models' key before)
    stops the run with a message naming model.num_heads, for either model family."""
    settings = TINY_TRANSFORMER if model == "transformer" else ["model.hidden_size=32"]
    with pytest.raises(
        ConfigError, match=r"attention\.num_heads=4 \(renamed.*model\.num_heads=4"
    ) as e:
        run(tmp_path, [*settings, "attention.num_heads=4", "trainer.fast_dev_run=true"])
    assert "model.hidden_size=256" not in str(e.value)  # the sizes' example is off-topic here


@pytest.mark.parametrize(
    ("settings", "what"),
    [
        (["model=transformer", "model.num_heads=3"], "model.d_model=128"),
        (["model=gru", "model.hidden_size=32", "model.num_heads=3"], "encoder's output size 32"),
        (["model=gru", "model.hidden_size=32", "model.num_heads=0"], "encoder's output size 32"),
        (["model=gru", "model.hidden_size=32", "model.num_heads=true"], "encoder's output size 32"),
    ],
)
def test_heads_that_do_not_divide_the_size_get_one_message(
    tmp_path: Path, settings: list[str], what: str
) -> None:
    with pytest.raises(
        ConfigError, match=rf"model\.num_heads=\w+ must be a positive integer .*{what}"
    ):
        run(tmp_path, [*settings, "trainer.fast_dev_run=true"])


def test_a_transformer_checkpoint_exports_to_a_bundle_that_translates_alike(
    tmp_path: Path,
) -> None:
    """The acceptance: beam-5 translations of the bundle equal the checkpoint's; and the
    small-data options (label smoothing, the warm-up schedule, early stopping, kept checkpoints)
    train with it."""
    result = run(
        tmp_path / "run",
        [
            *TINY_TRANSFORMER, "trainer.max_epochs=3", "optim.label_smoothing=0.1",
            "optim/scheduler=inverse_sqrt", "optim.scheduler.warmup_steps=10",
            "early_stopping.patience=5", "checkpoint.keep_last=2", "checkpoint.keep_best=2",
        ],
    )  # fmt: skip
    checkpoint = Path(result["best_checkpoint"])
    trained = load(checkpoint)
    assert isinstance(trained.model, Transformer)
    bundle = export_bundle(trained, tmp_path / "bundle")
    from_checkpoint = Translator.load(checkpoint).translate(SENTENCES, beam_size=5)
    assert Translator.load(bundle).translate(SENTENCES, beam_size=5) == from_checkpoint
    # Two kept checkpoints of each kind, averaged into one that translates.
    last = kept_checkpoints(tmp_path / "run", "last", 2)
    best = kept_checkpoints(tmp_path / "run", "best", 2)
    assert len(last) == len(best) == 2
    averaged = average_checkpoints(last, tmp_path / "avg.ckpt")
    states = [read_checkpoint(path)["state_dict"] for path in last]
    mean = read_checkpoint(averaged)["state_dict"]
    name = "model.decoder.embedding.weight"
    torch.testing.assert_close(mean[name], (states[0][name] + states[1][name]) / 2)
    assert len(Translator.load(averaged).translate(SENTENCES)) == 3
    with pytest.raises(Exception, match="3 checkpoints asked for"):
        kept_checkpoints(tmp_path / "run", "last", 3)
    # What a validation logs of the heads: AER per head (the toy task's gold alignments) and how
    # differently each layer's heads attend; the maps of every layer and head.
    metrics = result["metrics"]
    assert {"val/aer/L1H1", "val/aer/L1H2"} <= set(metrics)
    assert all(0 <= metrics[name] <= 1 for name in ("val/aer/L1H1", "val/aer/L1H2"))
    assert 0 <= metrics["attn/head_js/L1"] <= math.log(2)
    assert list((tmp_path / "run" / "attention").glob("step-*-heads.png"))


@pytest.mark.parametrize(("heads", "ok"), [("grid", True), ("1,2", True), ("average", True),
                                           ("3,1", False)])  # fmt: skip
def test_translate_plots_a_layer_a_head_or_the_grid(
    transformer_bundle: Path, tmp_path: Path, heads: str, ok: bool
) -> None:
    plot = tmp_path / "attention.png"
    completed = subprocess.run(
        [sys.executable, "scripts/translate.py", "--model", str(transformer_bundle),
         "--attention-plot", str(plot), "--attention-heads", heads],
        input="the dog sees a cat .\n", capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    if ok:
        assert completed.returncode == 0, completed.stderr
        assert plot.stat().st_size > 0 and completed.stdout.count("\n") == 1
    else:
        assert completed.returncode == 2 and "Traceback" not in completed.stderr
        assert "a layer from 1 to 1 and a head from 1 to 2" in completed.stderr


@pytest.fixture(scope="module")
def transformer_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("transformer_run")
    result = run(run_dir, [*TINY_TRANSFORMER, "trainer.max_epochs=1"])
    return export_bundle(load(result["best_checkpoint"]), run_dir / "bundle")


@pytest.mark.slow  # DDP end to end; tests/test_ddp.py covers DDP in the default suite
def test_a_transformer_trains_under_ddp_on_two_cpu_processes(tmp_path: Path) -> None:
    """Two ranks, one run directory; val BLEU over all ranks equals the evaluate script's in one
    process."""
    run_dir = tmp_path / "run"
    completed = subprocess.run(
        [
            sys.executable, "train.py", "trainer=ddp", "trainer.accelerator=cpu",
            "trainer.devices=2", "trainer.max_epochs=2", "threads=1", *DATA,
            "data.eval_batch_size=16", *TINY_TRANSFORMER, f"hydra.run.dir={run_dir}",
            "optim/scheduler=plateau", "optim.optimizer.lr=0.01",  # some learning in 2 epochs
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    data = write_toy_files(tmp_path / "toy", train=300, val=40, test=40)
    hypotheses = tmp_path / "hypotheses.txt"
    single_process = evaluate_script(run_dir / "checkpoints/last.ckpt", data, "val", hypotheses)
    assert hypotheses.read_text() == (run_dir / "val_hypotheses.txt").read_text()
    with open(run_dir / "metrics.csv", newline="") as file:
        logged = [float(row["val/bleu"]) for row in csv.DictReader(file) if row.get("val/bleu")]
    assert logged[-1] == pytest.approx(single_process, abs=1e-3)


def test_align_reads_a_chosen_layer_and_head(transformer_bundle: Path) -> None:
    """seq2seq align's links of a Transformer: by default the map the model returns (its last
    layer, heads averaged), which --layer 1 (the last here) gives too; --head H that head's argmax;
    a layer or head it lacks is refused, naming what it has."""
    from seq2seq import Translator
    from seq2seq.analysis.alignment import argmax_links
    from seq2seq.cli import UsageError
    from seq2seq.commands.align import attention_links

    translator = Translator.load(transformer_bundle)
    sources = ["the dog sees a cat .", "a cat runs ."]
    targets = [translator.translate([source])[0] for source in sources]
    default = attention_links(translator, sources, targets)
    assert attention_links(translator, sources, targets, layer_head=(1, None)) == default
    for head in (1, 2):
        links = attention_links(translator, sources, targets, layer_head=(None, head))
        for source, target, predicted in zip(sources, targets, links, strict=True):
            heads = translator.attention_heads(source, target.split())
            assert heads is not None
            words = len(source.split()), len(target.split())
            assert sorted(predicted) == sorted(argmax_links(heads[0, head - 1], *words))
    with pytest.raises(UsageError, match="1 decoder layers of 2 heads"):
        attention_links(translator, sources, targets, layer_head=(2, None))
