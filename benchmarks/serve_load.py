"""A bounded load test of scripts/serve.py on loopback: sentences/s and latency by concurrency,
batching on and off, and an optional soak that samples the server's memory.

Each configuration starts its own server (127.0.0.1, a free port), waits for GET /health, then
for each concurrency C runs C client threads that send ``requests_per_client`` requests of one
sentence each (greedy unless told) on keep-alive connections, and stops by itself. The clients
share the machine with the server; the report says how many cores there were.
"""

from __future__ import annotations

import http.client
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class LoadResult:
    batching: bool
    clients: int
    requests: int
    failures: int
    seconds: float
    sentences_per_s: float
    p50_ms: float
    p99_ms: float
    batches: int | None = None


class ServerProcess:
    """scripts/serve.py in a child process, its log in a file."""

    def __init__(self, model: Path, log: Path, batching: bool, threads: int, max_wait_ms: float):
        arguments = [
            sys.executable, "scripts/serve.py", "--model", f"model={model}", "--port", "0",
            "--threads", str(threads), "--max-wait-ms", str(max_wait_ms),
            *([] if batching else ["--no-batching"]),
        ]  # fmt: skip
        self.log = log
        with open(log, "wb") as output:
            self.process = subprocess.Popen(
                arguments,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 300
        while not (found := re.search(r"running on http://127\.0\.0\.1:(\d+)", log.read_text())):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"the server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
        self.port = int(found.group(1))
        while self.get("/health")[0] != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server never became ready:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)

    def get(self, path: str) -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, json.loads(response.read())
        finally:
            connection.close()

    def rss_mb(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        kilobytes = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))  # type: ignore[union-attr]
        return kilobytes / 1024

    def stop(self) -> int:
        self.process.terminate()
        return self.process.wait(timeout=120)


def client(
    port: int,
    sentences: list[str],
    first: int,
    count: int,
    beam_size: int,
    latencies: list[float],
    failures: list[str],
    stop_at: float | None = None,
) -> None:
    """Send ``count`` requests (or until ``stop_at``) of one sentence each, from ``first`` on."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    sent = 0
    while (sent < count) if stop_at is None else (time.monotonic() < stop_at):
        sentence = sentences[(first + sent) % len(sentences)]
        body = json.dumps({"src": [sentence], "beam_size": beam_size}).encode()
        start = time.perf_counter()
        try:
            connection.request("POST", "/translate", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = response.read()
            if response.status != 200:
                failures.append(f"{response.status}: {answer[:200]!r}")
        except (OSError, http.client.HTTPException) as error:
            failures.append(repr(error))
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        latencies.append(time.perf_counter() - start)
        sent += 1
    connection.close()


def load(
    server: ServerProcess,
    sentences: list[str],
    clients: int,
    requests_per_client: int,
    beam_size: int,
    batching: bool,
) -> LoadResult:
    latencies: list[float] = []
    failures: list[str] = []
    threads = [
        threading.Thread(
            target=client,
            args=(server.port, sentences, i * requests_per_client, requests_per_client),
            kwargs={"beam_size": beam_size, "latencies": latencies, "failures": failures},
        )
        for i in range(clients)
    ]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    ordered = sorted(latencies)
    return LoadResult(
        batching=batching,
        clients=clients,
        requests=len(latencies),
        failures=len(failures),
        seconds=seconds,
        sentences_per_s=len(latencies) / seconds,
        p50_ms=1000 * statistics.median(ordered),
        p99_ms=1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    )


def soak(
    server: ServerProcess, sentences: list[str], clients: int, seconds: float, sample_every: float
) -> dict[str, Any]:
    """``clients`` clients for ``seconds``; the server's RSS every ``sample_every`` seconds."""
    latencies: list[float] = []
    failures: list[str] = []
    stop_at = time.monotonic() + seconds
    threads = [
        threading.Thread(
            target=client,
            args=(server.port, sentences, i * 997, 0, 1, latencies, failures, stop_at),
        )
        for i in range(clients)
    ]
    for thread in threads:
        thread.start()
    samples = []
    start = time.monotonic()
    while time.monotonic() < stop_at:
        samples.append((round(time.monotonic() - start, 1), round(server.rss_mb(), 1)))
        time.sleep(sample_every)
    for thread in threads:
        thread.join()
    return {
        "clients": clients,
        "seconds": seconds,
        "requests": len(latencies),
        "failures": len(failures),
        "rss_mb": samples,
    }


def run_load_test(
    model: Path,
    sentences: list[str],
    out: Path,
    name: str,
    concurrency: list[int],
    requests_per_client: int,
    beam_size: int = 1,
    threads: int = 2,
    max_wait_ms: float = 5.0,
    soak_seconds: float = 0.0,
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    results: list[LoadResult] = []
    soaked: dict[str, Any] | None = None
    for batching in [True, False]:
        server = ServerProcess(model, out / f"{name}_server.log", batching, threads, max_wait_ms)
        try:
            for clients in concurrency:
                result = load(server, sentences, clients, requests_per_client, beam_size, batching)
                results.append(result)
                print(format_row(result), flush=True)
            if batching and soak_seconds > 0:
                soaked = soak(server, sentences, max(concurrency), soak_seconds, 10.0)
        finally:
            server.stop()
    report = {
        "name": name,
        "model": str(model),
        "beam_size": beam_size,
        "server_threads": threads,
        "max_wait_ms": max_wait_ms,
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "results": [asdict(result) for result in results],
        "soak": soaked,
    }
    (out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown(report))
    return report


def format_row(result: LoadResult) -> str:
    return (
        f"| {'on' if result.batching else 'off'} | {result.clients} | {result.requests} | "
        f"{result.sentences_per_s:.1f} | {result.p50_ms:.1f} | {result.p99_ms:.1f} | "
        f"{result.failures} |"
    )


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Load test: {report['name']}",
        "",
        f"{report['cpus']} CPUs ({report['machine']}), server on {report['server_threads']} torch "
        f"threads, beam {report['beam_size']}, one sentence a request, max wait "
        f"{report['max_wait_ms']} ms; clients on the same machine.",
        "",
        "| batching | clients | requests | sentences/s | p50 ms | p99 ms | failed |",
        "|---|---|---|---|---|---|---|",
    ]
    results = [LoadResult(**r) for r in report["results"]]
    lines += [format_row(result) for result in results]
    by_key = {(r.batching, r.clients): r for r in results}
    lines += ["", "| clients | throughput, batching on / off |", "|---|---|"]
    for clients in sorted({r.clients for r in results}):
        on, off = by_key.get((True, clients)), by_key.get((False, clients))
        if on and off:
            lines.append(f"| {clients} | {on.sentences_per_s / off.sentences_per_s:.2f}x |")
    if report["soak"]:
        soaked = report["soak"]
        rss = [mb for _, mb in soaked["rss_mb"]]
        lines += [
            "",
            f"Soak: {soaked['clients']} clients for {soaked['seconds']:.0f} s, "
            f"{soaked['requests']} requests, {soaked['failures']} failed; server RSS "
            f"{rss[0]:.0f} MB at the start, {rss[len(rss) // 2]:.0f} MB halfway, {rss[-1]:.0f} MB "
            f"at the end (max {max(rss):.0f} MB).",
        ]
    return "\n".join(lines) + "\n"
