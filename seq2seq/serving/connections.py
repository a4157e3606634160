"""Connections that cannot hold the server: uvicorn's HTTP/1.1 protocol with deadlines for the
request's headers and for the client to read its answer.

uvicorn bounds idle keep-alive connections (``timeout_keep_alive``) and, with
``limit_concurrency``, the connections it serves at once, but a client that sends its headers a
line every few seconds is held as long as it likes, and so is one that never reads its answer
(whose unsent bytes stay in the server's memory: a large answer with attention is megabytes).
Here a connection whose request line and headers are not complete ``header_timeout`` seconds
after it opened (or after its previous answer, on a kept-alive connection) is closed, and one
whose client has read nothing of a backed-up answer for ``write_timeout`` seconds is aborted,
its unsent bytes freed. The body has its own deadline in the app
(``seq2seq.serving.server.read_body``), where a 408 can name it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11
from uvicorn.protocols.http import h11_impl
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


BUSY = json.dumps(
    {
        "error": "the server has as many connections as it takes (serve.py --limit-concurrency); "
        "retry after a second."
    }
).encode()


ALIVE = json.dumps({"status": "alive"}).encode()


async def busy(scope: Any, receive: Any, send: Any) -> None:
    """uvicorn's answer past ``limit_concurrency``, in this server's shape: a JSON 503; but a
    liveness probe (``GET /health/live``) is answered 200, since the process does answer, so
    that an orchestrator does not restart a server for being busy."""
    live = scope["path"] == "/health/live" and scope["method"] in ("GET", "HEAD")
    body = ALIVE if live else BUSY
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if not live:
        headers += [(b"retry-after", b"1"), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 200 if live else 503, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


def timed_protocol(header_timeout: float, write_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol (``uvicorn.Config(http=...)``) whose connections close when a
    request's headers take longer than ``header_timeout`` seconds, or abort when the client reads
    nothing of its answer for ``write_timeout`` seconds while the server's buffer for it is full;
    its refusal past the concurrency limit answers JSON, as every other error here does."""
    # uvicorn's h11 protocol calls this module-level app for that refusal (plain text there).
    h11_impl.service_unavailable = busy  # type: ignore[attr-defined]

    class TimedProtocol(H11Protocol):
        header_deadline: asyncio.TimerHandle | None = None
        write_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.wait_for_headers()

        def wait_for_headers(self) -> None:
            self.stop_waiting()
            self.header_deadline = self.loop.call_later(header_timeout, self.headers_too_slow)

        def stop_waiting(self) -> None:
            if self.header_deadline is not None:
                self.header_deadline.cancel()
                self.header_deadline = None

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state is not h11.IDLE:  # the request line and headers are in
                self.stop_waiting()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self.wait_for_headers()  # the next request on this connection

        def connection_lost(self, exc: Exception | None) -> None:
            self.stop_waiting()
            self.forget_write_deadline()
            super().connection_lost(exc)

        def pause_writing(self) -> None:
            """The transport holds more unsent bytes than its high-water mark: the client reads
            slower than the server writes, or not at all. It has ``write_timeout`` seconds to
            read enough for the transport to resume."""
            super().pause_writing()
            if self.write_deadline is None:
                self.write_deadline = self.loop.call_later(write_timeout, self.reads_too_slow)

        def resume_writing(self) -> None:
            self.forget_write_deadline()
            super().resume_writing()

        def forget_write_deadline(self) -> None:
            if self.write_deadline is not None:
                self.write_deadline.cancel()
                self.write_deadline = None

        def reads_too_slow(self) -> None:
            self.write_deadline = None
            unsent = self.transport.get_write_buffer_size()
            log.warning(
                "aborted the connection of %s: it read nothing of its answer for %g s "
                "(serve.py --write-timeout); %d bytes were left unsent",
                self.client_name(),
                write_timeout,
                unsent,
            )
            self.transport.abort()  # close() would wait to send the buffer first

        def client_name(self) -> str:
            return f"{self.client[0]}:{self.client[1]}" if self.client else "a client"

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to malformed HTTP (a bad request line, a duplicate or negative
            Content-Length, headers over its limit), as JSON like every other error here."""
            body = json.dumps({"error": f"{msg.rstrip('.')}: the request is not valid HTTP/1.1."})
            headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
            for event in (
                h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                h11.Data(data=body.encode()),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event))
            self.transport.close()

        def headers_too_slow(self) -> None:
            self.header_deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                log.warning(
                    "closed the connection of %s: its request headers took longer than %g s "
                    "(serve.py --header-timeout)",
                    self.client_name(),
                    header_timeout,
                )
                self.transport.close()

    return TimedProtocol
