"""Attention with memory, measured on the toy task over seeds (issue 57).

The default model (bidirectional GRU, Bahdanau decoder) against the same with coverage in the
score, with and without the coverage loss (λ = 1), and the Luong decoder without and with input
feeding (compared with each other), for each scoring function and seed; the runs are those of
``benchmarks.attention_parts`` (the baseline's are shared with it when ``--runs`` is the same).
Each run's figures are the parts study's (test BLEU and AER, ``test_long`` greedy BLEU and AER,
tokens/s) and, on ``test_long``'s greedy translations, the shares of source tokens attended
more than 1.5 and less than 0.5 times in total (``seq2seq.analysis.metrics.attention_totals``)
and the share of output tokens that repeat the token before them; then BLEU with beam 5 (α =
0.6) on the first ``BEAM_SENTENCES`` ``test_long`` sentences without and with GNMT's coverage
penalty (β = ``PENALTY``).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import torch
from sacrebleu.metrics import BLEU

from benchmarks.attention_parts import Figure, evaluate, render_table, run_all
from seq2seq import Translator
from seq2seq.analysis.metrics import attention_totals
from seq2seq.data.toy import ToyTranslation

VARIANTS: dict[str, list[str]] = {
    "baseline": [],
    "coverage": ["attention.coverage=true"],
    "coverage, λ=1": ["attention.coverage=true", "optim.coverage_loss_weight=1"],
    "luong": ["model.decoder=luong"],
    "luong, input feeding": ["model.decoder=luong", "model.input_feeding=true"],
}
# Input feeding is a Luong decoder's: its difference is read against the Luong decoder's.
COMPARED_WITH = {"luong": "baseline", "luong, input feeding": "luong"}
BEAM_SENTENCES = 300
PENALTY = 0.2
FIGURES: tuple[Figure, ...] = (
    ("test_bleu", "test BLEU", 1),
    ("test_aer", "test AER", 3),
    ("long_bleu", "test_long BLEU", 1),
    ("long_aer", "test_long AER", 3),
    ("over", "over 1.5", 3),
    ("under", "under 0.5", 3),
    ("repeats", "repeated tokens", 4),
    ("beam_bleu", "beam 5", 1),
    ("penalty_bleu", f"beam 5, β={PENALTY}", 1),
)


def evaluate_memory(directory: Path) -> dict[str, float]:
    """The parts study's figures of one run and this study's (cached in
    ``evaluation_memory.json``)."""
    figures = evaluate(directory)
    cached = directory / "evaluation_memory.json"
    if cached.is_file():
        return {**figures, **json.loads(cached.read_text())}
    torch.set_num_threads(1)
    translator = Translator.load(directory / "checkpoints" / "best.ckpt")
    long = ToyTranslation(seed=1).splits()["test_long"]  # data.seed's default: the runs' splits
    greedy = translator.translate_detailed([e.src for e in long], with_attention=True)
    over = under = words = repeats = outputs = 0
    for translation in greedy:
        assert translation.attention is not None and translation.tgt_tokens is not None
        attention = translation.attention[None]  # (1, T, S)
        lens = torch.tensor([attention.shape[2]])
        counts = attention_totals(attention, lens)
        over, under, words = over + counts[0][0], under + counts[1][0], words + int(lens[0])
        tokens = translation.tgt_tokens
        repeats += sum(a == b for a, b in itertools.pairwise(tokens))
        outputs += len(tokens)
    sources = [e.src for e in long[:BEAM_SENTENCES]]
    references = [[e.tgt for e in long[:BEAM_SENTENCES]]]
    bleu = BLEU(tokenize="none", force=True)  # the toy task is tokenized on purpose
    beam = translator.translate(sources, beam_size=5, length_penalty=0.6)
    penalized = translator.translate(
        sources, beam_size=5, length_penalty=0.6, coverage_penalty=PENALTY
    )
    extra = {
        "over": over / words,
        "under": under / words,
        "repeats": repeats / max(1, outputs),
        "beam_bleu": bleu.corpus_score(beam, references).score,
        "penalty_bleu": bleu.corpus_score(penalized, references).score,
    }
    cached.write_text(json.dumps(extra, indent=2) + "\n")
    return {**figures, **extra}


def run_memory_study(
    root: Path, seeds: list[int], epochs: int, jobs: int, extra: list[str]
) -> dict[str, Any]:
    """Train and score every run of ``VARIANTS``: ``run_all``'s results."""
    return run_all(root, seeds, epochs, jobs, extra, VARIANTS, evaluate_memory)


def render_memory_table(results: dict[str, Any]) -> str:
    """The study's tables: each variant against the baseline (input feeding against Luong)."""
    return render_table(results, list(VARIANTS), FIGURES, COMPARED_WITH)
