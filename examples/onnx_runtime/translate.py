"""Greedy translation with a seq2seq bundle's ONNX graphs, and nothing of seq2seq: onnxruntime,
numpy and tokenizers only (pip install onnxruntime numpy tokenizers).

    python translate.py BUNDLE < sentences.txt > translations.txt

BUNDLE is a directory written by ``seq2seq export --checkpoint CKPT --out BUNDLE --onnx``:
``encoder.onnx`` and ``decoder_step.onnx`` (with their ``.onnx.data`` files, if any: copy them
too), ``src_tokenizer.json``, ``tgt_tokenizer.json`` and ``config.json``. It decodes one sentence
at a time, as plainly as possible; ``seq2seq translate --backend onnx`` batches and beam-searches
the same graphs, and gives the same greedy translations.

The conventions (docs/serving.md, "Decoding the ONNX graphs yourself"):

- source ids: the source tokenizer's ids, no start or end token, cut to ``max_src_len``;
- the decoder starts from the start token and stops at the end token or after
  floor(max_len_a · S) + max_len_b steps (S: the source tokens read), end token included;
- the step graph's ``logits (R, V)`` are raw scores (before the softmax): greedy takes the
  largest;
- an RNN model carries its state (``state_*`` in, ``next_state_*`` out); a Transformer carries
  ``position (R,)`` and a static cache, ``cache_keys_l (R, h, T, k)`` and
  ``cache_values_l (R, h, T, d)`` per layer, zeros at first, T at least the step limit + 1;
- a graph declares only the inputs it reads: feed those.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime
from tokenizers import Tokenizer, decoders, models


class OnnxTranslator:
    def __init__(self, bundle: Path) -> None:
        config = json.loads((bundle / "config.json").read_text(encoding="utf-8"))
        special = config["special_tokens"]  # {"<pad>": 0, "<unk>": 1, "<bos>": 2, "<eos>": 3}
        self.pad, self.unk = special["<pad>"], special["<unk>"]
        self.bos, self.eos = special["<bos>"], special["<eos>"]
        decoding = config["decoding"]
        self.a, self.b = float(decoding["max_len_a"]), int(decoding["max_len_b"])
        self.max_src_len = int(decoding["max_src_len"])
        self.src = Tokenizer.from_file(str(bundle / "src_tokenizer.json"))
        self.tgt = Tokenizer.from_file(str(bundle / "tgt_tokenizer.json"))
        self.encoder = onnxruntime.InferenceSession(
            str(bundle / "encoder.onnx"), providers=["CPUExecutionProvider"]
        )
        self.step = onnxruntime.InferenceSession(
            str(bundle / "decoder_step.onnx"), providers=["CPUExecutionProvider"]
        )
        self.step_inputs = {node.name: node.shape for node in self.step.get_inputs()}
        self.transformer = "position" in self.step_inputs

    def translate(self, sentence: str) -> str:
        ids = self.src.encode(sentence).ids[: self.max_src_len]
        if not ids:
            return ""  # nothing to translate: an RNN cannot encode an empty source
        src = np.array([ids], dtype=np.int64)  # (1, S)
        src_lens = np.array([len(ids)], dtype=np.int64)  # (1,)
        limit = max(1, int(np.floor(len(ids) * self.a)) + self.b)
        names = [output.name for output in self.encoder.get_outputs()]
        outputs = self.encoder.run(None, {"src": src, "src_lens": src_lens})
        encoded = dict(zip(names, outputs, strict=True))
        feeds = {"src_lens": src_lens, **encoded}
        if self.transformer:
            feeds["position"] = np.zeros(1, dtype=np.int64)
            for name, shape in self.step_inputs.items():
                if name.startswith("cache_"):  # (R, h, T, k or d): h and k fixed by the graph
                    feeds[name] = np.zeros((1, shape[1], limit + 1, shape[3]), dtype=np.float32)
        # An RNN's first state is the encoder's state_* outputs, already in feeds.
        token, output = self.bos, []
        step_outputs = [output.name for output in self.step.get_outputs()]
        for _ in range(limit):
            feeds["prev_tokens"] = np.array([token], dtype=np.int64)
            step = self.step.run(None, {name: feeds[name] for name in self.step_inputs})
            results = dict(zip(step_outputs, step, strict=True))
            token = int(results["logits"][0].argmax())
            if token == self.eos:
                break
            output.append(token)
            for name, value in results.items():  # next_state_h -> state_h, next_cache_* -> ...
                if name.startswith("next_"):
                    feeds[name.removeprefix("next_")] = value
            if self.transformer:
                feeds["position"] = feeds["position"] + 1
        return self.detokenize(output)

    def detokenize(self, ids: list[int]) -> str:
        ids = [i for i in ids if i not in (self.pad, self.bos)]
        if isinstance(self.tgt.model, models.WordLevel) and isinstance(
            self.tgt.decoder, decoders.Metaspace
        ):
            # A word-level <unk> stands for a whole word: give it its space back.
            tokens = ["\u2581<unk>" if i == self.unk else self.tgt.id_to_token(i) for i in ids]
            return self.tgt.decoder.decode(tokens)
        return self.tgt.decode(ids, skip_special_tokens=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path, help="a bundle exported with --onnx")
    args = parser.parse_args()
    translator = OnnxTranslator(args.bundle)
    # Line by line as bytes: a line that is not UTF-8, or holds a NUL, becomes an empty line
    # with a warning, as seq2seq translate does, and the others keep their places.
    for number, raw in enumerate(sys.stdin.buffer, start=1):
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            line = None
        if line is None or "\0" in line:
            print(f"line {number}: not UTF-8 text; written as an empty line", file=sys.stderr)
            print()
            continue
        print(translator.translate(line))


if __name__ == "__main__":
    main()
