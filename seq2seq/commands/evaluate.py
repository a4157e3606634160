"""Translate a source file and score it against references with sacreBLEU (BLEU and chrF).

    python scripts/evaluate.py --model RUN/checkpoints/best.ckpt --src test.de --ref test.en \
        --beam-size 5 [--hyp-out hyp.txt] [--json]

The BLEU is sacreBLEU's corpus BLEU with its default settings, the same number that
``sacrebleu REF -i HYP`` prints for the written hypotheses.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

from sacrebleu.metrics.bleu import BLEU
from sacrebleu.metrics.chrf import CHRF

from seq2seq import Translator
from seq2seq.cli import (
    UsageError,
    add_backend_argument,
    add_coverage_penalty_argument,
    add_length_penalty_argument,
    add_trust_argument,
    check_coverage_penalty_backend,
    check_device,
    check_writable,
    int_at_least,
    read_sources_and_references,
    run,
)

log = logging.getLogger("seq2seq.evaluate")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="checkpoint file or bundle dir")
    parser.add_argument("--src", type=Path, required=True, help="source sentences, one per line")
    parser.add_argument("--ref", type=Path, required=True, help="references, line-parallel")
    parser.add_argument("--hyp-out", type=Path, help="write the translations here")
    parser.add_argument(
        "--beam-size", type=int_at_least(1), default=5,
        help="1 = greedy (5); a training run's test BLEU (summary.json) is greedy's, unless "
        "its config sets decoding.beam_size: --beam-size 1 reproduces it",
    )  # fmt: skip
    add_length_penalty_argument(parser)
    parser.add_argument("--batch-size", type=int_at_least(1), default=64, help="sentences (64)")
    parser.add_argument(
        "--tokenize", default=BLEU.TOKENIZER_DEFAULT,
        help="sacreBLEU tokenizer (13a); none: the text is tokenized already, as the toy "
        "tasks' is (sacreBLEU's force, so it does not warn about tokenized input)",
    )  # fmt: skip
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ... (cpu)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_coverage_penalty_argument(parser)
    add_trust_argument(parser)
    add_backend_argument(parser)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    sources, references = read_sources_and_references(args.src, args.ref)
    if args.hyp_out is not None:
        check_writable(args.hyp_out, "the hypotheses")
    check_device(args.device)
    check_coverage_penalty_backend(args.backend, args.coverage_penalty)
    bleu_metric, chrf_metric = checked_bleu_metric(args.tokenize), CHRF()  # before translating
    translator = Translator.load(
        args.model, device=args.device, trust_modules=args.trust_modules, backend=args.backend
    )
    start = time.perf_counter()
    hypotheses = translator.translate(
        sources, args.beam_size, args.length_penalty, args.batch_size, args.coverage_penalty
    )
    seconds = time.perf_counter() - start
    if args.hyp_out is not None:
        args.hyp_out.write_text("".join(f"{line}\n" for line in hypotheses), encoding="utf-8")

    with tokenized_input_hint(args.tokenize):
        bleu = bleu_metric.corpus_score(hypotheses, [references])
    chrf = chrf_metric.corpus_score(hypotheses, [references])
    log.info(
        "%d sentences in %.1f s (%.1f sentences/s), %s", len(sources), seconds,
        len(sources) / seconds, "greedy" if args.beam_size == 1 else f"beam {args.beam_size}",
    )  # fmt: skip
    warn_empty(hypotheses)
    if args.json:
        print(
            json.dumps(
                {
                    "name": "BLEU",
                    "score": bleu.score,
                    "signature": str(bleu_metric.get_signature()),
                    "verbose_score": bleu.format(score_only=False, signature=""),
                    "chrf": chrf.score,
                    "chrf_signature": str(chrf_metric.get_signature()),
                    "sentences": len(sources),
                    "beam_size": args.beam_size,
                }
            )
        )
    else:
        print(bleu.format(signature=str(bleu_metric.get_signature())))
        print(chrf.format(signature=str(chrf_metric.get_signature())))
    return 0


def warn_empty(hypotheses: list[str]) -> None:
    """Empty translations score 0 without a word from sacreBLEU: say how many (the model ended
    them at once: undertrained, or a model of another task or vocabulary)."""
    empty = sum(1 for line in hypotheses if not line.strip())
    if empty:
        log.warning(
            "%d of %d translations are empty (the model ends them at once: undertrained, or "
            "a model of another task or vocabulary); they count as empty in BLEU and chrF",
            empty, len(hypotheses),
        )  # fmt: skip


def checked_bleu_metric(tokenize: str) -> BLEU:
    """``bleu_metric_for``, or a UsageError naming sacreBLEU's tokenizers."""
    try:
        return bleu_metric_for(tokenize)
    except (KeyError, ValueError, RuntimeError):
        names = ", ".join(BLEU.TOKENIZERS)
        raise UsageError(
            f"--tokenize {tokenize}: not one of sacreBLEU's tokenizers ({names}); 13a for "
            "detokenized text, none for text tokenized on purpose (the toy tasks')."
        ) from None


@contextlib.contextmanager
def tokenized_input_hint(tokenize: str) -> Iterator[None]:
    """sacreBLEU's "forgot to detokenize ... use the `force` parameter" (a parameter this
    command has no flag for) said as this command's choice: --tokenize none."""

    said: list[bool] = []  # sacreBLEU can say it more than once for one corpus: once here

    def rewrite(record: logging.LogRecord) -> bool:
        if "detokenize" in record.getMessage():
            if said:
                return False
            said.append(True)
            record.msg, record.args = (
                "the translations look tokenized (a space before punctuation) while BLEU "
                "tokenizes them again with --tokenize %s: for text tokenized on purpose (the toy "
                "tasks') pass --tokenize none; otherwise detokenize the references and the "
                "model's output.",
                (tokenize,),
            )
        return True

    sacrebleu_log = logging.getLogger("sacrebleu")
    sacrebleu_log.addFilter(rewrite)
    try:
        yield
    finally:
        sacrebleu_log.removeFilter(rewrite)


def bleu_metric_for(tokenize: str) -> BLEU:
    """sacreBLEU's BLEU with ``tokenize``. ``none`` scores text that is tokenized on purpose (the
    toy tasks'): it says so (sacreBLEU's force), or sacreBLEU would guess the text was left
    tokenized by mistake and warn that the user "forgot to detokenize"."""
    return BLEU(tokenize=tokenize, force=tokenize == "none")


if __name__ == "__main__":
    run(main)
