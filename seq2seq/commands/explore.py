"""Write the attention explorer: one self-contained HTML page (no network) for up to 16 models.

    python scripts/explore.py --model additive=runs/a/checkpoints/best.ckpt \
        --model scaled_dot=runs/b/checkpoints/best.ckpt --src data/toy/test.src \
        --ref data/toy/test.tgt --align data/toy/test.align --lines 1-20 --out explore.html
    python scripts/explore.py --model bundle/ --sentence "the dog sees a cat ." --out attn.html

Open the page in any browser, offline. Each model's map (source across, target down) on a
viridis scale with a colour bar (exact zeros hatched; a linear or sqrt scale), its translation,
the gold links and AER, each row's entropy beside the map, each source word's coverage under it,
a local window's edges, a score histogram, and a text view that shades the source by the hovered
target word. Two models and their difference side by side from 1280 px. Hover, or focus a map and
use the arrow keys: the weight reads at the top. A Transformer: layer and head menus and a grid of
every head, and its encoder and decoder self-attention. docs/explorer.md tells the rest.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from seq2seq import Translator
from seq2seq.analysis.alignment import GoldAlignment, check_in_range, read_pharaoh
from seq2seq.cli import (
    UsageError,
    add_backend_argument,
    add_trust_argument,
    check_writable,
    int_at_least,
    named_paths,
    run,
)
from seq2seq.data.corpora import read_lines
from seq2seq.explorer import MAX_MODELS, SIDE_BY_SIDE, ExplorerModel, explorer_data, write_page


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        dest="models",
        action="append",
        required=True,
        metavar="[NAME=]PATH",
        help=f"a checkpoint or bundle, and its name on the page (repeatable, up to "
        f"{MAX_MODELS}; {SIDE_BY_SIDE} shown side by side)",
    )
    parser.add_argument("--src", type=Path, help="source sentences, one a line")
    parser.add_argument(
        "--sentence", dest="sentences", action="append", help="a source sentence (repeatable)"
    )
    parser.add_argument("--ref", type=Path, help="references, line-parallel with --src")
    parser.add_argument("--align", type=Path, help="gold Pharaoh alignments, line-parallel")
    parser.add_argument(
        "--links", metavar="NAME=FILE", action="append",
        help="another aligner's Pharaoh links of each (source, reference) pair, line-parallel, "
        "e.g. eflomal=test.links (seq2seq align --eflomal --write): drawn beside the gold",
    )  # fmt: skip
    parser.add_argument("--lines", help="which lines of --src, from 1: e.g. 1-20 or 3,7,10-12")
    parser.add_argument("--beam-size", type=int_at_least(1), default=1, help="1 = greedy (1)")
    parser.add_argument("--n-best", type=int_at_least(1), help="show the n best (beam search)")
    parser.add_argument("--title", default="Attention explorer", help="the page's title")
    parser.add_argument("--out", type=Path, required=True, help="the HTML file to write")
    add_trust_argument(parser)
    add_backend_argument(parser)
    return parser.parse_args()


def line_numbers(spec: str, count: int) -> list[int]:
    """``"1-3,7"`` -> [0, 1, 2, 6] (0-based), each checked against the ``count`` lines."""
    chosen: list[int] = []
    for part in spec.split(","):
        first, _, last = part.strip().partition("-")
        try:
            start, end = int(first), int(last or first)
        except ValueError:
            raise UsageError(
                f"--lines {spec!r}: want numbers from 1, e.g. 1-20 or 3,7,10-12."
            ) from None
        if start > end:
            raise UsageError(
                f"--lines {spec!r}: {part.strip()} runs backwards; write {end}-{start}."
            )
        if not 1 <= start <= end <= count:
            raise UsageError(f"--lines {spec!r}: {part.strip()} is not within lines 1 to {count}.")
        chosen += range(start - 1, end)
    return chosen


def models(specs: list[str], trust_modules: list[str], backend: str) -> list[ExplorerModel]:
    if len(specs) > MAX_MODELS:
        raise UsageError(
            f"--model: a page holds at most {MAX_MODELS} models ({SIDE_BY_SIDE} side by side, "
            f"chosen by its checkboxes), got {len(specs)}: make two pages."
        )
    # A checkpoint RUN/checkpoints/best.ckpt is named after its run directory.
    named = named_paths(specs, lambda path: path.parent.parent.name or path.stem)
    return [
        ExplorerModel(name, Translator.load(path, trust_modules=trust_modules, backend=backend))
        for name, path in named
    ]


def main() -> int:
    args = parse_args()
    if args.src is not None and args.sentences is not None:
        raise UsageError("give the sentences with --src FILE or with --sentence TEXT, not both.")
    if args.src is None and args.sentences is None:
        raise UsageError("no sentences: give them with --src FILE or with --sentence TEXT.")
    if args.sentences is not None and (args.ref or args.align or args.lines or args.links):
        raise UsageError("--ref, --align, --links and --lines go with --src.")
    for option, value in [("--align", args.align), ("--links", args.links)]:
        if value is not None and args.ref is None:
            raise UsageError(f"{option} links source words to reference words: give --ref too.")
    if args.links is not None and len(args.links) > 1:
        raise UsageError(
            f"--links given {len(args.links)} times: a page draws one other aligner's links "
            "beside the gold; make a page for each."
        )
    given = args.links[0] if args.links else None
    links_name, _, links_path = (given or "").partition("=")
    if given is not None and not (links_name and links_path):
        raise UsageError(f"--links {given!r}: give NAME=FILE, e.g. eflomal=test.links.")
    if args.n_best is not None and args.n_best > args.beam_size:
        raise UsageError(f"--n-best {args.n_best} needs --beam-size {args.n_best} or more.")
    check_writable(args.out, "the page")
    sources = args.sentences or read_lines(args.src, "the source file (--src)")
    references = read_lines(args.ref, "the reference file (--ref)") if args.ref else None
    gold = read_pharaoh(args.align, "the gold links (--align)") if args.align else None
    other = read_pharaoh(Path(links_path), "the links of --links") if given else None
    for path, lines in [(args.ref, references), (args.align, gold), (links_path, other)]:
        if lines is not None and len(lines) != len(sources):
            raise UsageError(
                f"{path} has {len(lines)} lines but {args.src} has {len(sources)}: the files "
                "must be line-parallel."
            )
    chosen = line_numbers(args.lines, len(sources)) if args.lines else list(range(len(sources)))
    if len(chosen) > 500:
        raise UsageError(
            f"{len(chosen)} sentences make a page too heavy to open: pick up to 500 with --lines."
        )
    loaded = models(args.models, args.trust_modules, args.backend)
    alignments: list[GoldAlignment] | None = None
    if gold is not None:
        alignments = []
        for i in chosen:
            assert references is not None  # --align needs --ref
            words = len(sources[i].split()), len(references[i].split())
            check_in_range(gold[i], *words, origin=f"{args.align}:{i + 1}")
            alignments.append(gold[i])
    links = None
    if other is not None:
        assert references is not None  # --links needs --ref
        for i in chosen:
            words = len(sources[i].split()), len(references[i].split())
            check_in_range(other[i], *words, origin=f"{links_path}:{i + 1}")
        links = (links_name, [sorted(other[i].possible) for i in chosen])
    data = explorer_data(
        loaded,
        [sources[i] for i in chosen],
        None if references is None else [references[i] for i in chosen],
        alignments,
        beam_size=args.beam_size,
        n_best=args.n_best,
        title=args.title,
        links=links,
    )
    if alignments is not None or links is not None:
        check_word_tokens(data, args.src, chosen)
    write_page(data, args.out)
    counted = [f"{n} {noun}{'' if n == 1 else 's'}" for n, noun in
               [(len(chosen), "sentence"), (len(loaded), "model")]]  # fmt: skip
    print(f"wrote {args.out} ({', '.join(counted)})")
    return 0


def check_word_tokens(data: dict[str, object], src: Path, chosen: list[int]) -> None:
    """Gold links join words: refuse a model whose tokens are not the space-separated words."""
    sentences = data["sentences"]
    assert isinstance(sentences, list)
    for number, sentence in zip(chosen, sentences, strict=True):
        for name, view in sentence["models"].items():
            words = len(sentence["src"].split()), len((sentence["ref"] or "").split())
            tokens = len(view["src_tokens"]), len(view["tgt_tokens"])
            if sentence["ref"] is not None and tokens != words:
                raise UsageError(
                    f"{src}:{number + 1}: model {name!r} splits this pair into {tokens[0]} source "
                    f"and {tokens[1]} target tokens, but it has {words[0]} and {words[1]} words. "
                    "Alignments link words, so --align and --links need models whose tokens are "
                    "the space-separated words (the toy tasks, or data.tokenizer=whitespace)."
                )


if __name__ == "__main__":
    run(main)
