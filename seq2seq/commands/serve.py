"""Serve models over HTTP: concurrent requests are merged into batched searches.

    python scripts/serve.py --model additive=runs/a/bundle --model scaled_dot=runs/b/bundle
    curl -s localhost:8000/translate -d '{"model": "additive", "src": ["a sentence"]}'

POST /translate, GET /models, GET /health (README "Serving"). Needs the serve extra:
pip install -e ".[serve]". Listens on 127.0.0.1 unless --host says otherwise; SIGTERM or Ctrl+C
answers the requests already accepted (for --drain-timeout seconds; later ones get a 503 and
the exit status is 1), then exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

from seq2seq.cli import (
    UsageError,
    add_backend_argument,
    add_trust_argument,
    int_at_least,
    named_paths,
    run,
)
from seq2seq.errors import SERVER, require_extra

if TYPE_CHECKING:
    from seq2seq.serving.server import ModelSource

log = logging.getLogger("seq2seq.serve")
API_KEY_VARIABLE = "SEQ2SEQ_API_KEY"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        dest="models",
        action="append",
        required=True,
        metavar="NAME=PATH",
        help="a bundle dir or checkpoint, and the name requests use for it (repeatable; "
        "PATH alone: named after the file or directory)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    parser.add_argument(
        "--port", type=int_at_least(0, 65535), default=8000, help="port (8000; 0: any free one)"
    )
    parser.add_argument(
        "--api-key",
        help=f"require 'Authorization: Bearer KEY' (or set {API_KEY_VARIABLE}); none by default",
    )
    parser.add_argument(
        "--max-batch-size", type=int_at_least(1), default=64, help="sentences a search (64)"
    )
    parser.add_argument(
        "--max-wait-ms", type=float, default=5.0, help="how long a request waits for others (5)"
    )
    parser.add_argument(
        "--max-batch-tokens",
        type=int_at_least(1),
        default=4096,
        help="what one search may run: its sentences × the longest one's length limit (a·S + b) "
        "× beam_size; a larger request is translated a batch at a time, taking turns with the "
        "others (4096)",
    )
    parser.add_argument(
        "--no-batching",
        action="store_true",
        help="no two requests share a search (the load test's baseline)",
    )
    parser.add_argument(
        "--max-sentences", type=int_at_least(1), default=64, help="sentences a request (64)"
    )
    parser.add_argument(
        "--max-chars", type=int_at_least(1), default=2000, help="characters a sentence (2000)"
    )
    parser.add_argument(
        "--max-beam-size", type=int_at_least(1), default=16, help="largest beam_size (16)"
    )
    parser.add_argument(
        "--max-body-bytes", type=int_at_least(1), default=1_000_000, help="request body (1 MB)"
    )
    parser.add_argument(
        "--max-queue",
        type=int_at_least(1),
        default=256,
        help="requests waiting for or in progress on one model; more get 503 with Retry-After "
        "(256)",
    )
    parser.add_argument(
        "--max-request-tokens",
        type=int_at_least(1),
        default=20_000,
        help="target tokens a request's search may produce: each sentence's length limit "
        "(a·S + b) times beam_size, summed; more is a 413 (20000)",
    )
    parser.add_argument(
        "--max-attention-cells",
        type=int_at_least(1),
        default=1_000_000,
        help="attention weights a request may ask back (source × target tokens, summed); "
        "more is a 413 (1000000)",
    )
    parser.add_argument(
        "--request-timeout",
        type=seconds_from(0.1, 3600),
        default=60.0,
        help="seconds from a request's arrival to its answer; past it, a 504 and its work "
        "dropped (60)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=seconds_from(0, 3600),
        default=30.0,
        help="on SIGTERM or Ctrl+C, seconds to answer the requests already accepted; those "
        "left then get a 503 and the exit status is 1 (30)",
    )
    parser.add_argument(
        "--header-timeout",
        type=seconds_from(0.1, 600),
        default=10.0,
        help="seconds a connection may take to send a request's headers; then it is closed (10)",
    )
    parser.add_argument(
        "--body-timeout",
        type=seconds_from(0.1, 600),
        default=10.0,
        help="seconds a request's body may take to arrive; then a 408 (10)",
    )
    parser.add_argument(
        "--write-timeout",
        type=seconds_from(0.1, 3600),
        default=30.0,
        help="seconds a client may leave a backed-up answer unread; then its connection is "
        "aborted and the unsent bytes freed (30)",
    )
    parser.add_argument(
        "--keep-alive-timeout",
        type=seconds_from(0, 600),
        default=5.0,
        help="seconds an idle kept-alive connection stays open (5)",
    )
    parser.add_argument(
        "--limit-concurrency",
        type=int_at_least(1),
        default=512,
        help="connections (idle ones too) or requests at once; past it a request is a 503 with "
        "Retry-After, but /health/live and /metrics answer (512)",
    )
    parser.add_argument(
        "--cors-origin",
        dest="cors_origins",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web page origin (https://host[:port]) whose scripts may call the API from a "
        "browser (repeatable; none by default)",
    )
    parser.add_argument("--threads", type=int_at_least(1), help="torch threads (one per core)")
    add_trust_argument(parser)
    add_backend_argument(parser)
    return parser.parse_args()


def seconds_from(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a number of seconds from ``low`` to ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} must be from {low:g} to {high:g} seconds")
        return value

    return parse


def cors_origins(given: list[str]) -> list[str]:
    """``--cors-origin`` values, each an origin as a browser sends it (scheme://host[:port], no
    path, no trailing slash), or ``*`` for any page."""
    for origin in given:
        if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
            raise UsageError(
                f"--cors-origin {origin!r} is not an origin: give scheme://host[:port] as the "
                "browser's address bar shows it, without a path or trailing slash (e.g. "
                "--cors-origin https://course.example.org), or * for any page."
            )
    return given


def model_sources(specs: list[str], trust_modules: list[str], backend: str) -> list[ModelSource]:
    from seq2seq.serving.server import ModelSource

    return [
        ModelSource(name, path, tuple(trust_modules), backend)
        for name, path in named_paths(specs, lambda path: path.stem or path.name)
    ]


def main() -> int:
    args = parse_args()
    require_extra("serve", SERVER)
    import uvicorn

    from seq2seq.serving.batching import BatchingOptions
    from seq2seq.serving.connections import timed_protocol
    from seq2seq.serving.server import Limits, at_concurrency_limit, create_app

    if not 0 <= args.max_wait_ms <= 10_000:
        raise UsageError(f"--max-wait-ms must be from 0 to 10000, got {args.max_wait_ms}.")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    sources = model_sources(args.models, args.trust_modules, args.backend)
    api_key = args.api_key or os.environ.get(API_KEY_VARIABLE) or None
    try:
        socket.getaddrinfo(args.host, args.port)
    except (OSError, UnicodeError) as error:
        raise UsageError(
            f"--host {args.host}: not an address this machine can listen on ({error}); give an "
            "IP address of this machine, 0.0.0.0 for all, or leave it out for 127.0.0.1."
        ) from None
    if args.host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        log.warning(
            "listening on %s without an API key: anyone who can reach it can use the models "
            "(--api-key or %s)",
            args.host,
            API_KEY_VARIABLE,
        )
    # Past --limit-concurrency the app logs each request it answers (a refusal, or a probe let
    # through); uvicorn's own warning for each would say so again, wrongly for the probes.
    logging.getLogger("uvicorn.error").addFilter(
        lambda record: record.getMessage() != "Exceeded concurrency limit."
    )
    failed: list[str] = []
    server: uvicorn.Server | None = None

    def stop(message: str) -> None:
        failed.append(message)
        if server is not None:
            server.should_exit = True

    app = create_app(
        sources,
        Limits(
            args.max_sentences,
            args.max_chars,
            args.max_body_bytes,
            args.max_beam_size,
            args.max_queue,
            args.max_request_tokens,
            args.max_attention_cells,
            args.request_timeout,
            args.body_timeout,
        ),
        BatchingOptions(
            args.max_batch_size,
            args.max_wait_ms / 1000,
            not args.no_batching,
            args.max_batch_tokens,
        ),
        api_key,
        on_load_error=stop,
        cors_origins=tuple(cors_origins(args.cors_origins)),
    )
    # access_log=False: the app logs each request once itself, with its X-Request-ID. uvicorn
    # cancels what is left a little after the drain time: by then the app has answered it.
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="info",
        timeout_graceful_shutdown=args.drain_timeout + 5,
        access_log=False,
        http=timed_protocol(args.header_timeout, args.write_timeout, at_concurrency_limit(app)),
        timeout_keep_alive=args.keep_alive_timeout,
        # uvicorn counts the connection asking too: N + 1 lets N connections be served at once.
        limit_concurrency=args.limit_concurrency + 1,
    )
    state = app.state.seq2seq

    class DrainingServer(uvicorn.Server):
        """uvicorn's server, which also starts the app's drain clock on SIGTERM or Ctrl+C."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if state.drain_deadline is None:
                state.drain_deadline = time.monotonic() + args.drain_timeout
            super().handle_exit(sig, frame)

    server = DrainingServer(config)
    # uvicorn drains the requests in flight on SIGTERM, then raises the signal again under the
    # handler that was there before it started: this one, so that a drained stop exits 0.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    server.run()
    if failed:
        raise UsageError(failed[0])
    if not server.started:
        print(f"error: could not listen on {args.host}:{args.port}.", file=sys.stderr)
        return 2
    if state.drain_cut_short:
        log.error(
            "the drain was cut short: requests still waiting after --drain-timeout %g s were "
            "answered 503",
            args.drain_timeout,
        )
        return 1
    return 0


if __name__ == "__main__":
    run(main)
