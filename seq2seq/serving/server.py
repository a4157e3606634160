"""The translation server: an HTTP JSON API over models fixed at start-up.

    POST /translate  {"model", "src": [...], "beam_size", "length_penalty", "coverage_penalty",
                      "n_best", "return_attention", "return_scores"} -> one result per sentence (its
                      source words the vocabulary lacks in "unknown", where any)
    GET  /models     name, architecture, scoring function, normalizer, window, key bias,
                     parameters, backend, vocabularies
    GET  /health     200 once every model is loaded, 503 before
    GET  /           the attention explorer, live: sentences typed are translated by every model
    POST /explore    {"src": "a sentence"} -> the explorer's data for it

FastAPI and uvicorn (the ``serve`` extra) with our own micro-batcher (``batching``), not LitServe:
a request here carries a list of sentences with its own search options, and what batches well is
sentences with equal options, sorted by length, in the process that holds the model; LitServe
batches whole requests in worker processes that each load their own copy of every model (twice
the memory on a 2-core machine) and answers errors in its own format. docs/serving.md has more.

Every client mistake is a 4xx with ``{"error": "<one sentence naming the field>"}``; a model that
fails is a 500 with its message; neither stops the server.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import orjson
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from seq2seq.data.tokenization import unknown_words
from seq2seq.explorer import ExplorerModel, explorer_data
from seq2seq.explorer.data import view_cells
from seq2seq.explorer.page import page
from seq2seq.inference.bundle import attention_parts_of
from seq2seq.inference.translator import Translation, Translator
from seq2seq.serving.batching import BatchingOptions, MicroBatcher, SearchOptions, Translate
from seq2seq.serving.connections import REQUEST_ID_KEY
from seq2seq.serving.schema import (
    ExploreAnswer,
    HealthAnswer,
    LiveAnswer,
    ModelsAnswer,
    TranslateAnswer,
    errors,
    explore_request_schema,
    json_body,
    translate_request_schema,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; more is a 4xx naming the limit."""

    max_sentences: int = 64
    max_chars: int = 2000  # per sentence
    max_body_bytes: int = 1_000_000
    max_beam_size: int = 16
    # Requests waiting for one model, beyond which a request is a 503 with Retry-After: a flood
    # is turned away at once rather than queued for minutes.
    max_queue: int = 256
    # The most target tokens a request may make the search produce (each sentence's length
    # limit a·S + b, times the beam size), and attention weights it may ask back: one allowed
    # request cannot hold the model for long or answer hundreds of megabytes.
    max_request_tokens: int = 20_000
    max_attention_cells: int = 1_000_000
    # Seconds a request may take from arrival to answer; past it, a 504 and its work dropped.
    request_timeout: float = 60.0
    # Seconds a request's body may take to arrive; past it, a 408 and the connection closed.
    body_timeout: float = 10.0


@dataclass(frozen=True)
class ModelSource:
    """A model the server loads at start-up: a name clients use and a bundle or checkpoint."""

    name: str
    path: Path
    trust_modules: tuple[str, ...] = ()
    backend: str = "torch"  # Translator.load's: torch or onnx


class TranslateRequest(BaseModel):
    """The body of POST /translate (OpenNMT-py's REST names where it has them)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None  # may be left out when one model is served
    src: list[str]
    beam_size: int = 1
    length_penalty: float = 0.6
    coverage_penalty: float = 0.0
    n_best: int | None = None
    return_attention: bool = False
    return_scores: bool = False


# What this server answers, for the message of a request to any other path.
ROUTES = (
    "POST /translate",
    "GET /models",
    "GET /health",
    "GET /health/live",
    "GET /health/ready",
    "GET /metrics",
    "GET /",
    "POST /explore",
)
PATHS = frozenset(route.split(" ", 1)[1] for route in ROUTES)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# GET /health and /health/ready: 200 when ready, 503 (same shape) while loading or failed.
HEALTH: dict[str, Any] = {
    "response_model": HealthAnswer,
    "responses": {503: {"model": HealthAnswer, "description": "loading, or a model failed"}},
}
# A client's X-Request-ID is echoed when it is a plain token of at most 128 characters (nothing
# that could forge a log line); otherwise the server makes one.
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class ClientError(Exception):
    """A request the server refuses: its HTTP status and one sentence naming the field."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


@dataclass
class ServerState:
    sources: list[ModelSource]
    limits: Limits
    batching: BatchingOptions
    api_key: str | None
    translators: dict[str, Translator] = field(default_factory=dict)
    batchers: dict[str, MicroBatcher] = field(default_factory=dict)
    ready: bool = False
    load_error: str | None = None  # why a model could not be loaded (the server then stops)
    metrics: Metrics = field(default_factory=lambda: Metrics())
    # Set (time.monotonic()) when SIGTERM starts the drain: requests still waiting then are
    # answered 503.
    drain_deadline: float | None = None
    drain_cut_short: bool = False  # a request was answered 503 for the drain (exit status 1)


class Metrics:
    """What GET /metrics reports, in a registry of this app's own (two apps in one process
    count apart): requests by route and status, their latency, each model's batch sizes and
    times, sentences translated, and requests waiting (read from the batchers at each scrape)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "seq2seq_requests", "HTTP requests answered", ["method", "route", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "seq2seq_request_seconds", "time to answer a request", ["route"],
            registry=self.registry,
        )  # fmt: skip
        self.batch_sentences = Histogram(
            "seq2seq_batch_sentences", "sentences in one search", ["model"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=self.registry,
        )  # fmt: skip
        self.batch_seconds = Histogram(
            "seq2seq_batch_seconds", "time of one search", ["model"], registry=self.registry
        )
        self.sentences = Counter(
            "seq2seq_sentences", "sentences translated", ["model"], registry=self.registry
        )
        self.dropped = Counter(
            "seq2seq_sentences_dropped",
            "sentences of requests given up (client gone, deadline, drain) before the model "
            "saw them", ["model"], registry=self.registry,
        )  # fmt: skip
        self.waiting = Gauge(
            "seq2seq_requests_waiting", "requests submitted and not answered", ["model"],
            registry=self.registry,
        )  # fmt: skip

    def batch_observer(self, model: str) -> Callable[[int, float], None]:
        def observe(sentences: int, seconds: float) -> None:
            self.batch_sentences.labels(model).observe(sentences)
            self.batch_seconds.labels(model).observe(seconds)
            self.sentences.labels(model).inc(sentences)

        return observe


def describe(name: str, translator: Translator) -> dict[str, Any]:
    """What GET /models says of a model."""
    config = translator.model_config
    decoder = config.get("decoder", {}).get("_target_", "") if "decoder" in config else ""
    attention = config.get("attention", {})
    scoring = attention.get("_target_", "").rsplit(".", 1)[-1]
    return {
        "name": name,
        "architecture": config.get("_target_", "").rsplit(".", 1)[-1],
        "decoder": decoder.rsplit(".", 1)[-1] or None,
        "scoring": scoring,
        "scaled": attention.get("scaled"),
        **attention_parts_of(config),
        "num_heads": config.get("num_heads"),
        "parameters": sum(p.numel() for p in translator.model.parameters()),
        "backend": translator.backend,
        "src_vocab_size": translator.src_tokenizer.get_vocab_size(),
        "tgt_vocab_size": translator.tgt_tokenizer.get_vocab_size(),
    }


def translate_with(translator: Translator) -> Translate:
    """The batcher's call into ``translator`` (run in the batcher's worker thread)."""

    def translate(
        sentences: list[str], options: SearchOptions, batch_size: int
    ) -> list[Translation]:
        return translator.translate_detailed(
            sentences,
            beam_size=options.beam_size,
            length_penalty=options.length_penalty,
            batch_size=batch_size,
            with_attention=options.attention,
            n_best=options.n_best,
            with_scores=options.scores,
            coverage_penalty=options.coverage_penalty,
        )

    return translate


def create_app(
    sources: list[ModelSource],
    limits: Limits | None = None,
    batching: BatchingOptions | None = None,
    api_key: str | None = None,
    on_load_error: Callable[[str], None] | None = None,
    cors_origins: tuple[str, ...] = (),
) -> FastAPI:
    """The app; models load in a worker thread once it starts (GET /health says when), and
    ``on_load_error`` hears why one could not be. ``cors_origins``: the web pages' origins
    (``https://course.example.org``) whose scripts may call the API from a browser; none by
    default (the server's own page, at /, needs none)."""
    state = ServerState(sources, limits or Limits(), batching or BatchingOptions(), api_key)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.get_running_loop().create_task(load_models(state, on_load_error))
        yield
        loading.cancel()
        for batcher in state.batchers.values():
            await batcher.close()

    # redirect_slashes=False: /translate/ is a JSON 404 naming the routes, not a redirect (which
    # behind a proxy would point at the server's own address).
    app = FastAPI(
        title="seq2seq translation server",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        redirect_slashes=False,
    )
    app.state.seq2seq = state

    @app.exception_handler(ClientError)
    async def refuse(request: Request, error: ClientError) -> JSONResponse:
        # A 401 says how to authenticate (RFC 9110, 11.6.1); a full queue, when to retry.
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else error.headers
        return JSONResponse({"error": str(error)}, status_code=error.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def routing_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        """An unknown route (404) or method (405) answers as every other mistake does,
        ``{"error": ...}``, not FastAPI's ``{"detail": ...}``."""
        message = {
            404: f"no route {request.url.path}; the routes are {', '.join(ROUTES)}.",
            405: f"{request.method} is not allowed on {request.url.path}.",
        }.get(error.status_code, str(error.detail))
        headers = dict(error.headers or {})
        if error.status_code == 405:
            # GET and HEAD of a path are two routes (one operation each in the schema): Allow
            # names the methods of all of them, not only of the last one Starlette tried.
            allowed = {
                method
                for route in app.routes
                if getattr(route, "path", None) == request.url.path
                for method in getattr(route, "methods", None) or ()
            }
            headers["Allow"] = ", ".join(sorted(allowed))
        return JSONResponse({"error": message}, status_code=error.status_code, headers=headers)

    if cors_origins:
        # Inside the request log: a refused or answered preflight is logged like any request.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST", "HEAD"],
            allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
            expose_headers=["X-Request-ID", "Retry-After"],
        )
    app.add_middleware(RequestLog, state=state)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        """Prometheus's text format (prometheus-client); no key needed, as for /health."""
        for name, batcher in state.batchers.items():
            state.metrics.waiting.labels(name).set(batcher.pending)
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health/live", response_model=LiveAnswer)
    @app.head("/health/live", response_model=LiveAnswer)
    async def live() -> JSONResponse:
        """Liveness: the process answers (while its models load too); restart it if not."""
        return JSONResponse({"status": "alive"})

    @app.get("/health/ready", **HEALTH)
    @app.head("/health/ready", **HEALTH)
    async def ready_to_serve() -> JSONResponse:
        """Readiness: what GET /health says; send traffic only on 200."""
        return await health()

    @app.get("/health", **HEALTH)
    @app.head("/health", **HEALTH)
    async def health() -> JSONResponse:
        if state.load_error is not None:
            return JSONResponse({"status": "failed", "error": state.load_error}, status_code=503)
        if not state.ready:
            loaded = len(state.translators)
            status = f"loading ({loaded} of {len(state.sources)} models loaded)"
            return JSONResponse({"status": status}, status_code=503)
        pending = {name: batcher.pending for name, batcher in state.batchers.items()}
        return JSONResponse(
            {"status": "ready", "models": [s.name for s in state.sources], "pending": pending}
        )

    @app.get("/models", response_model=ModelsAnswer, responses=errors(401, 503))
    async def models(request: Request) -> JSONResponse:
        authorize(request, state)
        ready(state)
        described = [describe(s.name, state.translators[s.name]) for s in state.sources]
        return JSONResponse({"models": described})

    @app.get("/", response_class=HTMLResponse)
    async def explorer() -> HTMLResponse:
        """The attention explorer, live: a text box whose sentences every model translates
        (POST /explore). The page holds no model data: with an API key it asks for the key."""
        live = {"endpoint": "explore", "max_chars": state.limits.max_chars,
                "needs_key": state.api_key is not None}  # fmt: skip
        data = {"title": "Attention explorer (live)", "models": [], "sentences": [],
                "checkpoints": [], "beam_size": 1, "live": live, "version": 1}  # fmt: skip
        return HTMLResponse(page(data))

    @app.post(
        "/explore",
        response_model=ExploreAnswer,
        responses=errors(400, 401, 408, 413, 415, 422, 500, 503, 504),
        openapi_extra=json_body(explore_request_schema(state.limits.max_chars)),
    )
    async def explore(request: Request) -> Response:
        """One sentence under every model: the explorer's data for it (``seq2seq.explorer``),
        within the request's deadline, dropped if its client goes away."""
        start = time.monotonic()
        authorize(request, state)
        raw = await read_body(request, state)
        ready(state)
        source = parse_sentence(raw, state.limits)
        limits = check_explore(source, state)
        described, views = [], {}
        for name in (s.name for s in state.sources):
            # In the model's own thread, when its turn comes in the model's line, as a batch of
            # its own: a model (and the C kernels' buffers behind it) is only ever run by one
            # thread. Cancelled before it starts (a client gone, a deadline passed), it never runs.
            model = ExplorerModel(name, state.translators[name])
            work = partial(explorer_data, [model], [source])
            batcher = state.batchers[name]
            future = asyncio.ensure_future(batcher.run(work, source, limits[name]))
            try:
                data = await answered(request, future, state, start)
            except ClientError:
                raise
            except Exception as error:
                log.exception("the explorer failed with model %s", name)
                message = f"the explorer failed with model {name!r}: {error}"
                return JSONResponse({"error": message}, status_code=500)
            described += data["models"]
            views.update(data["sentences"][0]["models"])
        sentence = {**data["sentences"][0], "models": views}
        return large_json({"models": described, "sentence": sentence})

    served = [source.name for source in sources]
    limits_ = state.limits

    @app.post(
        "/translate",
        response_model=TranslateAnswer,
        responses=errors(400, 401, 404, 408, 413, 415, 422, 500, 503, 504),
        openapi_extra=json_body(
            translate_request_schema(
                served,
                limits_.max_sentences,
                limits_.max_chars,
                limits_.max_beam_size,
                [source.name for source in sources if source.backend == "ctranslate2"],
            )
        ),
    )
    async def translate(request: Request) -> Response:
        start = time.monotonic()
        authorize(request, state)
        body = parse(await read_body(request, state), state.limits, state)
        ready(state)
        name = body.model or state.sources[0].name
        check_queue(name, state)
        backend = next(source.backend for source in state.sources if source.name == name)
        if body.coverage_penalty > 0 and backend == "ctranslate2":
            raise ClientError(
                422,
                f"coverage_penalty: model {name!r} runs on CTranslate2, which cannot apply the "
                "coverage penalty as the other backends do; send 0 for it.",
            )
        options = SearchOptions(
            body.beam_size,
            body.length_penalty,
            body.n_best,
            body.return_attention,
            body.return_scores,
            body.coverage_penalty,
        )
        # In the event loop: milliseconds for the largest request, while a hop to a thread for
        # every request costs more throughput under load than it saves (docs/serving.md).
        bounds = state.translators[name].bounds(body.src)
        limits = check_work(body, bounds, state.limits)
        work = asyncio.ensure_future(state.batchers[name].submit(body.src, options, limits))
        try:
            translations = await answered(request, work, state, start)
        except ClientError:
            raise
        except Exception as error:
            log.exception("model %s failed on a request of %d sentences", name, len(body.src))
            message = f"model {name!r} failed: {error}" if str(error) else f"model {name!r} failed"
            return JSONResponse({"error": message}, status_code=500)
        tokenizer = state.translators[name].src_tokenizer
        results = [
            result(source, t, options, list(unknown_words(tokenizer, [source])))
            for source, t in zip(body.src, translations, strict=True)
        ]
        return large_json({"model": name, "results": results})

    if api_key is not None:
        app.openapi = partial(openapi_with_key, app)  # type: ignore[method-assign]
    return app


# The routes an API key guards (authorize), for the schema's security requirements.
GUARDED = ("/translate", "/models", "/explore")


def openapi_with_key(app: FastAPI) -> dict[str, Any]:
    """The schema of a server with an API key: a bearer scheme, required by the guarded routes,
    so that a generated client sends the key."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
        schemes["bearer"] = {
            "type": "http",
            "scheme": "bearer",
            "description": "the key the server was given (--api-key or SEQ2SEQ_API_KEY)",
        }
        for path in GUARDED:
            for operation in schema["paths"][path].values():
                operation["security"] = [{"bearer": []}]
        app.openapi_schema = schema
    return app.openapi_schema


def check_work(body: TranslateRequest, bounds: list[tuple[int, int]], limits: Limits) -> list[int]:
    """Refuse (413) a request whose search may produce more tokens, or whose attention may hold
    more weights, than one request may. ``bounds``: per sentence, its source tokens and the
    most target tokens the model's length limit lets it write (``Translator.bounds``); the
    latter, returned, size the batcher's batches."""
    tokens = sum(target for _, target in bounds) * body.beam_size
    if tokens > limits.max_request_tokens:
        raise ClientError(
            413,
            f"src: these {len(body.src)} sentences may make the search produce up to {tokens} "
            f"tokens at beam_size {body.beam_size}; the limit is {limits.max_request_tokens} a "
            "request (seq2seq serve --max-request-tokens): send fewer or shorter sentences, or a "
            "smaller beam_size.",
        )
    if body.return_attention:
        cells = sum(source * target for source, target in bounds)
        if cells > limits.max_attention_cells:
            raise ClientError(
                413,
                f"return_attention: the attention of these {len(body.src)} sentences may hold "
                f"up to {cells} weights; the limit is {limits.max_attention_cells} a request "
                "(seq2seq serve --max-attention-cells): ask for it with fewer or shorter "
                "sentences.",
            )
    return [target for _, target in bounds]


def large_json(content: dict[str, Any]) -> Response:
    """An answer that may hold megabytes of weights, encoded by orjson: the standard library's
    encoder holds the event loop (and the GIL) some ten times as long, while every other
    request waits."""
    return Response(orjson.dumps(content), media_type="application/json")


def check_queue(name: str, state: ServerState) -> None:
    """Refuse (503, Retry-After) a request for model ``name`` when its line is full."""
    if state.batchers[name].pending >= state.limits.max_queue:
        raise ClientError(
            503,
            f"model {name!r} has as many requests waiting or in progress as the server takes "
            f"(seq2seq serve --max-queue {state.limits.max_queue}); retry after a second.",
            {"Retry-After": "1"},
        )


def check_explore(source: str, state: ServerState) -> dict[str, int]:
    """Refuse a live explorer request past the limits /translate has: every model's line has
    room (503), and what the models may decode and the weights they may answer, summed over the
    models, are within --max-request-tokens and --max-attention-cells (413). Each model's
    target-token limit for the sentence, by name."""
    tokens = cells = 0
    limits = {}
    for name, translator in state.translators.items():
        check_queue(name, state)
        [(source_tokens, target_tokens)] = translator.bounds([source])
        limits[name] = target_tokens
        tokens += 2 * target_tokens  # decoded, then teacher-forced
        cells += view_cells(translator, source_tokens, target_tokens)
    if tokens > state.limits.max_request_tokens:
        raise ClientError(
            413,
            f"src: under the {len(limits)} models this sentence may make them decode up to "
            f"{tokens} tokens; the limit is {state.limits.max_request_tokens} a request "
            "(seq2seq serve --max-request-tokens): send a shorter sentence.",
        )
    if cells > state.limits.max_attention_cells:
        raise ClientError(
            413,
            f"src: the explorer's maps of this sentence under the {len(limits)} models may hold "
            f"up to {cells} weights; the limit is {state.limits.max_attention_cells} a request "
            "(seq2seq serve --max-attention-cells): send a shorter sentence.",
        )
    return limits


Answer = TypeVar("Answer")
# How often a request waiting for its translations checks that its client is still there.
DISCONNECT_POLL = 0.05


async def answered(
    request: Request, work: asyncio.Future[Answer], state: ServerState, start: float
) -> Answer:
    """``work``'s result, unless the client goes away (499), the request's deadline passes (504)
    or the server's drain time runs out (503) first: then ``work`` is cancelled, which drops
    what the model has not started of it (from the batcher's line, or the model's thread)."""
    late = ClientError(
        504,
        f"the request took longer than {state.limits.request_timeout:g} s (seq2seq serve "
        "--request-timeout); the sentences the model had not started were dropped. Send fewer "
        "sentences or try again when the server is less busy.",
    )
    return await within(work, state, start + state.limits.request_timeout, late, request)


async def within(
    work: asyncio.Future[Answer],
    state: ServerState,
    deadline: float,
    late: ClientError,
    request: Request | None = None,
) -> Answer:
    """``work``'s result, unless the server's drain time runs out (503), ``deadline``
    (``time.monotonic()``'s) passes (``late``) or, if ``request`` is given, its client goes away
    (499) first; then ``work`` is cancelled. (Not given while ``work`` reads the request's body:
    asking whether the client is still there would read it too.)"""
    try:
        while True:
            check_drain(state)
            now = time.monotonic()
            if now >= deadline:
                raise late
            done, _ = await asyncio.wait({work}, timeout=min(DISCONNECT_POLL, deadline - now))
            if done:
                return work.result()
            if request is not None and await request.is_disconnected():
                raise ClientError(499, "the client closed the connection before its answer.")
    finally:
        if not work.done():
            work.cancel()


class RequestLog:
    """Every answer carries ``X-Request-ID`` (the client's, when it is a sane token, else a new
    one), and every request is logged once with it, its status and its time, and counted in the
    metrics: a client that went away too (499). Plain ASGI, not ``@app.middleware``: Starlette's
    ``BaseHTTPMiddleware`` hides a client's disconnection from ``Request.is_disconnected``."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get("x-request-id", "")
        identifier = given if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        scope[REQUEST_ID_KEY] = identifier  # for the connection's own log lines (timed_protocol)
        start = time.perf_counter()
        status = 500  # unless the app starts an answer

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["X-Request-ID"] = identifier
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            seconds = time.perf_counter() - start
            path, method = scope["path"], scope["method"]
            # Known routes by name, anything else as one label: a scanner cannot grow them.
            route = path if path in PATHS else "other"
            known = method if method in METHODS else "other"  # nor by inventing methods
            self.state.metrics.requests.labels(known, route, str(status)).inc()
            self.state.metrics.latency.labels(route).observe(seconds)
            milliseconds = 1000 * seconds
            log.info(
                "request %s: %s %s -> %d in %.1f ms", identifier, method, path, status, milliseconds
            )


# Answered by the app even past the concurrency limit: cheap, and wanted most when the server
# is busiest (a liveness probe that failed then would restart a busy server; a scrape, lose
# the numbers of the overload).
PAST_THE_LIMIT = frozenset({"/health/live", "/metrics"})
BUSY = (
    "the server has as many connections as it takes (seq2seq serve --limit-concurrency); retry "
    "after a second."
)


def at_concurrency_limit(app: FastAPI) -> ASGIApp:
    """What answers a request past uvicorn's ``limit_concurrency`` (``timed_protocol``): the app
    itself for GET/HEAD of ``PAST_THE_LIMIT``, a JSON 503 with Retry-After for anything else
    (``{"status": "busy", "error"}`` on the health routes, as their schema says), each logged
    and counted with its X-Request-ID like every other request."""
    state: ServerState = app.state.seq2seq

    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        health = scope["path"] in ("/health", "/health/ready")
        body = {"status": "busy", "error": BUSY} if health else {"error": BUSY}
        headers = {"Retry-After": "1", "Connection": "close"}
        await JSONResponse(body, status_code=503, headers=headers)(scope, receive, send)

    refused = RequestLog(refuse, state)

    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        allowed = scope["path"] in PAST_THE_LIMIT and scope["method"] in ("GET", "HEAD")
        await (app if allowed else refused)(scope, receive, send)

    return answer


async def load_models(state: ServerState, on_load_error: Callable[[str], None] | None) -> None:
    loop = asyncio.get_running_loop()
    for source in state.sources:
        load = partial(
            Translator.load,
            source.path,
            trust_modules=source.trust_modules,
            backend=source.backend,
        )
        try:
            translator = await loop.run_in_executor(None, load)
        except Exception as error:
            state.load_error = f"model {source.name!r} ({source.path}) could not be loaded: {error}"
            log.error("%s", state.load_error)
            if on_load_error is not None:
                on_load_error(state.load_error)
            return
        state.translators[source.name] = translator
        observe = state.metrics.batch_observer(source.name)
        dropped = state.metrics.dropped.labels(source.name).inc
        batcher = MicroBatcher(translate_with(translator), state.batching, observe, dropped)
        batcher.start()
        state.batchers[source.name] = batcher
    state.ready = True
    log.info("ready: %s", ", ".join(s.name for s in state.sources))


def authorize(request: Request, state: ServerState) -> None:
    if state.api_key is None:
        return
    header = request.headers.get("authorization")
    if header is None:
        raise ClientError(401, "this server needs an API key: send 'Authorization: Bearer KEY'.")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        raise ClientError(
            401, f"Authorization: the scheme must be Bearer, not {scheme[:20]!r}: 'Bearer KEY'."
        )
    if not hmac.compare_digest(token.encode(), state.api_key.encode()):
        raise ClientError(401, "Authorization: this is not the server's API key.")


def ready(state: ServerState) -> None:
    if not state.ready:
        raise ClientError(503, "the models are still loading: retry when GET /health says ready.")


async def read_body(request: Request, state: ServerState) -> bytes:
    """The whole body, at most ``max_body_bytes``, within ``body_timeout`` seconds: a client that
    sends it slower gets a 408 and holds the server no longer; one still sending it when the
    drain time runs out gets the drain's 503."""
    limits = state.limits
    content_type = request.headers.get("content-type")
    if content_type is not None and not is_json(content_type):
        raise ClientError(
            415,
            f"Content-Type {content_type!r}: the body must be JSON in UTF-8; send 'Content-Type: "
            "application/json' (curl: -H 'Content-Type: application/json').",
        )
    max_bytes = limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ClientError(413, f"the body has {declared} bytes; the limit is {max_bytes}.")

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise ClientError(413, f"the body is over the limit of {max_bytes} bytes.")
            chunks.append(chunk)
        return b"".join(chunks)

    late = ClientError(
        408,
        f"the body did not arrive within {limits.body_timeout:g} s (seq2seq serve "
        "--body-timeout); send it at once.",
        {"Connection": "close"},
    )
    reading = asyncio.ensure_future(read())
    try:
        return await within(reading, state, time.monotonic() + limits.body_timeout, late)
    except ClientDisconnect:
        raise ClientError(499, "the client closed the connection before its body ended.") from None


def check_drain(state: ServerState) -> None:
    """Past the drain time (SIGTERM + --drain-timeout), a request still in progress is a 503."""
    if state.drain_deadline is not None and time.monotonic() >= state.drain_deadline:
        state.drain_cut_short = True
        raise ClientError(
            503,
            "the server is shutting down and could not answer this request in its drain time "
            "(seq2seq serve --drain-timeout); send it again to another server.",
            {"Retry-After": "1"},
        )


def is_json(content_type: str) -> bool:
    """``application/json`` or ``application/<something>+json``, in UTF-8 if a charset is named
    (FastAPI's rule; a body without Content-Type is read as JSON too). Anything else is refused:
    a browser page of another origin can POST text/plain or a form without asking first (CORS)."""
    media, _, parameters = content_type.lower().partition(";")
    kind, _, subtype = media.strip().partition("/")
    charset = re.search(r"charset\s*=\s*\"?([^\";\s]+)", parameters)
    utf8 = charset is None or charset.group(1) in ("utf-8", "utf8")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json")) and utf8


def parse(raw: bytes, limits: Limits, state: ServerState) -> TranslateRequest:
    """The request, checked field by field; a ClientError naming the first field at fault."""
    try:
        # utf-8-sig: a body that starts with a byte-order mark (some Windows tools write one)
        # reads as the same JSON.
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ClientError(400, f"the body is not valid UTF-8 (byte {error.start}).") from None
    data = load_json(text)
    if not isinstance(data, dict):
        raise ClientError(422, "the body must be a JSON object with at least a 'src' list.")
    for key, value in data.items():
        if isinstance(value, LongInteger):
            raise ClientError(
                422, f"{key}: an integer of {value.digits} digits; no field takes one so long."
            )
    for key in ("beam_size", "n_best"):  # JSON has one number type: 5.0 is the integer 5
        value = data.get(key)
        if isinstance(value, float) and value.is_integer():
            data[key] = int(value)
    try:
        body = TranslateRequest.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise ClientError(422, f"{where}: {first['msg']}.") from None
    check(body, limits, state)
    return body


def parse_sentence(raw: bytes, limits: Limits) -> str:
    """POST /explore's body, ``{"src": "one sentence"}``, checked as /translate's sentences are."""
    try:
        data = load_json(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise ClientError(400, 'the body must be JSON like {"src": "a sentence"}.') from None
    source = data.get("src") if isinstance(data, dict) else None
    unknown = sorted(set(data) - {"src"}) if isinstance(data, dict) else []
    if unknown:
        raise ClientError(
            422,
            f"{unknown[0]}: /explore takes only src (one sentence; each model decodes it greedily "
            "and is teacher-forced on its translation); send the other options to /translate.",
        )
    if not isinstance(source, str) or not source.strip():
        raise ClientError(422, "src: give one non-blank sentence as a string.")
    if len(source) > limits.max_chars:
        raise ClientError(422, f"src: {len(source)} characters; the limit is {limits.max_chars}.")
    try:
        source.encode("utf-8")
    except UnicodeEncodeError:
        raise ClientError(422, "src: the sentence holds a lone surrogate escape.") from None
    return source


def load_json(text: str) -> Any:
    """The body's JSON, or a 400 naming what is wrong with it: invalid JSON, or nesting deeper
    than Python's parser recurses (about 1,000 levels): no request reaches a 500 by its shape
    alone. An integer too long to convert (4,300 digits) reads as a ``LongInteger``."""
    try:
        # NaN and ±Infinity (not JSON, but Python writes them) read as floats, so that the
        # field that holds one is named by the checks that refuse it.
        return json.loads(text, object_pairs_hook=unique_keys, parse_int=bounded_int)
    except json.JSONDecodeError as error:
        raise ClientError(
            400,
            f"the body is not valid JSON: {error.msg} (line {error.lineno}, column {error.colno}).",
        ) from None
    except RecursionError:
        raise ClientError(400, "the body nests arrays or objects too deeply.") from None


@dataclass(frozen=True)
class LongInteger:
    """A JSON integer longer than Python converts (4,300 digits): kept as its length, so that
    the field holding it can be named (``parse``) without converting it."""

    digits: int


def bounded_int(text: str) -> int | LongInteger:
    digits = len(text.lstrip("-"))
    return LongInteger(digits) if digits > sys.get_int_max_str_digits() else int(text)


def brief(number: int | None) -> str:
    """``number`` as a message shows it: a long one by its first digits and its length."""
    text = str(number)
    return text if len(text) <= 20 else f"{text[:8]}… ({len(text)} digits)"


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused (422) when it names a key twice: which one was meant is a guess."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ClientError(422, f"{key}: the key appears twice in one object; send it once.")
        seen[key] = value
    return seen


def check(body: TranslateRequest, limits: Limits, state: ServerState) -> None:
    served = [s.name for s in state.sources]
    if body.model is None and len(served) > 1:
        raise ClientError(422, f"model: this server has several models, name one of {served}.")
    if body.model is not None and body.model not in served:
        raise ClientError(404, f"model: no model {body.model!r} here; the models are {served}.")
    if not body.src:
        raise ClientError(422, "src: the list is empty; send at least one sentence.")
    if len(body.src) > limits.max_sentences:
        raise ClientError(
            422, f"src: {len(body.src)} sentences; the limit is {limits.max_sentences} a request."
        )
    for i, sentence in enumerate(body.src):
        if len(sentence) > limits.max_chars:
            raise ClientError(
                422, f"src.{i}: {len(sentence)} characters; the limit is {limits.max_chars}."
            )
        try:
            sentence.encode("utf-8")
        except UnicodeEncodeError:
            raise ClientError(
                422, f"src.{i}: the sentence holds a lone surrogate escape, not valid Unicode."
            ) from None
    if not 1 <= body.beam_size <= limits.max_beam_size:
        raise ClientError(
            422, f"beam_size: {brief(body.beam_size)}; it must be from 1 to {limits.max_beam_size}."
        )
    if body.n_best is not None and not 1 <= body.n_best <= body.beam_size:
        raise ClientError(
            422, f"n_best: {brief(body.n_best)}; it must be from 1 to beam_size ({body.beam_size})."
        )
    if not (math.isfinite(body.length_penalty) and 0 <= body.length_penalty <= 10):
        raise ClientError(422, f"length_penalty: {body.length_penalty}; it must be from 0 to 10.")
    if not (math.isfinite(body.coverage_penalty) and 0 <= body.coverage_penalty <= 10):
        raise ClientError(
            422, f"coverage_penalty: {body.coverage_penalty}; it must be from 0 to 10."
        )


def result(
    source: str, translation: Translation, options: SearchOptions, unknown: list[str]
) -> dict[str, Any]:
    """One sentence's answer; ``unknown``: its words the vocabulary lacks, said where any."""
    answer: dict[str, Any] = {"src": source, "tgt": translation.text}
    if translation.truncated:
        answer["truncated"] = True
    if unknown:
        answer["unknown"] = unknown
    if options.scores:
        answer["pred_score"] = translation.score
    if options.n_best is not None:  # a blank sentence has none
        alternatives = translation.n_best or []
        answer["n_best"] = [{"tgt": text, "pred_score": score} for text, score in alternatives]
    if options.attention:
        weights = translation.attention
        answer["attention"] = {
            "src_tokens": translation.src_tokens or [],
            "tgt_tokens": translation.tgt_tokens or [],
            # (len(tgt_tokens), len(src_tokens)): row j is where target token j looked.
            "weights": [] if weights is None else weights.tolist(),
        }
    return answer
