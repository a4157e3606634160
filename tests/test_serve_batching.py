"""The micro-batcher (seq2seq/inference/batching.py): which requests share a search, in order."""

from __future__ import annotations

import asyncio
import threading

import pytest

from seq2seq.inference.translator import Translation
from seq2seq.serving.batching import BatchingOptions, MicroBatcher, SearchOptions


class Recorder:
    """A stand-in for the model: answers each sentence with its upper case and records every
    batch it is given. ``gate`` holds the first batch until the test opens it, so that the next
    requests queue up behind it deterministically."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.batches: list[tuple[list[str], SearchOptions, int]] = []
        self.gate = threading.Event()
        self.fail_on = fail_on

    def __call__(
        self, sentences: list[str], options: SearchOptions, batch_size: int
    ) -> list[Translation]:
        self.batches.append((list(sentences), options, batch_size))
        self.gate.wait(timeout=30)
        if self.fail_on in sentences:
            raise RuntimeError(f"cannot translate {self.fail_on!r}")
        return [Translation(sentence.upper()) for sentence in sentences]


async def served(
    recorder: Recorder, options: BatchingOptions, requests: list[tuple[list[str], SearchOptions]]
) -> list[list[str] | str]:
    """Submit the first request, let it reach the model, queue the others behind it, then let the
    model go: the answers (texts, or the error message) in request order."""
    batcher = MicroBatcher(recorder, options)
    batcher.start()

    async def submit(sentences: list[str], search: SearchOptions) -> list[str] | str:
        try:
            return [t.text for t in await batcher.submit(sentences, search)]
        except RuntimeError as error:
            return str(error)

    first = asyncio.create_task(submit(*requests[0]))
    while not recorder.batches:  # the first batch is in the model, held by the gate
        await asyncio.sleep(0.001)
    rest = [asyncio.create_task(submit(*request)) for request in requests[1:]]
    await asyncio.sleep(0)  # every request is queued
    recorder.gate.set()
    answers = await asyncio.gather(first, *rest)
    await batcher.close()
    return list(answers)


GREEDY = SearchOptions()
BEAM = SearchOptions(beam_size=4, n_best=2)


def test_requests_that_queue_together_share_one_search_and_get_their_own_answers() -> None:
    recorder = Recorder()
    requests = [(["a"], GREEDY), (["b", "c"], GREEDY), (["d"], GREEDY), (["e", "f", "g"], GREEDY)]
    answers = asyncio.run(served(recorder, BatchingOptions(max_batch_size=64), requests))
    assert answers == [["A"], ["B", "C"], ["D"], ["E", "F", "G"]]
    assert [batch for batch, _, _ in recorder.batches] == [["a"], ["b", "c", "d", "e", "f", "g"]]
    assert all(size == 64 for _, _, size in recorder.batches)  # the translator's batch size


def test_only_requests_with_the_same_search_share_a_batch_first_come_first_served() -> None:
    recorder = Recorder()
    requests = [(["a"], GREEDY), (["b"], BEAM), (["c"], GREEDY), (["d"], BEAM)]
    answers = asyncio.run(served(recorder, BatchingOptions(), requests))
    assert answers == [["A"], ["B"], ["C"], ["D"]]
    assert [(batch, options) for batch, options, _ in recorder.batches] == [
        (["a"], GREEDY),
        (["b", "d"], BEAM),
        (["c"], GREEDY),
    ]


def test_a_batch_stops_at_the_largest_size_and_the_rest_waits_its_turn() -> None:
    recorder = Recorder()
    requests = [(["a"], GREEDY), (["b", "c"], GREEDY), (["d", "e"], GREEDY), (["f"], GREEDY)]
    answers = asyncio.run(served(recorder, BatchingOptions(max_batch_size=3), requests))
    assert answers == [["A"], ["B", "C"], ["D", "E"], ["F"]]
    assert [batch for batch, _, _ in recorder.batches] == [["a"], ["b", "c", "f"], ["d", "e"]]


def test_without_batching_each_request_is_searched_alone() -> None:
    recorder = Recorder()
    requests = [(["a"], GREEDY), (["b", "c"], GREEDY), (["d"], GREEDY)]
    asyncio.run(served(recorder, BatchingOptions(enabled=False), requests))
    assert [batch for batch, _, _ in recorder.batches] == [["a"], ["b", "c"], ["d"]]


def test_a_failing_batch_fails_its_requests_only_and_the_batcher_goes_on() -> None:
    recorder = Recorder(fail_on="bad")
    requests = [(["a"], GREEDY), (["bad"], BEAM), (["b"], GREEDY), (["c"], BEAM)]
    answers = asyncio.run(served(recorder, BatchingOptions(), requests))
    assert answers == [["A"], "cannot translate 'bad'", ["B"], "cannot translate 'bad'"]


def test_a_request_whose_client_left_does_not_disturb_the_others() -> None:
    async def scenario() -> list[str]:
        recorder = Recorder()
        batcher = MicroBatcher(recorder, BatchingOptions())
        batcher.start()
        first = asyncio.create_task(batcher.submit(["a"], GREEDY))
        while not recorder.batches:
            await asyncio.sleep(0.001)
        gone = asyncio.create_task(batcher.submit(["b"], GREEDY))
        kept = asyncio.create_task(batcher.submit(["c"], GREEDY))
        await asyncio.sleep(0)
        gone.cancel()
        recorder.gate.set()
        await first
        answer = [t.text for t in await kept]
        await batcher.close()
        return answer

    assert asyncio.run(scenario()) == ["C"]


def test_a_cancelled_request_never_reaches_the_model_and_is_counted() -> None:
    """Cancelled while queued (behind a batch), or while it waits for others to join its own:
    either way the model never sees its sentences, and ``on_drop`` hears how many there were."""

    async def scenario() -> tuple[list[str], list[int], int, list[str]]:
        recorder, dropped = Recorder(), []
        batcher = MicroBatcher(recorder, BatchingOptions(max_wait=0.2), on_drop=dropped.append)
        batcher.start()
        first = asyncio.create_task(batcher.submit(["a"], GREEDY))
        while not recorder.batches:
            await asyncio.sleep(0.001)
        queued = asyncio.create_task(batcher.submit(["b", "c"], BEAM))
        kept = asyncio.create_task(batcher.submit(["d"], GREEDY))
        await asyncio.sleep(0)
        queued.cancel()  # behind the first batch
        recorder.gate.set()
        await first
        answer = [t.text for t in await kept]
        waiting = asyncio.create_task(batcher.submit(["e"], GREEDY))
        await asyncio.sleep(0.05)  # taken from the queue, waiting 0.2 s for others
        waiting.cancel()
        await asyncio.sleep(0.3)
        await batcher.close()
        seen = [sentence for batch, _, _ in recorder.batches for sentence in batch]
        return answer, dropped, batcher.dropped, seen

    answer, dropped, count, seen = asyncio.run(scenario())
    assert answer == ["D"] and dropped == [2, 1] and count == 2
    assert seen == ["a", "d"]  # what the model was given


def test_batching_options_are_checked() -> None:
    with pytest.raises(ValueError, match="batch size"):
        BatchingOptions(max_batch_size=0)
    with pytest.raises(ValueError, match="wait"):
        BatchingOptions(max_wait=-1)
