"""Third-party noise is stopped at its source, and only that: real warnings still show."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest

from seq2seq.analysis.metrics import SentenceScore, corpus_metrics
from seq2seq.analysis.plotting import plot_attention
from seq2seq.training import console, loggers


def lightning_record(message: str) -> logging.LogRecord:
    return logging.LogRecord(console.LIGHTNING_LOGGER, logging.INFO, __file__, 1, message, (), None)


def test_lightnings_tip_is_dropped_and_its_other_lines_kept() -> None:
    console.drop_lightning_tips()
    console.drop_lightning_tips()  # idempotent
    lightning = logging.getLogger(console.LIGHTNING_LOGGER)
    assert lightning.filters.count(console._TIP_FILTER) == 1
    assert not lightning.filter(lightning_record("💡 Tip: For seamless cloud logging, try ..."))
    skipped = "Trainer already configured with model summary callbacks: [...]. Skipping ..."
    assert not lightning.filter(lightning_record(skipped))
    assert lightning.filter(lightning_record("GPU available: False, used: False"))


def test_only_lightnings_pytree_deprecation_is_silenced() -> None:
    message = "`isinstance(treespec, LeafSpec)` is deprecated, use `treespec.is_leaf()` instead."
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with console.lightning_quietly():
            warnings.warn_explicit(
                message,
                FutureWarning,
                "_pytree.py",
                21,
                module="pytorch_lightning.utilities._pytree",
            )
            # The same message from elsewhere, and another FutureWarning from there, still show.
            warnings.warn_explicit(message, FutureWarning, "mine.py", 1, module="mine")
            warnings.warn_explicit(
                "something else is deprecated", FutureWarning, "_pytree.py", 30,
                module="pytorch_lightning.utilities._pytree",
            )  # fmt: skip
    assert [str(w.message) for w in caught] == [message, "something else is deprecated"]


def scores(hypotheses: list[str]) -> list[SentenceScore]:
    return [SentenceScore(i, h, h, 0.0, 1, 0.0) for i, h in enumerate(hypotheses)]


def test_sacrebleu_is_told_about_tokenized_text_only_where_it_is_on_purpose(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """tokenize=none (the toy tasks) scores tokenized text on purpose; with 13a (real text) the
    same lines are a real mistake of the user's, and sacreBLEU's warning about them stays."""
    tokenized = scores([f"a sentence number {i} ." for i in range(120)])
    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        corpus_metrics(tokenized, bleu_tokenize="none")
    assert "detokenize" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        corpus_metrics(tokenized, bleu_tokenize="13a")
    assert "forgot to detokenize" in caplog.text


def test_attention_maps_of_long_tokens_plot_without_warnings(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = plot_attention(["antidisestablishment"], ["y" * 20, "<eos>"], [[1.0], [1.0]],
                              tmp_path / "map.png", title="val sentence 12, step 1234")  # fmt: skip
    assert path.stat().st_size > 0


def test_the_wandb_logger_passes_no_deprecated_anonymous_setting(tmp_path: Path) -> None:
    run = loggers.RunInfo(name="n", group=None, tags=(), config={})
    logger = loggers.wandb_logger(tmp_path, run, mode="disabled")
    assert "anonymous" not in logger._wandb_init
