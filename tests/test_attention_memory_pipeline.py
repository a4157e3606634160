"""Attention with memory from the command line to the files: an input-fed Luong decoder, and a
model with coverage and the coverage loss, train, validate, decode (greedy, beam 5, n-best 3) and
export a bundle that translates as its checkpoint does; the switches travel in checkpoints and
bundles, a resume that changes them is refused, and what cannot take them says so in one
paragraph. (A killed and resumed run: tests/test_resume.py.)"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import sacrebleu
from hydra.utils import instantiate

from seq2seq import Translator
from seq2seq.data.datamodule import Seq2SeqDataModule
from seq2seq.errors import ConfigError
from seq2seq.inference.bundle import export_bundle, load
from seq2seq.pipeline import load_checkpoint
from tests.configs import TINY, TINY_TRANSFORMER, compose_config
from tests.test_attention_parts_pipeline import (
    SENTENCES,
    assert_bundle_translates_as_checkpoint,
    tiny_run,
)

INPUT_FEEDING = ["model.decoder=luong", "model.input_feeding=true"]


def test_an_input_fed_decoder_trains_decodes_and_exports_a_bundle(tmp_path: Path) -> None:
    result = tiny_run(tmp_path / "run", INPUT_FEEDING)
    checkpoint = Path(result["best_checkpoint"])
    trained = load(checkpoint)
    assert trained.model_config["input_feeding"] is True
    assert trained.model.decoder.cell.input_size == (
        trained.model.decoder.embedding_size + trained.model.decoder.cell.hidden_size
    )
    bundle = export_bundle(trained, tmp_path / "bundle")
    assert json.loads((bundle / "config.json").read_text())["model"]["input_feeding"] is True
    assert_bundle_translates_as_checkpoint(checkpoint, bundle)
    nbest = Translator.load(bundle).translate_detailed(SENTENCES[:4], 5, n_best=3)
    assert all(len(translation.n_best) == 3 for translation in nbest)

    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    with pytest.raises(ConfigError, match=r"model\.input_feeding: True in the run, False now"):
        tiny_run(tmp_path / "run", ["model.decoder=luong", f"ckpt_path={last}"])


def test_the_bahdanau_decoder_refuses_input_feeding_in_one_paragraph(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is for the Luong decoder") as refused:
        tiny_run(tmp_path / "run", ["model.input_feeding=true"])
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.decoder=luong", "model.input_feeding=no"], "input_feeding=no (it must be true"),
        (["model.decoder=luong", "model.input_feeding=1"], "input_feeding=1 (it must be true"),
        ([*TINY_TRANSFORMER, "model.input_feeding=true"], "true with model=transformer"),
    ],
    ids=["no", "one", "transformer"],
)
def test_input_feeding_takes_true_or_false_and_an_rnn(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    """A word that means off must not turn it on (a truthy string did); a Transformer says why."""
    with pytest.raises(ConfigError, match=re.escape(message)) as refused:
        tiny_run(tmp_path / "run", overrides)
    assert "\n" not in str(refused.value)


COVERAGE = ["attention.coverage=true", "optim.coverage_loss_weight=1"]


def test_coverage_and_its_loss_train_decode_and_export_a_bundle(tmp_path: Path) -> None:
    result = tiny_run(tmp_path / "run", [*COVERAGE, "trainer.log_every_n_steps=5"])
    checkpoint = Path(result["best_checkpoint"])
    trained = load(checkpoint)
    assert trained.model_config["attention_parts"]["coverage"] is True
    weight = trained.model.decoder.attention.coverage_weight
    assert weight is not None and weight.abs().sum() > 0, "w_c learned from its start at 0"
    with (tmp_path / "run" / "metrics.csv").open() as lines:
        rows = list(csv.DictReader(lines))
    losses = [float(row["train/coverage_loss"]) for row in rows if row.get("train/coverage_loss")]
    assert losses and all(loss >= 0 for loss in losses)
    bundle = export_bundle(trained, tmp_path / "bundle")
    assert_bundle_translates_as_checkpoint(checkpoint, bundle)
    nbest = Translator.load(bundle).translate_detailed(SENTENCES[:4], 5, n_best=3)
    assert all(len(translation.n_best) == 3 for translation in nbest)


def test_a_transformer_refuses_coverage_but_takes_its_loss(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not take attention\.coverage=true") as refused:
        tiny_run(tmp_path / "refused", [*TINY_TRANSFORMER, "attention.coverage=true"])
    assert "\n" not in str(refused.value)
    result = tiny_run(
        tmp_path / "run",
        [*TINY_TRANSFORMER, "optim.coverage_loss_weight=1", "trainer.max_epochs=1"],
    )
    assert result["best_val_bleu"] >= 0


@pytest.mark.parametrize("value", ["-1", "yes", "true"])
def test_a_bad_coverage_loss_weight_is_one_paragraph(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match=r"optim\.coverage_loss_weight must be a number"):
        tiny_run(tmp_path / "run", [f"optim.coverage_loss_weight={value}"])


def test_validation_and_test_search_with_a_beam_and_a_coverage_penalty(tmp_path: Path) -> None:
    """decoding.beam_size / length_penalty / coverage_penalty: validation's and test's hypotheses
    are beam search's with them, the Translator's with the same options; the checkpoint alone
    carries the search and reproduces val/bleu."""
    search = [
        "decoding.beam_size=3",
        "decoding.length_penalty=1.0",
        "decoding.coverage_penalty=0.5",
    ]
    result = tiny_run(tmp_path / "run", ["attention.coverage=true", *search])
    run = tmp_path / "run"
    config = compose_config([*TINY, f"run_dir={run}"])
    datamodule = Seq2SeqDataModule(instantiate(config.data.corpus))
    datamodule.setup()
    sources = [example.src_text for example in datamodule.datasets["test"].examples]
    expected = Translator.load(result["best_checkpoint"]).translate(
        sources, beam_size=3, length_penalty=1.0, coverage_penalty=0.5
    )
    assert (run / "test_hypotheses.txt").read_text().splitlines() == expected
    module = load_checkpoint(result["best_checkpoint"])
    assert (module.beam_size, module.length_penalty, module.coverage_penalty) == (3, 1.0, 0.5)
    hypotheses, references = [], []
    for batch in datamodule.val_dataloader():
        hypotheses += module.translate_batch(batch)
        references += batch.tgt_text
    bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert bleu == pytest.approx(result["best_val_bleu"], abs=1e-4)


@pytest.mark.parametrize(
    "override, message",
    [
        ("decoding.beam_size=0", "decoding.beam_size=0 (an integer of at least 1"),
        ("decoding.coverage_penalty=-1", "decoding.coverage_penalty=-1 (a number from 0 to 10)"),
        ("decoding.length_penalty=abc", "decoding.length_penalty=abc (a number from 0 to 10)"),
    ],
)
def test_a_bad_validation_search_is_one_paragraph(
    tmp_path: Path, override: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as refused:
        tiny_run(tmp_path / "run", [override])
    assert "\n" not in str(refused.value)
