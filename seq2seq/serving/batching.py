"""Micro-batching: concurrent requests for one model merged into bounded, fair searches.

A request waits at most ``max_wait`` seconds for others; then the requests in line that ask for
the same search (beam size, length and coverage penalties, n-best, attention, scores) give their
next sentences to one batched search, in one worker thread per model, so that the event loop
never waits for the model. A batch holds at most ``max_batch_size`` sentences and at most
``max_batch_tokens`` target tokens: its sentences times the longest one's length limit, times
the beam (the steps and rows the search may run), so that no batch holds the model for long;
and its sentences are of like lengths (``SPREAD``), so that a short one is not made to wait for
the steps of a long one.

A request with more sentences than one batch takes is translated over several, and goes to the
back of the line after each (round robin): a one-sentence request that arrives meanwhile waits
for one batch at most, not for the whole large request, and a large request whose client went
away or whose deadline passed (cancelled) is dropped between its batches. Requests that do not
fit a batch keep their place in line.

Pure asyncio, no HTTP: ``seq2seq.serving.server`` puts it behind FastAPI.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

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
    """``enabled=False``: no two requests share a search (the baseline the load test compares
    with); a request larger than a batch is still translated a batch at a time."""

    max_batch_size: int = 64  # sentences
    max_wait: float = 0.005  # seconds a request waits for others
    enabled: bool = True
    # Sentences × the longest one's target-token limit × beam size: what one search may run.
    max_batch_tokens: int = 4096

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(
                f"the maximum batch size must be at least 1, got {self.max_batch_size}."
            )
        if not 0 <= self.max_wait <= 10:
            raise ValueError(f"the longest wait must be 0 to 10 seconds, got {self.max_wait}.")
        if self.max_batch_tokens < 1:
            raise ValueError(
                f"the tokens of a batch must be at least 1, got {self.max_batch_tokens}."
            )


# A batch runs about as many steps as its longest sentence, and on a CPU a step costs nearly as
# much for a few rows as for many: sentences of ordinary lengths (limits up to SPREAD × SHORT
# tokens) all go together, for throughput, but a longer sentence joins a batch only if its
# limit is at most SPREAD times that of the batch's first, so that a short request leading a
# batch does not run the steps of a large request's long sentences, which lead their own.
SPREAD = 2
SHORT = 64

Result = TypeVar("Result")

# The batched translation a batcher calls: sentences and their options -> one result each.
Translate = Callable[[list[str], SearchOptions, int], list[Translation]]


@dataclass
class Job:
    """One request: its sentences (shortest first), each one's target-token limit, and what is
    done so far."""

    sentences: list[str]
    limits: list[int]  # per sentence, the most target tokens its search may write (a·S + b)
    options: SearchOptions
    result: asyncio.Future[Any]  # the translations, or what ``call`` returns
    translations: list[Translation] = field(default_factory=list)  # of sentences[:taken]
    taken: int = 0  # sentences given to the model so far
    # Other work with the model (the explorer's, on one sentence), in a batch of its own.
    call: Callable[[], Any] | None = None

    @property
    def left(self) -> int:
        return len(self.sentences) - self.taken


@dataclass
class Slice:
    """The sentences ``start:end`` of ``job`` in one batch."""

    job: Job
    start: int
    end: int


class MicroBatcher:
    """One model's line of requests and the task that serves it (``start`` inside the loop)."""

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
        self.on_drop = on_drop  # hears the sentences of each request dropped before the model
        self.queue: asyncio.Queue[Job] = asyncio.Queue()  # arrivals
        self.line: deque[Job] = deque()  # arrivals taken from the queue, in turn order
        self.returning: list[Job] = []  # in the batch being run, with sentences left
        # One thread: the model runs one batch at a time, off the event loop.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="seq2seq-model")
        self.task: asyncio.Task[None] | None = None
        self.batches = 0  # how many searches ran
        self.pending = 0  # requests submitted and not answered yet (GET /health shows it)
        self.dropped = 0  # requests given up (cancelled) with sentences the model had not seen

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._serve())

    async def close(self) -> None:
        """Stop after the batch in progress; requests still in line are refused."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        self._arrivals()
        for job in [*self.line, *self.returning]:
            if not job.result.done():
                job.result.set_exception(RuntimeError("the server is shutting down"))
        self.executor.shutdown(wait=True)

    async def submit(
        self, sentences: list[str], options: SearchOptions, limits: list[int]
    ) -> list[Translation]:
        """``sentences``' translations; ``limits``: each one's most target tokens (a·S + b,
        ``Translator.bounds``), which size the batches."""
        if len(limits) != len(sentences):
            raise ValueError(f"{len(sentences)} sentences but {len(limits)} limits.")
        if not sentences:
            return []
        # Shortest first: a request split over several batches pads each little.
        order = sorted(range(len(sentences)), key=limits.__getitem__)
        result = asyncio.get_running_loop().create_future()
        job = Job([sentences[i] for i in order], [limits[i] for i in order], options, result)
        self.queue.put_nowait(job)
        self.pending += 1
        try:
            translations = await job.result
        finally:
            self.pending -= 1
        answers = [Translation("")] * len(sentences)
        for position, index in enumerate(order):
            answers[index] = translations[position]
        return answers

    async def run(self, call: Callable[[], Result], sentence: str, limit: int) -> Result:
        """``call()``'s result, run in the model's thread when its turn comes, alone: other work
        with the model on ``sentence`` (whose target-token limit is ``limit``), which takes its
        place in line, counts as waiting, and is dropped if cancelled before it starts."""
        result = asyncio.get_running_loop().create_future()
        self.queue.put_nowait(Job([sentence], [limit], SearchOptions(), result, call=call))
        self.pending += 1
        try:
            return cast(Result, await result)
        finally:
            self.pending -= 1

    def _arrivals(self) -> None:
        """Arrivals join the end of the line."""
        while not self.queue.empty():
            self.line.append(self.queue.get_nowait())

    def _wanted(self, job: Job) -> bool:
        """Whether ``job`` is still awaited: a request whose client went away or whose deadline
        passed was cancelled, and what is left of it is dropped here, before the model."""
        if job.result.cancelled():
            self.dropped += 1
            if self.on_drop is not None:
                self.on_drop(job.left)
            return False
        return not job.result.done()  # a batch of it failed: it was answered

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            if not batch:  # every request in it was cancelled while it waited for company
                continue
            sentences = [s for part in batch for s in part.job.sentences[part.start : part.end]]
            started = loop.time()
            call = batch[0].job.call
            try:
                if call is not None:
                    answer = await loop.run_in_executor(self.executor, call)
                else:
                    translations = await loop.run_in_executor(
                        self.executor,
                        self.translate,
                        sentences,
                        batch[0].job.options,
                        self.options.max_batch_size,
                    )
            except Exception as error:  # the model's failure is each request's answer
                for part in batch:
                    if not part.job.result.done():
                        part.job.result.set_exception(error)
                continue
            self.batches += 1
            if self.on_batch is not None:
                self.on_batch(len(sentences), loop.time() - started)
            if call is not None:
                if not batch[0].job.result.done():  # a client that went away cancelled it
                    batch[0].job.result.set_result(answer)
                continue
            start = 0
            for part in batch:
                end = start + part.end - part.start
                part.job.translations += translations[start:end]
                start = end
                done = part.end == len(part.job.sentences)
                if done and not part.job.result.done():  # a client that went away cancelled it
                    part.job.result.set_result(part.job.translations)

    async def _next_batch(self) -> list[Slice]:
        """The next batch: the first request in line that is still wanted, then, in line order,
        the next sentences of those with the same search, up to the batch's bounds (arrivals
        wait up to ``max_wait`` for company while there is room). A request that gave sentences
        and has more goes to the back of the line, behind those that arrived during its batch;
        one that did not fit keeps its place."""
        self._arrivals()
        self.line.extend(self.returning)
        self.returning.clear()
        while True:
            while self.line and not self._wanted(self.line[0]):
                self.line.popleft()
            if self.line:
                break
            self.line.append(await self.queue.get())
            self._arrivals()
        loop = asyncio.get_running_loop()
        first, enabled = self.line[0], self.options.enabled
        chosen: list[tuple[Job, int]] = []  # a request and how many of its next sentences
        # Sentences in the batch, the longest one's limit and the first one's.
        rows = longest = leader = 0
        deadline = loop.time() + self.options.max_wait
        index = 0
        alone = first.call is not None  # work of its own
        if alone:
            chosen.append((first, 1))
        while not alone and rows < self.options.max_batch_size:
            if index == len(self.line):
                room = (rows + 1) * longest * first.options.beam_size
                timeout = deadline - loop.time()
                # Company is awaited for a request's first batch only, and while there is room.
                if not enabled or first.taken or room > self.options.max_batch_tokens:
                    break
                if timeout <= 0:
                    break
                try:
                    self.line.append(await asyncio.wait_for(self.queue.get(), timeout))
                except TimeoutError:
                    break
            job = self.line[index]
            index += 1
            if job.options != first.options or (chosen and not enabled) or job.result.done():
                continue
            if job.call is not None:  # alone, when its turn comes
                continue
            count = self._fit(job, rows, longest, leader)
            if count:
                leader = leader if chosen else job.limits[job.taken]
                chosen.append((job, count))
                longest = max(longest, *job.limits[job.taken : job.taken + count])
                rows += count
        # Requests cancelled while the batch waited for company are dropped here, before the
        # model, as are those cancelled further back in line.
        batch = []
        for job, count in chosen:
            if self._wanted(job):
                batch.append(Slice(job, job.taken, job.taken + count))
                job.taken += count
        served = {id(job) for job, _ in chosen}
        self.line = deque(job for job in self.line if id(job) not in served and self._wanted(job))
        self.returning = [part.job for part in batch if part.job.left]
        return batch

    def _fit(self, job: Job, rows: int, longest: int, leader: int) -> int:
        """How many of ``job``'s next sentences the batch takes: as many as keep it within
        ``max_batch_size`` sentences, ``max_batch_tokens`` (rows × the longest limit × beam)
        and ``SPREAD`` times its first sentence's limit ``leader``; at least one when the
        batch is empty (then ``leader`` is that sentence's)."""
        beam = job.options.beam_size
        taken = 0
        for limit in job.limits[job.taken :]:
            if rows + taken == 0:
                leader = limit
            size, tallest = rows + taken + 1, max(longest, limit)
            fits = size <= self.options.max_batch_size
            fits = fits and size * tallest * beam <= self.options.max_batch_tokens
            fits = fits and limit <= SPREAD * max(leader, SHORT)
            if not fits and (rows + taken) > 0:
                break  # the job's sentences go shortest first: the next fit no better
            taken += 1
        return taken
