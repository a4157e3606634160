"""Word alignments from a model's attention: written out, and scored against gold links (AER).

    seq2seq align --model CKPT --src test.src --tgt test.tgt --align test.align
    seq2seq align --model CKPT --src corpus.de --tgt corpus.en --write corpus.links
    seq2seq align --model DE_EN --reverse-model EN_DE --symmetrize grow-diag-final-and \\
        --src test.de --tgt test.en --align test.align --write test.links
    seq2seq align --eflomal --train-src train.src --train-tgt train.tgt \\
        --src test.src --tgt test.tgt --align test.align

The model reads each given target (teacher forcing); each target word is linked to the source
word it attends to most (``--alignment hard``) or to every source word whose weight is above a
threshold. Subword weights become word weights first (``seq2seq.analysis.word_alignment``: the
average over a target word's pieces of the sum over a source word's). With ``--reverse-model``, a
target→source model aligns the same pairs the other way round, and ``--symmetrize`` combines the
two. ``--eflomal`` aligns with a statistical aligner instead (``analysis.eflomal_aligner``), both
ways, symmetrized unless ``--symmetrize none``. Links are in Pharaoh format, one line per sentence
pair: ``i-j`` links source word i to target word j, both from 0, and gold files may mark possible
links ``i-p-j`` or ``ipj``. With gold links it prints ``AER: x.xxxx`` (Och and Ney 2003; 0 is
perfect), precision and recall.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

from seq2seq import Translator
from seq2seq.analysis.alignment import (
    AlignmentCounts,
    GoldAlignment,
    Link,
    check_in_range,
    count_links,
    read_pharaoh,
)
from seq2seq.analysis.eflomal_aligner import eflomal_links
from seq2seq.analysis.word_alignment import (
    SYMMETRIZATIONS,
    links_from_weights,
    pharaoh,
    sentence_word_weights,
    symmetrize,
    transpose,
)
from seq2seq.cli import (
    UsageError,
    add_trust_argument,
    alignment_method,
    check_device,
    check_writable,
    int_at_least,
    read_sources_and_references,
    run,
)
from seq2seq.data.corpora import read_lines
from seq2seq.data.tokenization import unknown_words

log = logging.getLogger("seq2seq.align")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    aligner = parser.add_mutually_exclusive_group(required=True)
    aligner.add_argument("--model", type=Path, help="checkpoint file or bundle dir")
    aligner.add_argument(
        "--eflomal", action="store_true",
        help="align with eflomal, a statistical aligner, instead of a model (pip extra 'align')",
    )  # fmt: skip
    parser.add_argument("--src", type=Path, required=True, help="source sentences, one per line")
    parser.add_argument("--tgt", type=Path, required=True, help="target sentences, line-parallel")
    parser.add_argument("--align", type=Path, help="gold Pharaoh alignments: print AER")
    parser.add_argument("--write", type=Path, metavar="FILE", help="write the links here")
    parser.add_argument(
        "--alignment", type=alignment_method("hard"), default="hard", metavar="hard|THRESHOLD",
        help="'hard': each target word to its most attended source word (the default); a "
        "number from 0 to 1: every link whose word weight is above it",
    )  # fmt: skip
    parser.add_argument(
        "--reverse-model", type=Path, metavar="MODEL",
        help="a target->source model: align each pair both ways and --symmetrize the links",
    )  # fmt: skip
    parser.add_argument(
        "--symmetrize", choices=[*SYMMETRIZATIONS, "none"],
        help="how --reverse-model's (or eflomal's reverse) links join the model's "
        "(grow-diag-final-and); none: eflomal's source->target links alone",
    )  # fmt: skip
    parser.add_argument(
        "--train-src", type=Path, metavar="FILE",
        help="with --eflomal: more source sentences for it to learn from, e.g. the training "
        "set's (only --src/--tgt pairs are written and scored)",
    )  # fmt: skip
    parser.add_argument(
        "--train-tgt", type=Path, metavar="FILE", help="with --eflomal: their targets"
    )
    parser.add_argument(
        "--layer", type=int_at_least(1),
        help="a Transformer's decoder layer to read, from 1 (default: the last, its heads "
        "averaged: the map the model returns and val/aer scores)",
    )  # fmt: skip
    parser.add_argument(
        "--head", type=int_at_least(1),
        help="one head of that layer, from 1 (default: its heads averaged)",
    )  # fmt: skip
    parser.add_argument("--batch-size", type=int_at_least(1), default=64, help="sentences (64)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ... (cpu)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_trust_argument(parser)
    args = parser.parse_args()
    if args.align is None and args.write is None:
        parser.error("give --align GOLD (to score the links), --write FILE (to keep them), or both")
    model_only = ["--reverse-model", "--layer", "--head"]
    used = [name for name in model_only if getattr(args, name[2:].replace("-", "_")) is not None]
    if args.eflomal and (used or args.alignment != "hard"):
        parser.error(
            f"{' and '.join(used) or '--alignment THRESHOLD'} read a model's attention; eflomal "
            "gives hard links of its own: leave it out, or align with --model."
        )
    if not args.eflomal and (args.train_src or args.train_tgt):
        parser.error("--train-src and --train-tgt give eflomal more text: use them with --eflomal")
    if (args.train_src is None) != (args.train_tgt is None):
        parser.error("give both --train-src and --train-tgt (line-parallel), or neither")
    if args.symmetrize == "none" and args.reverse_model is not None:
        parser.error("--symmetrize none keeps one direction: leave out --reverse-model instead")
    if args.symmetrize == "none" and not args.eflomal:
        parser.error("--symmetrize none keeps eflomal's source->target links: give --eflomal")
    if args.symmetrize is not None and not (args.eflomal or args.reverse_model):
        parser.error(
            f"--symmetrize {args.symmetrize} joins two directions' links: give --reverse-model "
            "MODEL (a target->source model), or align with --eflomal"
        )
    if args.symmetrize is None:
        args.symmetrize = "grow-diag-final-and"
    return args


def main() -> int:
    args = parse_args()
    sources, targets, gold = read_corpus(args)
    check_device(args.device)
    if args.write is not None:
        check_writable(args.write, "the links")
    if args.eflomal:
        links, backward = eflomal_links(sources, targets, read_context(args))
    else:
        links = model_links(args.model, sources, targets, args)
        backward = None
        if args.reverse_model is not None:
            reverse = model_links(args.reverse_model, targets, sources, args)
            backward = [transpose(sentence) for sentence in reverse]
    if backward is not None and args.symmetrize != "none":
        links = [
            symmetrize(forward, other, args.symmetrize)
            for forward, other in zip(links, backward, strict=True)
        ]
    if args.write is not None:
        with open(args.write, "w", encoding="utf-8") as file:
            file.writelines(f"{pharaoh(sentence)}\n" for sentence in links)
        log.info("wrote the links of %d sentence pairs to %s", len(links), args.write)
    if gold is not None:
        report(args, links, gold)
    elif args.json:
        written = {"sentences": len(links), "links": sum(map(len, links)), "write": str(args.write)}
        print(json.dumps(written))
    return 0


def read_corpus(
    args: argparse.Namespace,
) -> tuple[list[str], list[str], list[GoldAlignment] | None]:
    """The sentence pairs and, with --align, their gold links: line-parallel, links in range;
    pairs with one side blank (no links possible) said."""
    sources = read_lines(args.src, "the source file (--src)")
    targets = read_lines(args.tgt, "the target file (--tgt)")
    half_blank = [
        number
        for number, (source, target) in enumerate(zip(sources, targets, strict=False), 1)
        if bool(source.strip()) != bool(target.strip())
    ]
    if half_blank:
        shown = ", ".join(map(str, half_blank[:5])) + (" ..." if len(half_blank) > 5 else "")
        log.warning(
            "%d sentence pair(s) have one side blank (lines %s): they get no links",
            len(half_blank), shown,
        )  # fmt: skip
    gold = None if args.align is None else read_pharaoh(args.align, "the gold links (--align)")
    counts = {args.src: len(sources), args.tgt: len(targets)}
    if gold is not None:
        counts[args.align] = len(gold)
    if len(set(counts.values())) != 1:
        raise UsageError(
            "the files must be line-parallel, but "
            + ", ".join(f"{path} has {count} lines" for path, count in counts.items())
            + "."
        )
    for number, (source, target, reference) in enumerate(
        zip(sources, targets, gold or [], strict=False), 1
    ):
        words = len(source.split()), len(target.split())
        check_in_range(reference, *words, origin=f"{args.align}:{number}")
    return sources, targets, gold


def read_context(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """--train-src / --train-tgt: eflomal's more parallel text (none without them)."""
    if args.train_src is None:
        return [], []
    sources, targets = read_sources_and_references(args.train_src, args.train_tgt)
    return sources, targets


def model_links(
    path: Path, sources: Sequence[str], targets: Sequence[str], args: argparse.Namespace
) -> list[list[Link]]:
    """The links (source word, target word) the model at ``path`` gives each pair."""
    translator = Translator.load(path, device=args.device, trust_modules=args.trust_modules)
    warn_unknown_words(path, translator, sources, targets)
    return attention_links(
        translator, sources, targets, args.alignment, (args.layer, args.head), args.batch_size
    )


def warn_unknown_words(
    path: Path, translator: Translator, sources: Sequence[str], targets: Sequence[str]
) -> None:
    """Say which words of each side the model reads as <unk>; most of them unknown means a
    model of other languages (a --reverse-model of the wrong direction)."""
    for side, texts, tokenizer in (
        ("source", sources, translator.src_tokenizer),
        ("target", targets, translator.tgt_tokenizer),
    ):
        unknown = unknown_words(tokenizer, list(texts))
        if not unknown:
            continue
        words = sum(len(text.split()) for text in texts)
        examples = ", ".join(word for word, _ in unknown.most_common(5))
        log.warning(
            "%s reads %d %s word(s) as <unk> (e.g. %s): their links are where the model "
            "attends while reading <unk>",
            path, sum(unknown.values()), side, examples,
        )  # fmt: skip
        if sum(unknown.values()) > words / 2:
            log.warning(
                "%s reads most %s words as <unk>: is it a model of these languages, in this "
                "direction (a --reverse-model translates target to source)?",
                path, side,
            )  # fmt: skip


def attention_links(
    translator: Translator,
    sources: Sequence[str],
    targets: Sequence[str],
    method: str | float = "hard",
    layer_head: tuple[int | None, int | None] = (None, None),
    batch_size: int = 64,
) -> list[list[Link]]:
    """The links a model's attention gives each pair (teacher forcing): ``method`` as
    ``links_from_weights``; ``layer_head`` (from 1) picks a Transformer's layer and head."""
    forced = translator.force_decode(sources, targets, batch_size)
    links = []
    for source, target, pair in zip(sources, targets, forced, strict=True):
        assert pair.attention is not None and pair.tgt_tokens is not None
        tokens = pair.tgt_tokens
        attention = pair.attention
        if layer_head != (None, None):
            attention = chosen_attention(translator, source, tokens, *layer_head)
        weights = sentence_word_weights(
            attention, source, translator.src_tokenizer, translator.tgt_tokenizer,
            tokens, target,
        )  # fmt: skip
        links.append(links_from_weights(weights, method))
    return links


def chosen_attention(
    translator: Translator, source: str, tgt_tokens: list[str], layer: int | None, head: int | None
) -> Tensor:
    """A Transformer's layer ``layer`` (from 1; the last by default), its heads averaged or
    ``head`` (from 1) alone: (T, S)."""
    heads = translator.attention_heads(source, tgt_tokens)  # (L, h, T, S) or None
    if heads is None:
        raise UsageError(
            "--layer and --head choose among a Transformer's attentions; this model has one "
            "attention map. Leave them out."
        )
    layers, count = heads.shape[:2]
    layer = layers if layer is None else layer
    if layer > layers or (head is not None and head > count):
        raise UsageError(
            f"the model has {layers} decoder layers of {count} heads: give --layer from 1 to "
            f"{layers} and --head from 1 to {count}."
        )
    chosen = heads[layer - 1]  # (h, T, S)
    return chosen.mean(dim=0) if head is None else chosen[head - 1]


def report(
    args: argparse.Namespace,
    links: Sequence[Sequence[Link]],
    gold: Sequence[GoldAlignment],
) -> None:
    total = AlignmentCounts()
    for predicted, reference in zip(links, gold, strict=True):
        total += count_links(predicted, reference)
    if args.json:
        scores = {"aer": total.aer, "precision": total.precision, "recall": total.recall}
        print(json.dumps({**scores, "sentences": len(links), **vars(total)}))
    else:
        print(
            f"AER: {total.aer:.4f}  precision: {total.precision:.4f}  "
            f"recall: {total.recall:.4f}  ({len(links)} sentence pairs)"
        )


if __name__ == "__main__":
    run(main)
