"""Checkpoints and bundles written before the redesign (issue 30) load and translate as they did.

``tests/data/legacy`` holds two small trained models (Bahdanau + additive, Luong + dot), each as
a checkpoint and an export bundle, and what that version's ``translate.py`` wrote for 40 toy
sentences, greedy and with beam 5 (its README says how they were made). Today's code must give
the same lines from every file, through the kernels (the default) and through the reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from seq2seq import Translator
from seq2seq.inference.bundle import load
from seq2seq.kernels import is_accelerated

LEGACY = Path(__file__).parent / "data" / "legacy"
SOURCES = (LEGACY / "sources.txt").read_text(encoding="utf-8").splitlines()


def expected(decoder: str, beam_size: int) -> list[str]:
    name = "greedy" if beam_size == 1 else f"beam{beam_size}"
    return (LEGACY / f"{decoder}.{name}.txt").read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("decoder", ["bahdanau", "luong"])
@pytest.mark.parametrize("file", ["checkpoint", "bundle"])
@pytest.mark.parametrize("beam_size", [1, 5])
@pytest.mark.parametrize("kernels", ["auto", "off"])
def test_files_from_before_the_redesign_translate_as_they_did(
    decoder: str, file: str, beam_size: int, kernels: str
) -> None:
    path = LEGACY / (f"{decoder}.ckpt" if file == "checkpoint" else f"{decoder}_bundle")
    translator = Translator.load(path, kernels=kernels)
    assert is_accelerated(translator.model) is (kernels == "auto")
    assert translator.translate(SOURCES, beam_size=beam_size) == expected(decoder, beam_size)


@pytest.mark.parametrize("decoder", ["bahdanau", "luong"])
def test_their_state_dict_keys_are_todays(decoder: str) -> None:
    """The parameters load by name, none missing and none left over (``load`` is strict)."""
    trained = load(LEGACY / f"{decoder}.ckpt")
    bundle = load(LEGACY / f"{decoder}_bundle")
    assert trained.model.state_dict().keys() == bundle.model.state_dict().keys()
