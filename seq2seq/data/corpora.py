"""Real parallel corpora from files: Multi30k (line-parallel files) and Tatoeba (one TSV file).

Reading is strict about what would silently corrupt a corpus and lenient about what is only
untidy:

* files are read as bytes and split on ``\\n`` only (a trailing ``\\r`` is dropped), so a TAB,
  U+2028, U+0085, ``\\x0b`` or ``\\x0c`` inside a sentence stays inside it instead of shifting
  every later line of one language against the other (``str.splitlines`` would split there);
* each line is decoded on its own, so invalid UTF-8 is reported as ``file:line`` with the byte;
* every text is ``normalize``-d (NFC, odd spaces, HTML entities, outer whitespace);
* pairs with an empty side or more tokens than allowed are dropped with a logged count per reason,
  or refused with ``file:line`` when ``strict`` is set;
* a single-file corpus is split with ``split_by_source``, which keeps all translations of one
  source sentence in the same split, so the test set does not leak into training.

Every problem with the data raises ``DataError``, whose message is one paragraph that names the
file (``file:line`` where there is one) and says how to fix it; entry points print it as
``error: <message>`` without a traceback.
"""

from __future__ import annotations

import html
import logging
import random
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from seq2seq.data.toy import Alignment, Example, parse_pharaoh
from seq2seq.errors import ConfigError, Seq2SeqError

log = logging.getLogger(__name__)

Pair = tuple[str, str]  # (source sentence, target sentence)

# U+00A0 no-break space, U+202F narrow no-break space (French puts it before ! ? : ;) and U+2009
# thin space look like spaces but are not separators to every tokenizer: "Salut !" with U+202F
# would become one token "Salut !" for some tools and two for others.
_SPACES = str.maketrans({"\u00a0": " ", "\u202f": " ", "\u2009": " ", "\u200b": None})
# Only complete entities, with their semicolon: html.unescape alone also decodes HTML5's legacy
# forms without one, which turns plain text such as "&notice" into "¬ice".
_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")


class DataError(Seq2SeqError):
    """A corpus file is missing, unreadable or malformed; the message says which and what to do."""


def normalize(text: str, decode_html: bool = True) -> str:
    """NFC; U+00A0, U+202F, U+2009 -> space; U+200B removed; ``&amp;`` etc. decoded; stripped.

    Internal runs of spaces are kept: the word-level tokenizer splits on any whitespace run, so
    collapsing them would change no token, only make the text differ from the file.
    """
    if decode_html and "&" in text:
        # Before the space mapping, so that a decoded &nbsp; becomes a plain space too.
        text = _ENTITY.sub(lambda match: html.unescape(match.group()), text)
    text = text.translate(_SPACES)
    return unicodedata.normalize("NFC", text).strip()


# --- Reading ------------------------------------------------------------------------------------


def _missing_file(path: Path, what: str, how_to_get: str) -> DataError:
    return DataError(
        f"{path} does not exist: expected {what} there. {how_to_get}"
        if how_to_get
        else f"{path} does not exist: expected {what} there. Check the path you gave, or copy "
        "the file there by hand."
    )


def read_lines(path: Path, what: str, how_to_get: str = "") -> list[str]:
    """The decoded lines of ``path``, split on ``\\n`` only; a trailing ``\\r`` is dropped.

    ``what`` describes the file for the missing-file message ("the Multi30k training source file
    train.de"); ``how_to_get`` says how to get it.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise _missing_file(path, what, how_to_get) from None
    except IsADirectoryError:
        raise DataError(
            f"{path} is a directory, but {what} must be a file. Point the config at the file."
        ) from None
    except OSError as error:
        raise DataError(
            f"cannot read {path} ({what}): {error.strerror or error}. Check that the file is "
            "readable by you, or copy it somewhere that is."
        ) from None
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark (Windows editors) is no text
        data, offset = data[3:], 3
    else:
        offset = 0
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":  # the newline that ends the last line starts no line
        raw_lines.pop()
    lines: list[str] = []
    for line_number, raw in enumerate(raw_lines, start=1):
        try:
            lines.append(raw.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError as error:
            bad = raw[error.start]
            raise DataError(
                f"{path}:{line_number}: invalid UTF-8 ({error.reason}) at byte offset "
                f"{offset + error.start} of the file (byte 0x{bad:02x}, the line's byte "
                f"{error.start + 1}). The file must be UTF-8: re-download it, or convert it, e.g. "
                f"with iconv -f LATIN1 -t UTF-8 if it was saved as Latin-1."
            ) from None
        offset += len(raw) + 1
    return lines


def _read_parallel(
    src_path: Path,
    tgt_path: Path,
    decode_html: bool,
    what: tuple[str, str] = ("the source file", "the target file"),
    how_to_get: str = "",
) -> list[Pair]:
    src_lines = read_lines(src_path, what[0], how_to_get)
    tgt_lines = read_lines(tgt_path, what[1], how_to_get)
    if len(src_lines) != len(tgt_lines):
        raise DataError(
            f"{src_path} has {len(src_lines)} lines but {tgt_path} has {len(tgt_lines)}: "
            "line-parallel files need one sentence per line in both languages, so every line "
            "after the first missing or extra one would pair the wrong sentences. Re-download or "
            "re-copy both files (an interrupted copy truncates a file), or fix the one that is off."
        )
    pairs = [
        (normalize(src, decode_html), normalize(tgt, decode_html))
        for src, tgt in zip(src_lines, tgt_lines, strict=True)
    ]
    log.info("read %d pairs from %s and %s", len(pairs), src_path, tgt_path)
    return pairs


def read_parallel(src_path: Path, tgt_path: Path, decode_html: bool = True) -> list[Pair]:
    """Normalized (source, target) pairs from two line-parallel files; line i pairs with line i."""
    return _read_parallel(Path(src_path), Path(tgt_path), decode_html)


def _read_tsv(
    path: Path, decode_html: bool, what: str = "a TSV file", how_to_get: str = ""
) -> tuple[list[Pair], list[int]]:
    """The pairs of ``path`` and the 1-based line number of each."""
    pairs: list[Pair] = []
    line_numbers: list[int] = []
    blank = 0
    for line_number, line in enumerate(read_lines(path, what, how_to_get), start=1):
        if not line.strip():
            blank += 1
            continue
        columns = line.split("\t", 2)  # a third column (Tatoeba's attribution) is ignored
        if len(columns) < 2:
            shown = line if len(line) <= 60 else line[:57] + "..."
            raise DataError(
                f"{path}:{line_number}: no TAB in {shown!r}; each line must be "
                "'source<TAB>target' (further TAB-separated columns are ignored). Fix or delete "
                "that line, or check that the file is the TSV you meant to read."
            )
        pairs.append((normalize(columns[0], decode_html), normalize(columns[1], decode_html)))
        line_numbers.append(line_number)
    log.info("read %d pairs from %s (skipped %d blank lines)", len(pairs), path, blank)
    return pairs, line_numbers


def read_tsv(path: Path, decode_html: bool = True) -> list[Pair]:
    """Normalized (source, target) pairs from ``source<TAB>target[<TAB>ignored...]`` lines."""
    return _read_tsv(Path(path), decode_html)[0]


# --- Filtering ----------------------------------------------------------------------------------


def _drop_reason(pair: Pair, max_src_len: int | None, max_tgt_len: int | None) -> str | None:
    """Why ``pair`` is dropped (the first reason that applies), or None to keep it."""
    src, tgt = pair
    if not src:
        return "empty source"
    if not tgt:
        return "empty target"
    # Whitespace tokens, as the word-level tokenizer (WhitespaceSplit) counts them.
    if max_src_len is not None and len(src.split()) > max_src_len:
        return f"source longer than {max_src_len} tokens"
    if max_tgt_len is not None and len(tgt.split()) > max_tgt_len:
        return f"target longer than {max_tgt_len} tokens"
    return None


def _filter_indices(
    pairs: Sequence[Pair],
    max_src_len: int | None,
    max_tgt_len: int | None,
    strict: bool,
    origin: str,
    locate: Callable[[int], str] | None,
) -> list[int]:
    """Indices of the pairs ``filter_pairs`` keeps (same logging and errors)."""
    kept: list[int] = []
    dropped: dict[str, int] = {}
    for index, pair in enumerate(pairs):
        reason = _drop_reason(pair, max_src_len, max_tgt_len)
        if reason is None:
            kept.append(index)
            continue
        if strict:
            where = locate(index) if locate else f"{origin}, pair {index + 1}"
            raise DataError(
                f"{where}: {reason} (after normalization). With strict=true no pair is dropped "
                "silently: fix or delete that line, raise max_src_len/max_tgt_len, or set "
                "strict=false to drop such pairs and log how many."
            )
        dropped[reason] = dropped.get(reason, 0) + 1
    if dropped:
        counts = "; ".join(
            f"{count} pair{'s' if count != 1 else ''}: {reason}"
            for reason, count in dropped.items()
        )
        # An empty side is a defect of the data; a length limit is the config working as asked.
        level = logging.WARNING if any("empty" in reason for reason in dropped) else logging.INFO
        log.log(level, "%s: dropped %s (kept %d of %d)", origin, counts, len(kept), len(pairs))
    return kept


def filter_pairs(
    pairs: Sequence[Pair],
    max_src_len: int | None,
    max_tgt_len: int | None,
    strict: bool,
    origin: str,
    locate: Callable[[int], str] | None = None,
) -> list[Pair]:
    """The pairs with both sides non-empty and at most ``max_*_len`` whitespace tokens.

    Drops are logged as counts per reason, prefixed by ``origin`` ("Multi30k train"); with
    ``strict`` the first offending pair raises DataError instead, located by ``locate(index)``
    ("train.de:12 and train.en:12"; default: ``origin`` and the pair's 1-based position).
    """
    kept = _filter_indices(pairs, max_src_len, max_tgt_len, strict, origin, locate)
    return [pairs[i] for i in kept]


# --- Splitting ----------------------------------------------------------------------------------


def _target_size(size: int | float, total: int, name: str) -> int:
    """A split size as a number of pairs: an int is a count, a float a fraction of ``total``."""
    if isinstance(size, bool) or not isinstance(size, int | float):
        raise ConfigError(f"{name} must be a count (int) or a fraction (float), got {size!r}.")
    if isinstance(size, float):
        if not 0.0 <= size < 1.0:
            raise ConfigError(f"{name} as a fraction must be in [0, 1), got {size}.")
        return round(size * total)
    if size < 0:
        raise ConfigError(f"{name} must be >= 0, got {size}.")
    return size


def _split_indices(
    sources: Sequence[str], val_size: int | float, test_size: int | float, seed: int
) -> dict[str, list[int]]:
    """Indices of each split, in input order; equal sources always share a split."""
    wanted = {
        "test": _target_size(test_size, len(sources), "test_size"),
        "val": _target_size(val_size, len(sources), "val_size"),
    }
    groups: dict[str, list[int]] = {}  # first-seen order, so the shuffle below is deterministic
    for index, source in enumerate(sources):
        groups.setdefault(source, []).append(index)
    order = list(groups.values())
    random.Random(seed).shuffle(order)
    chosen: dict[str, list[int]] = {"train": [], "val": [], "test": []}
    position = 0
    for split in ("test", "val"):
        # Whole groups until the split has at least its size: it may overshoot by a group.
        while position < len(order) and len(chosen[split]) < wanted[split]:
            chosen[split].extend(order[position])
            position += 1
    for group in order[position:]:
        chosen["train"].extend(group)
    return {split: sorted(indices) for split, indices in chosen.items()}


def split_by_source(
    pairs: Sequence[Pair], val_size: int | float, test_size: int | float, seed: int
) -> dict[str, list[Pair]]:
    """Seeded train/val/test split in which all pairs with the same source share one split.

    Sizes are pair counts (int) or fractions of all pairs (float); as groups of one source are
    never cut, a split may be a few pairs larger than asked. Each split keeps the input order.
    """
    indices = _split_indices([src for src, _ in pairs], val_size, test_size, seed)
    splits = {split: [pairs[i] for i in chosen] for split, chosen in indices.items()}
    log.info(
        "split %d pairs by source sentence (seed %d): %s",
        len(pairs),
        seed,
        ", ".join(f"{split} {len(chosen)}" for split, chosen in splits.items()),
    )
    return splits


# --- Corpora ------------------------------------------------------------------------------------

_SPLIT_NAMES = {"train": "training", "val": "validation", "test": "test"}


def _parallel_locator(src_path: Path, tgt_path: Path) -> Callable[[int], str]:
    return lambda index: f"{src_path}:{index + 1} and {tgt_path}:{index + 1}"


def _tsv_locator(path: Path, line_numbers: Sequence[int]) -> Callable[[int], str]:
    return lambda index: f"{path}:{line_numbers[index]}"


def _examples(
    pairs: Sequence[Pair], alignments: Sequence[Alignment | None] | None = None
) -> list[Example]:
    links = alignments if alignments is not None else [None] * len(pairs)
    return [
        Example(src, tgt, alignment) for (src, tgt), alignment in zip(pairs, links, strict=True)
    ]


def _read_alignments(path: Path, pairs: Sequence[Pair], what: str) -> list[Alignment]:
    """The gold links of ``pairs`` from the Pharaoh file ``path``, line-parallel with them: sure
    links ``i-j`` between 0-based whitespace-separated words, source first, each checked to lie
    inside its sentence pair."""
    lines = read_lines(
        path, what, "Write one line of links per sentence pair, or set data.align=null."
    )
    if len(lines) != len(pairs):
        raise DataError(
            f"{path} has {len(lines)} lines but its sentence files have {len(pairs)}: an "
            "alignment file needs one line per sentence pair (an empty line for none)."
        )
    alignments = []
    for number, (line, (src, tgt)) in enumerate(zip(lines, pairs, strict=True), 1):
        try:
            links = parse_pharaoh(line)
        except ValueError as error:
            raise DataError(
                f"{path}:{number}: {error}. data.align reads sure links i-j only (0-based, source "
                "word first); possible links (i-p-j) are for scripts/alignment.py's AER."
            ) from None
        sizes = len(src.split()), len(tgt.split())
        for i, j in links:
            if not (i < sizes[0] and j < sizes[1]):
                raise DataError(
                    f"{path}:{number}: link {i}-{j} is outside its sentence pair of {sizes[0]} "
                    f"source and {sizes[1]} target words. Links are 0-based, source first; check "
                    "that the file is line-parallel with the sentence files."
                )
        alignments.append(links)
    return alignments


@dataclass(frozen=True)
class ParallelCorpus:
    """Line-parallel files ``{root}/{split}.{lang}``; keys "train", "val", "test".

    Pairs with an empty side are dropped from every split; ``max_src_len``/``max_tgt_len`` apply
    to the training split only, so that test scores stay comparable with published ones.
    """

    root: str
    src_lang: str
    tgt_lang: str
    train: str = "train"
    val: str = "val"
    test: str = "test"
    decode_html: bool = True
    max_src_len: int | None = None
    max_tgt_len: int | None = None
    strict: bool = False
    # The suffix of each split's gold alignment file, {root}/{split}.{align} (Pharaoh, sure links
    # i-j between whitespace-separated words); None: no gold alignments.
    align: str | None = None

    # The scripts/download_data.py name of this corpus, for the missing-file message.
    download_name: ClassVar[str | None] = None

    def _how_to_get(self, root: Path) -> str:
        if self.download_name is None:
            return "Check data.root and the file names in the config, or copy the files there."
        return (
            f"Get it with: seq2seq download {self.download_name} --root {root} "
            "(or copy the files there by hand)."
        )

    def source_files(self) -> list[Path]:
        """The six files ``splits`` reads, source then target of train, val and test.

        The data cache hashes their contents, so they must be exactly what ``splits`` opens.
        """
        root = Path(self.root).expanduser().absolute()
        suffixes = [self.src_lang, self.tgt_lang] + ([self.align] if self.align else [])
        return [
            root / f"{file_stem}.{suffix}"
            for file_stem in (self.train, self.val, self.test)
            for suffix in suffixes
        ]

    def splits(self) -> dict[str, list[Example]]:
        """The "train", "val" and "test" examples, read from the files named by the config."""
        root = Path(self.root).expanduser().absolute()
        name = type(self).__name__
        how_to_get = self._how_to_get(root)
        splits: dict[str, list[Example]] = {}
        for key, file_stem in (("train", self.train), ("val", self.val), ("test", self.test)):
            src_path = root / f"{file_stem}.{self.src_lang}"
            tgt_path = root / f"{file_stem}.{self.tgt_lang}"
            kind = f"the {name} {_SPLIT_NAMES[key]}"
            what = (f"{kind} source file {src_path.name}", f"{kind} target file {tgt_path.name}")
            pairs = _read_parallel(src_path, tgt_path, self.decode_html, what, how_to_get)
            alignments = None
            if self.align:
                align_path = root / f"{file_stem}.{self.align}"
                alignments = _read_alignments(align_path, pairs, f"{kind} alignment file")
            training = key == "train"
            kept_indices = _filter_indices(
                pairs,
                self.max_src_len if training else None,
                self.max_tgt_len if training else None,
                self.strict,
                f"{name} {key}",
                _parallel_locator(src_path, tgt_path),
            )
            kept = [pairs[i] for i in kept_indices]
            if training and not kept:
                raise DataError(
                    f"no training pairs left in {src_path} and {tgt_path} (read {len(pairs)}, "
                    "all dropped or none there): check that the files hold sentences, and that "
                    "max_src_len/max_tgt_len are not too small."
                )
            kept_links = None if alignments is None else [alignments[i] for i in kept_indices]
            splits[key] = _examples(kept, kept_links)
        return splits


@dataclass(frozen=True)
class Multi30k(ParallelCorpus):
    """Multi30k task 1 (Elliott et al., 2016), German -> English by default."""

    root: str = "data/multi30k"
    src_lang: str = "de"
    tgt_lang: str = "en"
    test: str = "test_2016_flickr"

    download_name: ClassVar[str | None] = "multi30k"


@dataclass(frozen=True)
class TsvCorpus:
    """One ``source<TAB>target`` file, split by ``split_by_source``; keys "train", "val", "test".

    Pairs with an empty side are dropped before the split; ``max_src_len``/``max_tgt_len`` apply
    to the training split only, after it, so that the held-out splits do not depend on them.
    ``reverse`` swaps the columns (and the split then groups by the new source).
    """

    path: str
    val_size: float | int = 0.05
    test_size: float | int = 0.05
    seed: int = 1
    reverse: bool = False
    decode_html: bool = True
    max_src_len: int | None = None
    max_tgt_len: int | None = None
    strict: bool = False

    download_name: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        # Fail at instantiate time, not after reading the file.
        _target_size(self.val_size, 1, "val_size")
        _target_size(self.test_size, 1, "test_size")

    def _how_to_get(self, path: Path) -> str:
        if self.download_name is None:
            return "Check data.path in the config, or copy the file there."
        return (
            f"Get it with: seq2seq download {self.download_name} --root "
            f"{path.parent} (or copy the file there by hand)."
        )

    def source_files(self) -> list[Path]:
        """The one file ``splits`` reads (the data cache hashes its contents)."""
        return [Path(self.path).expanduser().absolute()]

    def splits(self) -> dict[str, list[Example]]:
        """The "train", "val" and "test" examples of the file, split by source sentence."""
        path = Path(self.path).expanduser().absolute()
        name = type(self).__name__
        what = f"the {name} sentence-pair file {path.name} (source<TAB>target per line)"
        pairs, line_numbers = _read_tsv(path, self.decode_html, what, self._how_to_get(path))
        if self.reverse:
            pairs = [(tgt, src) for src, tgt in pairs]

        # Filter and split indices, not pairs, so that each pair keeps its line number: a
        # strict refusal in the training split can then still name its line.
        keep = _filter_indices(
            pairs,
            None,
            None,
            self.strict,
            f"{name} ({path.name})",
            _tsv_locator(path, line_numbers),
        )
        kept = [pairs[i] for i in keep]
        kept_lines = [line_numbers[i] for i in keep]
        indices = _split_indices([src for src, _ in kept], self.val_size, self.test_size, self.seed)
        split_pairs = {key: [kept[i] for i in chosen] for key, chosen in indices.items()}
        log.info(
            "%s: split %d pairs by source sentence (seed %d): %s",
            name,
            len(kept),
            self.seed,
            ", ".join(f"{key} {len(chosen)}" for key, chosen in split_pairs.items()),
        )
        train = filter_pairs(
            split_pairs["train"],
            self.max_src_len,
            self.max_tgt_len,
            self.strict,
            f"{name} train",
            _tsv_locator(path, [kept_lines[i] for i in indices["train"]]),
        )
        if not train:
            raise DataError(
                f"no training pairs left from {path} (read {len(pairs)}, {len(kept)} with both "
                f"sides non-empty, {len(split_pairs['train'])} in the training split before the "
                "length limits): check that the file holds sentence pairs, that val_size and "
                "test_size leave pairs for training, and that max_src_len/max_tgt_len are not "
                "too small."
            )
        return {
            "train": _examples(train),
            "val": _examples(split_pairs["val"]),
            "test": _examples(split_pairs["test"]),
        }


@dataclass(frozen=True)
class Tatoeba(TsvCorpus):
    """Tatoeba English -> French (manythings.org "fra-eng", 2019-04-07; the D2L corpus)."""

    path: str = "data/tatoeba-fra-eng/fra.txt"

    download_name: ClassVar[str | None] = "tatoeba"
