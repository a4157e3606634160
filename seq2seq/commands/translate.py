"""Translate text: one output line per input line, in order, streamed.

    python scripts/translate.py --model bundle/ --beam-size 5 < input.txt > output.txt
    echo "a sentence" | python scripts/translate.py --model bundle/ --attention-plot attn.png
    python scripts/translate.py --model bundle/ --attention-html attn.html < sentences.txt

Log messages go to stderr; stdout carries translations only.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, suppress
from pathlib import Path

from seq2seq import Translator
from seq2seq.analysis.plotting import plot_attention, plot_attention_grid
from seq2seq.analysis.word_alignment import (
    links_from_weights,
    pharaoh,
    sentence_word_weights,
    soft,
)
from seq2seq.cli import (
    UsageError,
    add_backend_argument,
    add_coverage_penalty_argument,
    add_length_penalty_argument,
    add_trust_argument,
    alignment_method,
    check_coverage_penalty_backend,
    check_device,
    check_writable,
    int_at_least,
    run,
)
from seq2seq.explorer import ExplorerModel, explorer_data, write_page
from seq2seq.explorer.data import model_label
from seq2seq.inference.translator import Translation, translate_stream

LinkWriter = Callable[[str, Translation], str]

log = logging.getLogger("seq2seq.translate")
# --attention-html shows this many sentences: a page stays light enough to open anywhere.
HTML_SENTENCES = 200


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="checkpoint file or bundle dir")
    parser.add_argument("--input", type=Path, help="read this file instead of stdin")
    parser.add_argument("--output", type=Path, help="write this file instead of stdout")
    parser.add_argument("--beam-size", type=int_at_least(1), default=1, help="1 = greedy (1)")
    add_length_penalty_argument(parser)
    parser.add_argument("--batch-size", type=int_at_least(1), default=64, help="sentences (64)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ... (cpu)")
    parser.add_argument(
        "--attention-plot", type=Path, help="save the attention heatmap of the first sentence"
    )
    parser.add_argument(
        "--attention-heads",
        default="average",
        help="for a Transformer's --attention-plot: 'average' (the last layer's heads, the "
        "default), 'grid' (every layer and head) or 'L,H' (layer L, head H, from 1)",
    )
    parser.add_argument(
        "--attention-html",
        type=Path,
        help=f"write the attention explorer page of the first {HTML_SENTENCES} non-blank lines",
    )
    parser.add_argument(
        "--n-best", type=int_at_least(1), metavar="N",
        help="write the N best translations of each line (N <= --beam-size) as "
        "'LINE ||| TRANSLATION ||| SCORE' ('LINE ||| TRANSLATION ||| LINKS ||| SCORE' with "
        "--alignment), LINE from 0, SCORE the beam's (log-probability over the length penalty, "
        "plus the coverage penalty)",
    )  # fmt: skip
    parser.add_argument(
        "--scores", action="store_true", help="write 'TRANSLATION ||| SCORE' (the beam's score)"
    )
    parser.add_argument(
        "--alignment", type=alignment_method("hard", "soft"), metavar="hard|soft|THRESHOLD",
        help="add ' ||| ' and the word alignment the attention gives right after each "
        "translation (before the score, as Marian does): 'hard' (or 1) links each target word "
        "to its most attended source word, a number from 0 to 1 every link above it ('0-0 "
        "1-2', source word first, from 0); 'soft' writes the word weights (per target word, "
        "its weights over the source words joined by commas)",
    )  # fmt: skip
    add_coverage_penalty_argument(parser)
    add_trust_argument(parser)
    add_backend_argument(parser)
    args = parser.parse_args()
    if args.n_best is not None and args.n_best > args.beam_size:
        raise UsageError(
            f"--n-best {args.n_best} needs --beam-size {args.n_best} or more (the beam holds "
            f"{args.beam_size}): e.g. --beam-size 5 --n-best {args.n_best}."
        )
    return args


def main() -> int:
    args = parse_args()
    check_device(args.device)
    for path, what in [
        (args.output, "the translations"),
        (args.attention_plot, "the plot"),
        (args.attention_html, "the page"),
    ]:
        if path is not None:
            check_writable(path, what)
    check_coverage_penalty_backend(args.backend, args.coverage_penalty)
    translator = Translator.load(
        args.model, device=args.device, trust_modules=args.trust_modules, backend=args.backend
    )
    # The first non-blank input lines, for --attention-plot (one) and --attention-html.
    kept: list[str] = []
    keep = HTML_SENTENCES if args.attention_html is not None else 1

    def remember_first(lines: Iterable[bytes]) -> Iterator[bytes]:
        for raw in lines:
            if len(kept) < keep and raw.strip() and b"\0" not in raw:
                with suppress(UnicodeDecodeError):  # such a line is reported by translate_stream
                    kept.append(raw.decode("utf-8").rstrip("\r\n"))
            yield raw

    with ExitStack() as stack:
        try:
            source = stack.enter_context(open(args.input, "rb")) if args.input else sys.stdin.buffer
        except OSError as error:
            raise UsageError(f"cannot read the input {args.input} ({error.strerror}).") from None
        target = (
            stack.enter_context(open(args.output, "w", encoding="utf-8"))
            if args.output
            else sys.stdout
        )
        translate_stream(
            translator,
            remember_first(source),
            target.write,
            args.beam_size,
            args.length_penalty,
            args.batch_size,
            args.coverage_penalty,
            n_best=args.n_best,
            scores=args.scores,
            links=None if args.alignment is None else alignment_field(translator, args.alignment),
        )
    if args.attention_plot is not None:
        plot_sentence(translator, kept[:1], args)
    if args.attention_html is not None:
        if not kept:
            raise UsageError("--attention-html needs at least one non-blank input line.")
        name = model_label(args.model)
        model = ExplorerModel(name, translator)
        data = explorer_data([model], kept, beam_size=args.beam_size, title=f"Attention: {name}")
        write_page(data, args.attention_html)
        log.info("wrote %s (%d sentences)", args.attention_html, len(kept))
    return 0


def alignment_field(translator: Translator, method: str | float) -> LinkWriter:
    """What --alignment appends for (source line, hypothesis): its word links or word weights."""

    def field(source: str, hypothesis: Translation) -> str:
        if hypothesis.attention is None or hypothesis.tgt_tokens is None:
            return ""  # a blank line: nothing was read, nothing attended
        weights = sentence_word_weights(
            hypothesis.attention, source, translator.src_tokenizer, translator.tgt_tokenizer,
            hypothesis.tgt_tokens,
        )  # fmt: skip
        return soft(weights) if method == "soft" else pharaoh(links_from_weights(weights, method))

    return field


def parse_layer_head(text: str, layers: int, heads: int) -> tuple[int, int]:
    """'L,H' (from 1) -> zero-based (layer, head), or a UsageError that says what exists."""
    try:
        layer, head = (int(part) for part in text.split(","))
    except ValueError:
        layer = head = 0
    if not (1 <= layer <= layers and 1 <= head <= heads):
        raise UsageError(
            f"--attention-heads {text!r}: give 'average', 'grid' or 'L,H' with a layer from 1 to "
            f"{layers} and a head from 1 to {heads}."
        )
    return layer - 1, head - 1


def plot_sentence(translator: Translator, sentence: list[str], args: argparse.Namespace) -> None:
    """Plot the attention of ``sentence`` (a list of at most one line) as it was translated."""
    if not sentence:
        raise UsageError("--attention-plot needs at least one non-blank input line.")
    [translation] = translator.translate_detailed(
        sentence, args.beam_size, args.length_penalty, with_attention=True,
        coverage_penalty=args.coverage_penalty,
    )  # fmt: skip
    assert translation.src_tokens is not None and translation.tgt_tokens is not None
    assert translation.attention is not None
    heads = (
        None
        if args.attention_heads == "average"
        else translator.attention_heads(sentence[0], translation.tgt_tokens)
    )
    if heads is None:
        if args.attention_heads != "average":
            log.warning("--attention-heads: this model has one attention map; plotting it")
        plot_attention(
            translation.src_tokens, translation.tgt_tokens, translation.attention,
            args.attention_plot,
        )  # fmt: skip
    elif args.attention_heads == "grid":
        plot_attention_grid(
            translation.src_tokens, translation.tgt_tokens, heads, args.attention_plot
        )
    else:
        layer, head = parse_layer_head(args.attention_heads, heads.shape[0], heads.shape[1])
        plot_attention(
            translation.src_tokens, translation.tgt_tokens, heads[layer, head],
            args.attention_plot, title=f"layer {layer + 1}, head {head + 1}",
        )  # fmt: skip
    log.info(
        "wrote the attention of %r -> %r to %s", sentence[0], translation.text, args.attention_plot
    )


if __name__ == "__main__":
    run(main)
