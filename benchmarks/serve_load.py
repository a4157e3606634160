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
    bodies: list[bytes],
    first: int,
    count: int,
    latencies: list[float],
    failures: list[str],
    stop_at: float | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Send ``count`` requests (or until ``stop_at``, or until ``stop`` is set), cycling through
    ``bodies`` from ``first`` on, on one keep-alive connection."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    sent = 0

    def more() -> bool:
        if stop is not None:
            return not stop.is_set()
        return (sent < count) if stop_at is None else (time.monotonic() < stop_at)

    while more():
        body = bodies[(first + sent) % len(bodies)]
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


def one_sentence_bodies(sentences: list[str], beam_size: int) -> list[bytes]:
    return [json.dumps({"src": [s], "beam_size": beam_size}).encode() for s in sentences]


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
            args=(server.port, one_sentence_bodies(sentences, beam_size)),
            kwargs={
                "first": i * requests_per_client,
                "count": requests_per_client,
                "latencies": latencies,
                "failures": failures,
            },
        )
        for i in range(clients)
    ]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    p50, p99 = percentiles(latencies)
    return LoadResult(
        batching=batching,
        clients=clients,
        requests=len(latencies),
        failures=len(failures),
        seconds=seconds,
        sentences_per_s=len(latencies) / seconds,
        p50_ms=p50,
        p99_ms=p99,
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
            args=(server.port, one_sentence_bodies(sentences, 1), i * 997, 0),
            kwargs={"latencies": latencies, "failures": failures, "stop_at": stop_at},
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


def mixed(
    server: ServerProcess,
    sentences: list[str],
    heavy_sentences: int,
    heavy_join: int,
    light_clients: int,
    light_requests: int,
) -> dict[str, Any]:
    """One-sentence requests' latency alone, then while one more client sends large requests
    in a loop (``heavy_sentences`` sentences of ``heavy_join`` lines each): how much one heavy
    request within the limits delays everybody else's."""
    lines = [" ".join(sentences[i : i + heavy_join]) for i in range(heavy_sentences)]
    heavy = [json.dumps({"src": lines}).encode()]
    light = one_sentence_bodies(sentences, 1)

    def light_load() -> tuple[list[float], list[str]]:
        latencies: list[float] = []
        failures: list[str] = []
        threads = [
            threading.Thread(
                target=client,
                args=(server.port, light, i * 131, light_requests, latencies, failures),
            )
            for i in range(light_clients)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return latencies, failures

    alone, alone_failures = light_load()
    heavy_latencies: list[float] = []
    heavy_failures: list[str] = []
    stop = threading.Event()
    sender = threading.Thread(
        target=client,
        args=(server.port, heavy, 0, 0, heavy_latencies, heavy_failures),
        kwargs={"stop": stop},
    )
    sender.start()
    while not heavy_latencies and sender.is_alive():  # one heavy request answered: it works
        time.sleep(0.05)
    during, during_failures = light_load()
    stop.set()
    sender.join()
    if heavy_failures:
        raise RuntimeError(f"the large request was not answered: {heavy_failures[0]}")
    return {
        "light_clients": light_clients,
        "light_requests": light_clients * light_requests,
        "heavy_sentences": heavy_sentences,
        "heavy_join": heavy_join,
        "heavy_chars": max(len(line) for line in lines),
        "heavy_requests": len(heavy_latencies),
        "heavy_p50_s": statistics.median(heavy_latencies),
        "alone_ms": percentiles(alone),
        "mixed_ms": percentiles(during),
        "failures": len(alone_failures) + len(during_failures),
    }


def percentiles(latencies: list[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds."""
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return 1000 * statistics.median(ordered), 1000 * p99


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
    heavy: tuple[int, int] | None = None,
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    results: list[LoadResult] = []
    soaked: dict[str, Any] | None = None
    mixed_load: dict[str, Any] | None = None
    for batching in [True, False]:
        server = ServerProcess(model, out / f"{name}_server.log", batching, threads, max_wait_ms)
        try:
            for clients in concurrency:
                result = load(server, sentences, clients, requests_per_client, beam_size, batching)
                results.append(result)
                print(format_row(result), flush=True)
            if batching and soak_seconds > 0:
                soaked = soak(server, sentences, max(concurrency), soak_seconds, 10.0)
            if batching and heavy is not None:
                mixed_load = mixed(server, sentences, *heavy, 4, requests_per_client)
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
        "mixed": mixed_load,
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
    if report.get("mixed"):
        m = report["mixed"]
        lines += [
            "",
            f"Mixed: {m['light_clients']} clients sending one sentence a request "
            f"({m['light_requests']} requests), alone and while one more client sends requests of "
            f"{m['heavy_sentences']} sentences of {m['heavy_join']} lines (up to "
            f"{m['heavy_chars']} characters) in a loop ({m['heavy_requests']} answered, median "
            f"{m['heavy_p50_s']:.2f} s); {m['failures']} failed.",
            "",
            "| one-sentence requests | p50 ms | p99 ms |",
            "|---|---|---|",
            "| alone | {:.1f} | {:.1f} |".format(*m["alone_ms"]),
            "| beside the large requests | {:.1f} | {:.1f} |".format(*m["mixed_ms"]),
        ]
    return "\n".join(lines) + "\n"
