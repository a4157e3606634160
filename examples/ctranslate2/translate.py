"""Translation with a seq2seq bundle's CTranslate2 model, and nothing of seq2seq: ctranslate2
and tokenizers only (pip install ctranslate2 tokenizers).

    python translate.py BUNDLE [--beam-size 5] < sentences.txt > translations.txt

BUNDLE is a directory written by ``seq2seq export --checkpoint CKPT --out BUNDLE --format
ctranslate2``: ``ctranslate2/`` (model.bin, the vocabularies, seq2seq.json) beside
``src_tokenizer.json`` and ``tgt_tokenizer.json``. ``seq2seq translate --backend ctranslate2``
gives the same translations.

CTranslate2 takes and gives token strings. What it cannot know is seq2seq's length limit, which
``ctranslate2/seq2seq.json`` carries: a sentence of S source tokens (after the cut to
``max_src_len``) gets at most floor(max_len_a · S) + max_len_b tokens, the end token included,
passed as ``max_decoding_length`` (which counts it too). Greedy tokens do not depend on the
limit, so a batch could share its largest and cut each output to its own; beam search ranks by
length, so here every sentence is its own call.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import ctranslate2
from tokenizers import Tokenizer, decoders, models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--length-penalty", type=float, default=0.6)
    args = parser.parse_args()
    directory = args.bundle / "ctranslate2"
    limits = json.loads((directory / "seq2seq.json").read_text(encoding="utf-8"))
    translator = ctranslate2.Translator(str(directory), device="cpu")
    src = Tokenizer.from_file(str(args.bundle / "src_tokenizer.json"))
    tgt = Tokenizer.from_file(str(args.bundle / "tgt_tokenizer.json"))
    for number, raw in enumerate(sys.stdin.buffer, start=1):
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            line = "\0"
        if "\0" in line:  # as seq2seq translate: an empty line in its place, and a warning
            print(f"line {number}: not UTF-8 text; written as an empty line", file=sys.stderr)
            print("")
            continue
        tokens = src.encode(line).tokens[: limits["max_src_len"]]
        if not tokens:
            print("")
            continue
        limit = max(1, math.floor(len(tokens) * limits["max_len_a"]) + limits["max_len_b"])
        [result] = translator.translate_batch(
            [tokens],
            beam_size=args.beam_size,
            length_penalty=args.length_penalty,
            max_decoding_length=limit,
        )
        print(detokenize(tgt, result.hypotheses[0][:limit]))


def detokenize(tokenizer: Tokenizer, tokens: list[str]) -> str:
    """The target tokens as text, as seq2seq writes it."""
    if isinstance(tokenizer.model, models.WordLevel) and isinstance(
        tokenizer.decoder, decoders.Metaspace
    ):
        return tokenizer.decoder.decode(["\u2581<unk>" if t == "<unk>" else t for t in tokens])
    ids = [tokenizer.token_to_id(token) for token in tokens]
    return tokenizer.decode([1 if i is None else i for i in ids], skip_special_tokens=False)


if __name__ == "__main__":
    main()
