"""Alignment error rate (AER) of a model's attention against gold word alignments.

    python scripts/alignment.py --model RUN/checkpoints/best.ckpt \\
        --src data/toy/test.src --tgt data/toy/test.tgt --align data/toy/test.align

The model reads each reference target (forced decoding), and each target word is aligned to the
source word it attends to most. The alignment file is in Pharaoh format, one line per sentence
pair: ``i-j`` is a sure link and ``i-p-j`` or ``ipj`` a possible one, where i is the 0-based
source word index and j the 0-based target word index (source first). Prints ``AER: x.xxxx``
(Och and Ney 2003; 0 is perfect).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from seq2seq import Translator
from seq2seq.analysis.alignment import (
    AlignmentCounts,
    argmax_links,
    check_in_range,
    count_links,
    read_pharaoh,
)
from seq2seq.cli import UsageError, add_trust_argument, check_device, int_at_least, run
from seq2seq.data.corpora import read_lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="checkpoint file or bundle dir")
    parser.add_argument("--src", type=Path, required=True, help="source sentences, one per line")
    parser.add_argument("--tgt", type=Path, required=True, help="target sentences, line-parallel")
    parser.add_argument("--align", type=Path, required=True, help="gold Pharaoh alignments")
    parser.add_argument("--batch-size", type=int_at_least(1), default=64, help="sentences (64)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ... (cpu)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_trust_argument(parser)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    sources = read_lines(args.src, "the source file")
    targets = read_lines(args.tgt, "the target file")
    gold = read_pharaoh(args.align)
    counts = {args.src: len(sources), args.tgt: len(targets), args.align: len(gold)}
    if len(set(counts.values())) != 1:
        raise UsageError(
            "the files must be line-parallel, but "
            + ", ".join(f"{path} has {count} lines" for path, count in counts.items())
            + "."
        )
    check_device(args.device)
    translator = Translator.load(args.model, device=args.device, trust_modules=args.trust_modules)
    forced = translator.force_decode(sources, targets, args.batch_size)
    total = AlignmentCounts()
    for number, (source, target, reference, pair) in enumerate(
        zip(sources, targets, gold, forced, strict=True), 1
    ):
        assert pair.src_tokens is not None and pair.tgt_tokens is not None
        assert pair.attention is not None
        words = len(source.split()), len(target.split())
        if (len(pair.src_tokens), len(pair.tgt_tokens)) != words:
            raise UsageError(
                f"{args.src}:{number}: the model's tokenizers split this pair into "
                f"{len(pair.src_tokens)} source and {len(pair.tgt_tokens)} target tokens, but it "
                f"has {words[0]} and {words[1]} words. Alignments link words, so AER needs a "
                "model whose tokens are the space-separated words (the toy tasks, or "
                "data.tokenizer=whitespace)."
            )
        check_in_range(reference, *words, origin=f"{args.align}:{number}")
        predicted = argmax_links(pair.attention, *words)
        total += count_links(predicted, reference)
    if args.json:
        print(json.dumps({"aer": total.aer, "sentences": len(sources), **vars(total)}))
    else:
        print(f"AER: {total.aer:.4f}")
    return 0


if __name__ == "__main__":
    run(main)
