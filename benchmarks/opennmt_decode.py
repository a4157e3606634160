"""Decoding speed of an OpenNMT-py model, run by OpenNMT-py's own Python (not ours).

    OPENNMT_PYTHON benchmarks/opennmt_decode.py SPEC_JSON

The benchmark (``benchmarks.benchmark._opennmt_job``) runs this file as a script with the Python of
the environment OpenNMT-py is installed in, so it imports nothing from seq2seq. SPEC_JSON holds
``model``, ``dev_src``, ``test_src``, ``batch_size``, ``max_length`` and ``repeats``.

It builds OpenNMT-py's inference engine as ``onmt_translate`` does (same option parsing and
validation, one engine per beam size, so the model is loaded once per beam size and loading is not
timed), then times ``engine.infer_list`` over the test sentences (preprocessing, batching, search
and detokenization, as our ``Translator.translate`` over a list of strings) ``repeats`` times with
greedy search and with beam 5, and decodes dev greedily once for BLEU. ``onmt_translate``'s own
"Total translation time (s): %.1f" has 0.1 s resolution, too coarse for 500 sentences.

Prints one line ``SEQ2SEQ_RESULT {json}``: ``greedy_sent_per_s`` and ``beam5_sent_per_s`` (lists,
one rate per repeat), ``dev_hypotheses`` and ``test_sentences``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

MARKER = "SEQ2SEQ_RESULT "


def _engine(spec: dict[str, Any], beam_size: int) -> Any:
    from onmt.bin.translate import _get_parser
    from onmt.inference_engine import InferenceEnginePY
    from onmt.utils.misc import set_random_seed
    from onmt.utils.parse import ArgumentParser

    opt = _get_parser().parse_args(
        [
            "-model", spec["model"],
            "-src", spec["test_src"],  # required by the parser; the sentences come as a list
            "-beam_size", str(beam_size),
            "-batch_size", str(spec["batch_size"]),
            "-batch_type", "sents",
            "-max_length", str(spec["max_length"]),
            "-output", os.devnull,  # it writes every prediction there (default: ./pred.txt)
        ]
    )  # fmt: skip
    # As onmt.bin.translate.translate does before building its engine.
    ArgumentParser.validate_translate_opts(opt)
    ArgumentParser._get_all_transform_translate(opt)
    ArgumentParser._validate_transforms_opts(opt)
    ArgumentParser.validate_translate_opts_dynamic(opt)
    set_random_seed(opt.seed, False)
    return InferenceEnginePY(opt)


def _lines(path: str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines()


def main(spec: dict[str, Any]) -> dict[str, Any]:
    test, dev = _lines(spec["test_src"]), _lines(spec["dev_src"])
    result: dict[str, Any] = {"test_sentences": len(test)}
    for name, beam_size in [("greedy", 1), ("beam5", 5)]:
        engine = _engine(spec, beam_size)
        if beam_size == 1:
            _, predictions = engine.infer_list(dev)
            result["dev_hypotheses"] = [nbest[0] for nbest in predictions]
        rates = []
        for _ in range(spec["repeats"]):
            start = time.perf_counter()
            engine.infer_list(test)
            rates.append(len(test) / (time.perf_counter() - start))
        result[f"{name}_sent_per_s"] = rates
        engine.terminate()
    return result


if __name__ == "__main__":
    print(MARKER + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
