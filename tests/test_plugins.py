"""seq2seq.inference.plugins: which modules a model file may name, and the messages otherwise."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from seq2seq.attention import Attention
from seq2seq.inference.plugins import PluginError, is_trusted, resolve, trusted_modules

SCORING = """
from seq2seq.attention import DotProductAttention


class Sharp(DotProductAttention):
    def score(self, queries, projected_keys):
        return 2 * super().score(queries, projected_keys)
"""


def test_trusting_a_package_trusts_its_modules_and_nothing_that_merely_starts_alike() -> None:
    assert is_trusted("mypkg", ["mypkg"]) and is_trusted("mypkg.attention.cos", ["mypkg"])
    assert not is_trusted("mypkgx", ["mypkg"]) and not is_trusted("other", ["mypkg"])


@pytest.mark.parametrize(
    ("entry", "expected"),
    [("bad name!", "neither a module name"), ("missing_file.py", "there is no such file")],
)
def test_a_bad_trust_entry_says_what_is_wrong(entry: str, expected: str) -> None:
    with pytest.raises(PluginError, match=expected):
        trusted_modules([entry])


def test_a_trusted_file_is_imported_under_its_name_and_resolves(tmp_path: Path) -> None:
    path = tmp_path / "sharp_scoring.py"
    path.write_text(SCORING, encoding="utf-8")
    try:
        trusted = trusted_modules([str(path)])
        assert trusted == frozenset({"sharp_scoring"})
        found = resolve("sharp_scoring.Sharp", trusted, "the file")
        assert issubclass(found, Attention) and found.__name__ == "Sharp"
        assert trusted_modules([str(path)]) == trusted  # the same file again: no clash
    finally:
        sys.modules.pop("sharp_scoring", None)


def test_refusals_name_the_class_the_module_and_the_fix() -> None:
    with pytest.raises(
        PluginError, match=r"'elsewhere\.Cos' is not built.*--trust-module elsewhere"
    ):
        resolve("elsewhere.Cos", frozenset(), "the file")
    with pytest.raises(PluginError, match=r"cannot be imported.*PYTHONPATH"):
        resolve("not_installed_anywhere.Cos", frozenset({"not_installed_anywhere"}), "the file")
    with pytest.raises(PluginError, match=r"'os\.path\.join' is not a scoring function"):
        resolve("os.path.join", frozenset({"os"}), "the file")
