"""Micro-batching: concurrent requests for one model merged into one batched search.

A request waits at most ``max_wait`` seconds for others; the requests that arrived by then (up to
``max_batch_size`` sentences, and only those asking for the same search: beam size, length
penalty, n-best, attention, scores) are translated together, sorted by length inside the batch by
the ``Translator``, in one worker thread per model, so that the event loop never waits for the
model. Requests that do not fit wait for the next batch, first come first served.

Pure asyncio, no HTTP: ``seq2seq.serving.server`` puts it behind FastAPI.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from seq2seq.inference.translator import Translation


@dataclass(frozen=True)
class SearchOptions:
    """What a request asks of the search; only requests with equal options share a batch."""

    beam_size: int = 1
    length_penalty: float = 0.6
    n_best: int | None = None
    attention: bool = False
    scores: bool = False
    coverage_penalty: float = 0.0  # GNMT's β (seq2seq.search.coverage_penalty)


@dataclass(frozen=True)
class BatchingOptions:
    """``enabled=False``: one request at a time (the baseline the load test compares with)."""

    max_batch_size: int = 64  # sentences
    max_wait: float = 0.005  # seconds a request waits for others
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(
                f"the maximum batch size must be at least 1, got {self.max_batch_size}."
            )
        if not 0 <= self.max_wait <= 10:
            raise ValueError(f"the longest wait must be 0 to 10 seconds, got {self.max_wait}.")


# The batched translation a batcher calls: sentences and their options -> one result each.
Translate = Callable[[list[str], SearchOptions, int], list[Translation]]


@dataclass
class Job:
    sentences: list[str]
    options: SearchOptions
    result: asyncio.Future[list[Translation]]


class MicroBatcher:
    """One model's queue and the task that empties it (``start`` inside the event loop)."""

    def __init__(
        self,
        translate: Translate,
        options: BatchingOptions,
        on_batch: Callable[[int, float], None] | None = None,
        on_drop: Callable[[int], None] | None = None,
    ) -> None:
        self.translate = translate
        self.options = options
        self.on_batch = on_batch  # hears each batch's sentences and seconds (GET /metrics)
        self.on_drop = on_drop  # hears the sentences of each request dropped before its batch
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.waiting: deque[Job] = deque()  # taken from the queue, left out of a batch
        # One thread: the model runs one batch at a time, off the event loop.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="seq2seq-model")
        self.task: asyncio.Task[None] | None = None
        self.batches = 0  # how many searches ran
        self.pending = 0  # requests submitted and not answered yet (GET /health shows it)
        self.dropped = 0  # requests given up (cancelled) before the model saw them

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._serve())

    async def close(self) -> None:
        """Stop after the batch in progress; requests still queued are refused."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        for job in [*self.waiting, *self._drain()]:
            if not job.result.done():
                job.result.set_exception(RuntimeError("the server is shutting down"))
        self.executor.shutdown(wait=True)

    async def submit(self, sentences: list[str], options: SearchOptions) -> list[Translation]:
        job = Job(sentences, options, asyncio.get_running_loop().create_future())
        self.queue.put_nowait(job)
        self.pending += 1
        try:
            return await job.result
        finally:
            self.pending -= 1

    def _drain(self) -> list[Job]:
        jobs = []
        while not self.queue.empty():
            jobs.append(self.queue.get_nowait())
        return jobs

    def _wanted(self, job: Job) -> bool:
        """Whether ``job`` is still awaited: a request whose client went away or whose deadline
        passed was cancelled, and is dropped here, before it reaches the model."""
        if not job.result.cancelled():
            return True
        self.dropped += 1
        if self.on_drop is not None:
            self.on_drop(len(job.sentences))
        return False

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # Cancelled while it waited for others to join its batch: dropped now.
            jobs = [job for job in await self._next_batch() if self._wanted(job)]
            if not jobs:
                continue
            sentences = [sentence for job in jobs for sentence in job.sentences]
            started = loop.time()
            try:
                translations = await loop.run_in_executor(
                    self.executor,
                    self.translate,
                    sentences,
                    jobs[0].options,
                    self.options.max_batch_size,
                )
            except Exception as error:  # the model's failure is each request's answer
                for job in jobs:
                    if not job.result.done():
                        job.result.set_exception(error)
                continue
            self.batches += 1
            if self.on_batch is not None:
                self.on_batch(len(sentences), loop.time() - started)
            start = 0
            for job in jobs:
                end = start + len(job.sentences)
                if not job.result.done():  # a client that went away has cancelled it
                    job.result.set_result(translations[start:end])
                start = end

    async def _next_batch(self) -> list[Job]:
        first = self.waiting.popleft() if self.waiting else await self.queue.get()
        while not self._wanted(first):
            first = self.waiting.popleft() if self.waiting else await self.queue.get()
        if not self.options.enabled:
            return [first]
        batch, size = [first], len(first.sentences)
        deadline = asyncio.get_running_loop().time() + self.options.max_wait
        # Those left out of an earlier batch first, then new arrivals until the wait is over.
        candidates = list(self.waiting)
        self.waiting.clear()
        while size < self.options.max_batch_size:
            if candidates:
                job = candidates.pop(0)
            else:
                timeout = deadline - asyncio.get_running_loop().time()
                if timeout <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self.queue.get(), timeout)
                except TimeoutError:
                    break
            if not self._wanted(job):
                continue
            fits = size + len(job.sentences) <= self.options.max_batch_size
            if job.options == first.options and fits:
                batch.append(job)
                size += len(job.sentences)
            else:
                self.waiting.append(job)
        self.waiting.extend(candidates)
        return batch
