"""Training on the real-corpus data options; val BLEU against the sacrebleu CLI."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig

from seq2seq.data.toy import ToyTranslation
from seq2seq.pipeline import train
from tests.configs import compose_config

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
# Every scoring function but the RNN recipe's own (additive), as `attention=NAME` selects them.
SCORING_FUNCTIONS = sorted(
    path.stem for path in (ROOT / "conf" / "attention").glob("*.yaml") if path.stem != "additive"
)
SMALL = [
    "model.hidden_size=32",
    "model.embedding_size=16",
    "trainer.enable_progress_bar=false",
    "data.batch_size=32",
]


def sentence_case(text: str) -> str:
    """Toy text made to look like real text: capitalised, with the period attached."""
    return text[:1].upper() + text[1:].replace(" .", ".")


@pytest.fixture(scope="module")
def parallel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("parallel")
    splits = ToyTranslation(train_size=800, val_size=60, test_size=60).splits()
    for split in ("train", "val", "test"):
        for lang, side in (("xx", "src"), ("yy", "tgt")):
            lines = [sentence_case(getattr(example, side)) for example in splits[split]]
            (root / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def compose_small_config(overrides: list[str]) -> DictConfig:
    return compose_config([*SMALL, *overrides])


def test_parallel_val_bleu_equals_the_sacrebleu_cli_on_raw_references(
    parallel_dir: Path, tmp_path: Path
) -> None:
    config = compose_small_config(
        [
            "data=parallel",
            f"data.root={parallel_dir}",
            "data.src_lang=xx",
            "data.tgt_lang=yy",
            "data.min_frequency=1",
            "trainer.max_epochs=2",
            f"run_dir={tmp_path}",
        ]
    )
    train(config)  # type: ignore[arg-type]
    with open(tmp_path / "metrics.csv") as metrics:
        logged = [float(row["val/bleu"]) for row in csv.DictReader(metrics) if row["val/bleu"]]
    hypotheses = tmp_path / "val_hypotheses.txt"
    assert len(hypotheses.read_text(encoding="utf-8").splitlines()) == 60
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "sacrebleu",
            str(parallel_dir / "val.yy"),
            "-i",
            str(hypotheses),
            "-m",
            "bleu",
            "-w",
            "6",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert logged[-1] == pytest.approx(json.loads(cli.stdout)["score"], abs=1e-5)
    # Detokenized output: word-level tokens were joined back into sentence-cased text.
    assert any(line.endswith(".") for line in hypotheses.read_text(encoding="utf-8").splitlines())


@pytest.mark.parametrize("tokenizer", ["word", "bpe"])
def test_tsv_option_trains(tmp_path: Path, tokenizer: str) -> None:
    pairs = ToyTranslation(train_size=400, val_size=10, test_size=10).splits()["train"]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text(
        "".join(f"{sentence_case(p.src)}\t{sentence_case(p.tgt)}\tattribution\n" for p in pairs),
        encoding="utf-8",
    )
    result = train(
        compose_small_config(
            [
                "data=tsv",
                f"data.path={tsv}",
                f"data.tokenizer={tokenizer}",
                "data.vocab_size=300",
                "data.min_frequency=1",
                "trainer.fast_dev_run=true",
                f"run_dir={tmp_path / 'run'}",
            ]
        )
    )
    assert result["metrics"]["train/loss"] > 0


@pytest.mark.skipif(not (SHARED_DATA / "multi30k").is_dir(), reason="../shared/data is absent")
def test_multi30k_option_reads_the_real_corpus(tmp_path: Path) -> None:
    result = train(
        compose_small_config(
            [
                "data=multi30k",
                f"data.root={SHARED_DATA / 'multi30k'}",
                "trainer.fast_dev_run=true",
                f"run_dir={tmp_path}",
            ]
        )
    )
    assert result["metrics"]["train/loss"] > 0


@pytest.fixture(scope="module")
def multi30k_like_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Toy pairs under Multi30k's file names (de and en, test_2016_flickr as the test split)."""
    root = tmp_path_factory.mktemp("multi30k")
    splits = ToyTranslation(train_size=300, val_size=20, test_size=20).splits()
    for split, name in (("train", "train"), ("val", "val"), ("test", "test_2016_flickr")):
        for lang, side in (("de", "src"), ("en", "tgt")):
            lines = [sentence_case(getattr(example, side)) for example in splits[split]]
            (root / f"{name}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.mark.parametrize(
    ("experiment", "src", "tgt", "overrides"),
    [
        ("multi30k_rnn", "de", "en", []),
        ("multi30k_rnn", "en", "de", []),
        ("multi30k_transformer", "de", "en", []),
        # The scoring-function table of docs/multi30k.md: each one in the RNN recipe.
        *[("multi30k_rnn", "de", "en", [f"attention={name}"]) for name in SCORING_FUNCTIONS],
    ],
)
def test_multi30k_recipes_compose_and_train_at_their_own_sizes(
    multi30k_like_dir: Path,
    tmp_path: Path,
    experiment: str,
    src: str,
    tgt: str,
    overrides: list[str],
) -> None:
    # The recipes as the README gives them, only the data swapped for a small stand-in: every key
    # they set must still exist and fit together (schedule, label smoothing, token budget, sizes).
    result = train(
        compose_config(
            [
                f"experiment={experiment}",
                f"data.root={multi30k_like_dir}",
                f"data.src_lang={src}",
                f"data.tgt_lang={tgt}",
                *overrides,
                "trainer.fast_dev_run=true",
                "trainer.enable_progress_bar=false",
                f"run_dir={tmp_path}",
            ]
        )
    )
    assert 0 < result["metrics"]["train/loss"] < float("inf")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data=parallel"], "needs a value for data.root, data.src_lang, data.tgt_lang"),
        (
            ["data=multi30k", "data.root=/nonexistent/m30k"],
            "/nonexistent/m30k/train.de does not exist",
        ),
        (["data=tsv", "data.path=/nonexistent/pairs.tsv"], "/nonexistent/pairs.tsv does not exist"),
    ],
)
def test_bad_data_options_fail_with_one_message(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    completed = subprocess.run(
        [sys.executable, "train.py", *overrides, f"hydra.run.dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode != 0
    assert message in completed.stderr
    assert "Traceback" not in completed.stderr
