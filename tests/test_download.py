"""Downloads against a local HTTP server: checksums, atomic writes, resume, retries, no network."""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import socket
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from seq2seq.data.corpora import DataError
from seq2seq.data.download import DATASETS, Dataset, Download, RemoteFile, download

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

# Text that compresses badly enough to give gzip a body worth cutting in half.
TRAIN_DE = "".join(
    f"Satz {i} mit {hashlib.md5(str(i).encode()).hexdigest()}\n" for i in range(3000)
)
TRAIN_EN = "".join(f"sentence {i}\n" for i in range(3000))


def sha256(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


class FileServer(ThreadingHTTPServer):
    """Serves ``files`` by URL path; can drop the first response of some paths half-way."""

    def __init__(self, files: dict[str, bytes], drop_first: set[str], ranges: bool) -> None:
        super().__init__(("127.0.0.1", 0), RangeHandler)
        self.files = files
        self.drop_first = set(drop_first)
        self.ranges = ranges
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class RangeHandler(BaseHTTPRequestHandler):
    server: FileServer

    def do_GET(self) -> None:
        range_header = self.headers.get("Range")
        self.server.requests.append((self.path, range_header))
        data = self.server.files.get(self.path)
        if data is None:
            self.send_error(404)
            return
        start = 0
        match = re.fullmatch(r"bytes=(\d+)-", range_header or "")
        if self.server.ranges and match:
            start = int(match.group(1))
            if start >= len(data):
                self.send_error(416)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path in self.server.drop_first:
            # Announce the whole body, send half of it, hang up: a dropped connection.
            self.server.drop_first.discard(self.path)
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # keep pytest output quiet
        pass


@contextmanager
def serve(
    files: dict[str, bytes], drop_first: set[str] | None = None, ranges: bool = True
) -> Iterator[FileServer]:
    server = FileServer(files, drop_first or set(), ranges)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def closed_port() -> int:
    """A local port with nothing listening (connections are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def gzip_dataset(train_de_sha256: str | None = None) -> tuple[Dataset, dict[str, bytes]]:
    """Two gzipped files and their registry entry; ``train_de_sha256`` overrides the right hash."""
    dataset = Dataset(
        name="tiny",
        base_url="http://unused.invalid",
        default_root="unused",
        by_hand="download them from the tiny server and gunzip them",
        downloads=(
            Download(
                "train.de.gz",
                "gunzip",
                (RemoteFile("train.de", train_de_sha256 or sha256(TRAIN_DE)),),
            ),
            Download("train.en.gz", "gunzip", (RemoteFile("train.en", sha256(TRAIN_EN)),)),
        ),
    )
    files = {
        "/train.de.gz": gzip.compress(TRAIN_DE.encode(), mtime=0),
        "/train.en.gz": gzip.compress(TRAIN_EN.encode(), mtime=0),
    }
    return dataset, files


def no_part_files(root: Path) -> bool:
    return not list(root.glob("*.part"))


def test_download_verifies_and_writes_atomically(tmp_path: Path) -> None:
    dataset, files = gzip_dataset()
    with serve(files) as server:
        paths = download(dataset, tmp_path, base_url=server.url, backoff=0.0)
    assert paths == [tmp_path / "train.de", tmp_path / "train.en"]
    assert (tmp_path / "train.de").read_text() == TRAIN_DE
    assert (tmp_path / "train.en").read_text() == TRAIN_EN
    assert no_part_files(tmp_path)


def test_files_with_the_right_hash_are_not_downloaded_again(tmp_path: Path) -> None:
    dataset, files = gzip_dataset()
    (tmp_path / "train.de").write_text(TRAIN_DE)
    (tmp_path / "train.en").write_text("stale\n")  # wrong hash: fetched again and replaced
    with serve(files) as server:
        download(dataset, tmp_path, base_url=server.url, backoff=0.0)
    assert [path for path, _ in server.requests] == ["/train.en.gz"]
    assert (tmp_path / "train.en").read_text() == TRAIN_EN


def test_wrong_checksum_is_refused_and_the_bad_file_removed(tmp_path: Path) -> None:
    dataset, files = gzip_dataset(train_de_sha256="0" * 64)
    (tmp_path / "train.de").write_text("the previous file\n")
    with serve(files) as server, pytest.raises(DataError) as error:
        download(dataset, tmp_path, base_url=server.url, backoff=0.0)
    message = str(error.value)
    assert str(tmp_path / "train.de") in message
    assert f"expected {'0' * 64}, got {sha256(TRAIN_DE)}" in message
    assert "\n" not in message
    assert (tmp_path / "train.de").read_text() == "the previous file\n"  # untouched
    assert no_part_files(tmp_path)


@pytest.mark.parametrize("ranges", [True, False], ids=["resumes", "restarts"])
def test_dropped_connection_is_retried(tmp_path: Path, ranges: bool) -> None:
    dataset, files = gzip_dataset()
    with serve(files, drop_first={"/train.de.gz"}, ranges=ranges) as server:
        download(dataset, tmp_path, base_url=server.url, retries=2, backoff=0.01)
    assert (tmp_path / "train.de").read_text() == TRAIN_DE
    assert no_part_files(tmp_path)
    attempts = [header for path, header in server.requests if path == "/train.de.gz"]
    half = len(files["/train.de.gz"]) // 2
    # The retry asks for the rest; a server without Range support sends it all again.
    assert attempts == [None, f"bytes={half}-"]


def test_zip_members_are_found_in_a_folder_and_verified(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("fra-eng/fra.txt", "Go.\tVa !\n")
        archive.writestr("fra-eng/_about.txt", "about\n")
    dataset = Dataset(
        "tiny-zip",
        "http://unused.invalid",
        "unused",
        "unzip it",
        (
            Download(
                "fra-eng.zip",
                "unzip",
                (
                    RemoteFile("fra.txt", sha256("Go.\tVa !\n")),
                    RemoteFile("_about.txt", sha256("about\n")),
                ),
            ),
        ),
    )
    with serve({"/fra-eng.zip": buffer.getvalue()}) as server:
        download(dataset, tmp_path, base_url=server.url + "/", backoff=0.0)
    assert (tmp_path / "fra.txt").read_text() == "Go.\tVa !\n"
    assert (tmp_path / "_about.txt").read_text() == "about\n"
    assert no_part_files(tmp_path)


def test_http_404_says_the_url_is_wrong(tmp_path: Path) -> None:
    dataset, _ = gzip_dataset()
    with serve({}) as server, pytest.raises(DataError, match="HTTP 404"):
        download(dataset, tmp_path, base_url=server.url, backoff=0.0)


def test_no_server_says_network_unreachable_and_where_to_put_files(tmp_path: Path) -> None:
    dataset, _ = gzip_dataset()
    with pytest.raises(DataError) as error:
        download(
            dataset, tmp_path, base_url=f"http://127.0.0.1:{closed_port()}", retries=1, backoff=0.01
        )
    message = str(error.value)
    assert "unreachable" in message and "2 attempts" in message
    assert str(tmp_path / "train.de") in message and str(tmp_path / "train.en") in message
    assert "download them from the tiny server" in message
    assert "\n" not in message


def test_registry_pins_the_readme_hashes() -> None:
    multi30k = {f.name: f.sha256 for d in DATASETS["multi30k"].downloads for f in d.files}
    assert len(multi30k) == 9
    assert multi30k["train.en"].startswith("460a15fbd157")
    assert multi30k["train.de"].startswith("2c2b73fd2b54")
    tatoeba = {f.name: f.sha256 for d in DATASETS["tatoeba"].downloads for f in d.files}
    assert tatoeba["fra.txt"] == "0bb85dbaa1c896844649094d7eaf2e34bee34e84fe362b26ce7e8f2e12aae104"


def test_registry_matches_the_real_files(tmp_path: Path) -> None:
    """The registry's hashes and archive layout, served from local copies of the real files."""
    if not SHARED_DATA.exists():
        pytest.skip(f"{SHARED_DATA} is absent: this test serves the real corpora locally")
    files = {
        f"/{path.name}.gz": gzip.compress(path.read_bytes(), compresslevel=1, mtime=0)
        for path in (SHARED_DATA / "multi30k").iterdir()
    }
    with serve(files) as server:
        paths = download("multi30k", tmp_path / "multi30k", base_url=server.url, backoff=0.0)
    assert len(paths) == 9 and all(path.is_file() for path in paths)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for name in ("fra.txt", "_about.txt"):
            archive.write(SHARED_DATA / "tatoeba-fra-eng" / name, f"fra-eng/{name}")
    with serve({"/fra-eng.zip": buffer.getvalue()}) as server:
        paths = download("tatoeba", tmp_path / "tatoeba", base_url=server.url, backoff=0.0)
    assert paths == [tmp_path / "tatoeba" / "fra.txt", tmp_path / "tatoeba" / "_about.txt"]


# --- scripts/download_data.py -------------------------------------------------------------------


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "download_data.py"), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_cli_rejects_an_unknown_name() -> None:
    result = run_script("wmt14")
    assert result.returncode == 2
    assert "invalid choice: 'wmt14'" in result.stderr


def test_cli_reports_data_error_in_one_paragraph_without_traceback(tmp_path: Path) -> None:
    result = run_script(
        "tatoeba",
        "--root",
        str(tmp_path),
        "--base-url",
        f"http://127.0.0.1:{closed_port()}",
        "--retries",
        "0",
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1 and result.stderr.rstrip().endswith(error_lines[0])
    assert "unreachable" in error_lines[0] and str(tmp_path / "fra.txt") in error_lines[0]


def test_corrupt_archive_is_deleted_and_reported(tmp_path: Path) -> None:
    dataset, files = gzip_dataset()
    files["/train.de.gz"] = files["/train.de.gz"][:100]  # truncated, as a broken mirror sends it
    with serve(files) as server, pytest.raises(DataError, match="not a valid gzip archive"):
        download(dataset, tmp_path, base_url=server.url, backoff=0.0)
    assert not (tmp_path / "train.de").exists()
    assert no_part_files(tmp_path)
