"""Connections that cannot hold the server: uvicorn's HTTP/1.1 protocol with deadlines for the
request's headers and for the client to read its answer.

uvicorn bounds idle keep-alive connections (``timeout_keep_alive``) and, with
``limit_concurrency``, the connections it serves at once, but a client that sends its headers a
line every few seconds is held as long as it likes, and so is one that never reads its answer
(whose unsent bytes stay in the server's memory: a large answer with attention is megabytes).
Here a connection whose request line and headers are not complete ``header_timeout`` seconds
after it opened (or after the first byte of its next request, on a kept-alive connection) is
closed, and one whose client has read nothing of a backed-up answer for ``write_timeout``
seconds is aborted, its unsent bytes freed. The body has its own deadline in the app
(``seq2seq.serving.server.read_body``), where a 408 can name it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11
from starlette.types import ASGIApp
from uvicorn.protocols.http import h11_impl
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

# Where the server's request log leaves a request's X-Request-ID in its ASGI scope, for the lines
# a connection logs of it.
REQUEST_ID_KEY = "seq2seq.request_id"


def timed_protocol(
    header_timeout: float, write_timeout: float, at_limit: ASGIApp
) -> type[H11Protocol]:
    """uvicorn's h11 protocol (``uvicorn.Config(http=...)``) whose connections close when a
    request's headers take longer than ``header_timeout`` seconds, or abort when the client reads
    nothing of its answer for ``write_timeout`` seconds while the server's buffer for it is full.
    Past uvicorn's ``limit_concurrency``, requests go to ``at_limit`` (the server's
    ``seq2seq.serving.server.at_concurrency_limit``) instead of uvicorn's plain-text 503."""
    # uvicorn's h11 protocol calls this module-level app for that refusal.
    h11_impl.service_unavailable = at_limit  # type: ignore[attr-defined,assignment]

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

        def data_received(self, data: bytes) -> None:
            # The next request on a kept-alive connection has header_timeout from its first
            # byte; until then the idle connection is uvicorn's keep-alive timeout's.
            if self.header_deadline is None and self.conn.their_state is h11.IDLE:
                self.wait_for_headers()
            super().data_received(data)

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
            scope = self.cycle.scope if self.cycle is not None else {}
            log.warning(
                "request %s: aborted the connection of %s: it read nothing of its answer for %g s "
                "(seq2seq serve --write-timeout); %d bytes were left unsent",
                scope.get(REQUEST_ID_KEY, "-"),
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
                    "(seq2seq serve --header-timeout)",
                    self.client_name(),
                    header_timeout,
                )
                self.transport.close()

    return TimedProtocol
