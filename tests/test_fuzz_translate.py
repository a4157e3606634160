"""Fuzzing the translate path: whatever bytes come in, one line comes out per line that went in."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seq2seq import Translator
from seq2seq.inference.translator import translate_stream

# Text a user's file may hold: control characters, CR, NUL, BOMs, combining marks, RTL and CJK
# scripts, emoji, U+2028, surrogates (encoded with surrogatepass, so not valid UTF-8).
NASTY = [
    *"\r\t\x00\x0b\x0c\x1b\x7f\x85\ufeff\u0301\u200b\u200f\u2028\u2029",
    "\ud800",
    "\udfff",
    "日本語",
    "עברית",
    "العربية",
    "🙂",
    "the",
    "dog",
    "cat",
    ".",
    " ",
]

text_lines = st.lists(st.sampled_from(NASTY) | st.text(max_size=20), max_size=40).map(
    lambda parts: "".join(parts).encode("utf-8", "surrogatepass")
)
line = st.one_of(
    st.binary(max_size=200),  # random bytes, mostly invalid UTF-8
    text_lines,
    st.integers(min_value=1, max_value=2000).map(lambda n: b"dog " * n),  # far past max_src_len
)


@pytest.fixture(scope="module")
def translator(tiny_checkpoint: Path) -> Translator:
    return Translator.load(tiny_checkpoint)


def translate_bytes(translator: Translator, data: bytes, beam_size: int) -> tuple[list[str], int]:
    """Feed ``data`` the way scripts/translate.py reads stdin; the output lines and input count."""
    source = list(io.BytesIO(data))  # the lines of a binary file: split after each b"\n" only
    output: list[str] = []
    report = translate_stream(translator, source, output.append, beam_size, chunk_size=7)
    assert report.lines == len(source)
    return output, len(source)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=st.lists(line, max_size=12),
    newline=st.sampled_from([b"\n", b"\r\n"]),
    final_newline=st.booleans(),
    beam_size=st.sampled_from([1, 3]),
)
def test_every_input_line_gets_exactly_one_output_line(
    translator: Translator, lines: list[bytes], newline: bytes, final_newline: bool, beam_size: int
) -> None:
    data = newline.join(lines) + (newline if final_newline and lines else b"")
    output, count = translate_bytes(translator, data, beam_size)
    assert len(output) == count
    assert all(text.endswith("\n") and text.count("\n") == 1 for text in output)
    assert "".join(output).count("\n") == count  # what a reader of the output file counts


@settings(max_examples=20, deadline=None)
@given(data=st.binary(max_size=3000))
def test_a_random_byte_stream_never_crashes(translator: Translator, data: bytes) -> None:
    output, count = translate_bytes(translator, data, beam_size=1)
    assert len(output) == count
