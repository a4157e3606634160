"""Download the real corpora, verify them by sha256 and write them atomically (urllib only).

Each file lands as ``<file>.part`` in the target directory, is fsync-ed, checked against its
sha256 and only then renamed over its final name, so an interrupted or bad download never
replaces a good file. An interrupted transfer is resumed from its ``.part`` with an HTTP Range
request when the server supports it (206), else restarted; dropped connections are retried with
exponential backoff.

The hashes are those of the files as the corpora read them (after gunzip or unzip), not of the
archives: an archive's bytes may change when its host re-compresses it, the sentences must not.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import logging
import os
import time
import urllib.error
import urllib.request
import zipfile
import zlib
from contextlib import ExitStack
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import IO, Literal

from seq2seq.atomic import fsync_directory
from seq2seq.data.corpora import DataError

log = logging.getLogger(__name__)

_CHUNK = 1 << 16
_USER_AGENT = "seq2seq-download/0.1 (python urllib)"


@dataclass(frozen=True)
class RemoteFile:
    """A file as it lands under the data root, and the sha256 of exactly those bytes."""

    name: str
    sha256: str


@dataclass(frozen=True)
class Download:
    """One URL, relative to its dataset's base URL, and the file(s) it unpacks to."""

    remote: str
    unpack: Literal["gunzip", "unzip"]
    files: tuple[RemoteFile, ...]


@dataclass(frozen=True)
class Dataset:
    """A corpus to download: where from, where to by default, and what must arrive."""

    name: str
    base_url: str
    default_root: str
    by_hand: str  # how to get the files without this script, for the error messages
    downloads: tuple[Download, ...]

    def files(self) -> list[str]:
        return [file.name for download in self.downloads for file in download.files]


MULTI30K_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
# Hashes of the gunzipped task-1 raw files at MULTI30K_COMMIT (train.en and train.de are those
# given in ../shared/data/README.md; the others were computed from that byte-identical copy).
_MULTI30K_SHA256 = {
    "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "train.fr": "5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d",
    "val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "val.fr": "5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc",
    "test_2016_flickr.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "test_2016_flickr.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "test_2016_flickr.fr": "cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6",
}

TATOEBA_COMMIT = "adddaf33ac35572bcfeb421efec29435e7ea9332"

DATASETS: dict[str, Dataset] = {
    "multi30k": Dataset(
        name="multi30k",
        base_url=(
            f"https://raw.githubusercontent.com/multi30k/dataset/{MULTI30K_COMMIT}/data/task1/raw"
        ),
        default_root="data/multi30k",
        by_hand=(
            "download the .gz files from https://github.com/multi30k/dataset/tree/"
            f"{MULTI30K_COMMIT}/data/task1/raw and gunzip them"
        ),
        downloads=tuple(
            Download(f"{name}.gz", "gunzip", (RemoteFile(name, sha256),))
            for name, sha256 in _MULTI30K_SHA256.items()
        ),
    ),
    # The 2019-04-07 release of manythings.org's fra-eng.zip (the D2L corpus: 167,130 pairs).
    # manythings.org itself only serves its latest release, whose fra.txt has other sentences
    # and a third (attribution) column, so it cannot match a pinned hash; this commit-pinned copy
    # of the 2019 archive can.
    "tatoeba": Dataset(
        name="tatoeba",
        base_url=f"https://raw.githubusercontent.com/modelexlab/data/{TATOEBA_COMMIT}",
        default_root="data/tatoeba-fra-eng",
        by_hand=(
            f"download fra-eng.zip from https://github.com/modelexlab/data/blob/{TATOEBA_COMMIT}"
            "/fra-eng.zip (the 2019-04-07 release of https://www.manythings.org/anki/fra-eng.zip)"
            " and unzip fra.txt and _about.txt"
        ),
        downloads=(
            Download(
                "fra-eng.zip",
                "unzip",
                (
                    RemoteFile(
                        "fra.txt",
                        "0bb85dbaa1c896844649094d7eaf2e34bee34e84fe362b26ce7e8f2e12aae104",
                    ),
                    RemoteFile(
                        "_about.txt",
                        "79f39a53dbddaf7ab43c801f231089174a611f23987244056f9e3cb5aa79358b",
                    ),
                ),
            ),
        ),
    ),
}


def sha256_of(path: Path) -> str:
    """Hex sha256 of the file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _by_hand(dataset: Dataset, root: Path) -> str:
    paths = ", ".join(str(root / name) for name in dataset.files())
    return f"Or put the files in place by hand: {paths}; to get them, {dataset.by_hand}."


def _cannot_write(path: Path, error: OSError) -> DataError:
    return DataError(
        f"cannot write {path}: {error.strerror or error}. Check the free disk space and that you "
        "may write to that directory, or choose another with --root."
    )


def _range_start(headers: Message) -> int | None:
    """The first byte of a ``Content-Range: bytes START-END/TOTAL`` header, if there is one."""
    value = headers.get("Content-Range", "")
    unit, _, spec = value.partition(" ")
    start, dash, _ = spec.partition("-")
    if unit != "bytes" or not dash or not start.isdigit():
        return None
    return int(start)


class _IncompleteError(Exception):
    """The connection closed before the announced number of bytes arrived."""


def _receive(response: IO[bytes], part: Path, append: bool, expected: int | None) -> None:
    """Write the body of ``response`` to ``part`` (appending or from scratch), then fsync it."""
    try:
        out = part.open("ab" if append else "wb")
    except OSError as error:
        raise _cannot_write(part, error) from None
    received = 0
    with out:
        while True:
            chunk = response.read(_CHUNK)  # network errors propagate to the retry loop
            if not chunk:
                break
            try:
                out.write(chunk)
            except OSError as error:
                raise _cannot_write(part, error) from None
            received += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    # http.client returns b"" rather than raising when a connection closes early, so compare the
    # byte count with Content-Length ourselves.
    if expected is not None and received < expected:
        raise _IncompleteError(f"the connection closed after {received} of {expected} bytes")


def fetch(
    url: str,
    part: Path,
    retries: int,
    backoff: float,
    timeout: float,
    by_hand: str,
) -> None:
    """Download ``url`` to ``part``, resuming what is already there; DataError when it cannot.

    ``retries`` more attempts follow a failed one, after ``backoff``, 2 ``backoff``, 4 ...
    seconds; ``by_hand`` ends the message when the network stays unreachable.
    """
    last_error: BaseException | None = None
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        have = part.stat().st_size if part.exists() else 0
        headers = {"User-Agent": _USER_AGENT}
        if have:
            headers["Range"] = f"bytes={have}-"
        request = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                length = response.headers.get("Content-Length")
                expected = int(length) if length and length.isdigit() else None
                resumed = response.status == 206
                if resumed and _range_start(response.headers) != have:
                    # A range we did not ask for: start over rather than splice it in.
                    part.unlink(missing_ok=True)
                    raise _IncompleteError("the server sent a different byte range than requested")
                if have and not resumed:
                    log.info("%s: the server does not resume downloads; starting over", url)
                elif have:
                    log.info("%s: resuming after %d bytes", url, have)
                _receive(response, part, resumed, expected)
                return
        except urllib.error.HTTPError as error:
            error.close()
            if error.code == 416 and have:  # the range starts at or past the end: start over
                part.unlink(missing_ok=True)
                last_error = error
                continue
            if error.code >= 500 or error.code == 429:  # the server's trouble, maybe passing
                last_error = error
                log.warning(
                    "%s: HTTP %d %s (attempt %d of %d)",
                    url,
                    error.code,
                    error.reason,
                    attempt + 1,
                    retries + 1,
                )
                continue
            raise DataError(
                f"the server answered HTTP {error.code} {error.reason} for {url}: the base URL "
                f"is wrong or the file has moved. {by_hand}"
            ) from None
        except (OSError, http.client.HTTPException, _IncompleteError) as error:
            # URLError (DNS failure, connection refused), timeouts, resets and early closes.
            last_error = error
            log.warning("%s: %s (attempt %d of %d)", url, error, attempt + 1, retries + 1)
    reason = getattr(last_error, "reason", None) or last_error
    attempts = f"{retries + 1} attempt{'s' if retries else ''}"
    resume = f": it resumes from {part}" if part.exists() else ""
    raise DataError(
        f"cannot download {url}: the network or the server is unreachable ({reason}; "
        f"{attempts}). If you are online, run the same command again{resume}. {by_hand}"
    )


def _zip_member(zip_file: zipfile.ZipFile, archive: Path, name: str, target: Path) -> str:
    # Match by base name: some releases keep the files under a folder ("fra-eng/fra.txt").
    for info in zip_file.infolist():
        if not info.is_dir() and Path(info.filename).name == name:
            return info.filename
    raise DataError(
        f"{archive} has no {name} (it holds: {', '.join(zip_file.namelist())}), so it is not the "
        f"expected archive. Check --base-url, or put {target} there by hand."
    )


def _unpack_to_part(
    download: Download, archive: Path, file: RemoteFile, target: Path, part: Path
) -> str:
    """Write ``file`` out of ``archive`` to ``part`` and fsync it; returns its sha256."""
    digest = hashlib.sha256()
    try:
        with ExitStack() as stack:
            source: IO[bytes] | gzip.GzipFile
            if download.unpack == "gunzip":
                source = stack.enter_context(gzip.open(archive, "rb"))
            else:
                zip_file = stack.enter_context(zipfile.ZipFile(archive))
                member = _zip_member(zip_file, archive, file.name, target)
                source = stack.enter_context(zip_file.open(member))
            out = stack.enter_context(part.open("wb"))
            while chunk := source.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
    except (gzip.BadGzipFile, zipfile.BadZipFile, zlib.error, EOFError) as error:
        part.unlink(missing_ok=True)
        archive.unlink(missing_ok=True)  # a corrupt archive must not be resumed next time
        kind = "gzip" if download.unpack == "gunzip" else "zip"
        raise DataError(
            f"{archive} is not a valid {kind} archive ({error}); it was deleted. Run the download "
            f"again, or put {target} there by hand."
        ) from None
    except DataError:
        part.unlink(missing_ok=True)
        raise
    except OSError as error:
        part.unlink(missing_ok=True)
        raise _cannot_write(part, error) from None
    return digest.hexdigest()


def _is_current(path: Path, sha256: str) -> bool:
    return path.is_file() and sha256_of(path) == sha256


def download(
    dataset: Dataset | str,
    root: Path | str | None = None,
    base_url: str | None = None,
    retries: int = 3,
    backoff: float = 1.0,
    timeout: float = 30.0,
) -> list[Path]:
    """Download ``dataset`` (a ``DATASETS`` name or a Dataset) into ``root``; its file paths.

    Files already there with the right sha256 are kept; ``base_url`` replaces the dataset's
    (a mirror, or a local server in tests).
    """
    if isinstance(dataset, str):
        if dataset not in DATASETS:
            raise DataError(
                f"no dataset named {dataset!r}; choose one of {', '.join(sorted(DATASETS))}."
            )
        dataset = DATASETS[dataset]
    root = Path(root if root is not None else dataset.default_root).expanduser().absolute()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _cannot_write(root, error) from None
    by_hand = _by_hand(dataset, root)
    base = (base_url or dataset.base_url).rstrip("/")
    paths: list[Path] = []
    for item in dataset.downloads:
        targets = [root / file.name for file in item.files]
        paths.extend(targets)
        if all(_is_current(t, f.sha256) for t, f in zip(targets, item.files, strict=True)):
            log.info("%s: already there with the right sha256", ", ".join(map(str, targets)))
            continue
        url = f"{base}/{item.remote}"
        archive = root / f"{item.remote}.part"
        log.info("downloading %s", url)
        fetch(url, archive, retries, backoff, timeout, by_hand)
        for file, target in zip(item.files, targets, strict=True):
            part = root / f"{file.name}.part"
            actual = _unpack_to_part(item, archive, file, target, part)
            if actual != file.sha256:
                part.unlink(missing_ok=True)
                archive.unlink(missing_ok=True)  # else the next run would resume a bad file
                raise DataError(
                    f"{target} from {url} has the wrong sha256: expected {file.sha256}, got "
                    f"{actual}. The bad download was deleted"
                    + (" and the existing file left as it was" if target.exists() else "")
                    + ". The server may hold another release or have sent a damaged copy: try "
                    f"again, or another mirror with --base-url. {by_hand}"
                )
            os.replace(part, target)
            fsync_directory(root)
            log.info("wrote %s (sha256 verified)", target)
        archive.unlink(missing_ok=True)
    return paths
