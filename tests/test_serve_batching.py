"""The micro-batcher (seq2seq/serving/batching.py): which requests share a search, in what order,
within which bounds."""

from __future__ import annotations

import asyncio
import threading

import pytest

from seq2seq.inference.translator import Translation
from seq2seq.serving.batching import SHORT, SPREAD, BatchingOptions, MicroBatcher, SearchOptions


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
            return [t.text for t in await batcher.submit(sentences, search, ones(sentences))]
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


def ones(sentences: list[str]) -> list[int]:
    """Every sentence's target-token limit 1: only ``max_batch_size`` bounds the batches."""
    return [1] * len(sentences)


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
    """The request cut by the batch's size goes on in the next batch, behind the one that did
    not get in at all."""
    recorder = Recorder()
    requests = [(["a"], GREEDY), (["b", "c"], GREEDY), (["d", "e"], GREEDY), (["f"], GREEDY)]
    answers = asyncio.run(served(recorder, BatchingOptions(max_batch_size=3), requests))
    assert answers == [["A"], ["B", "C"], ["D", "E"], ["F"]]
    assert [batch for batch, _, _ in recorder.batches] == [["a"], ["b", "c", "d"], ["f", "e"]]


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
        first = asyncio.create_task(batcher.submit(["a"], GREEDY, [1]))
        while not recorder.batches:
            await asyncio.sleep(0.001)
        gone = asyncio.create_task(batcher.submit(["b"], GREEDY, [1]))
        kept = asyncio.create_task(batcher.submit(["c"], GREEDY, [1]))
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
        first = asyncio.create_task(batcher.submit(["a"], GREEDY, [1]))
        while not recorder.batches:
            await asyncio.sleep(0.001)
        queued = asyncio.create_task(batcher.submit(["b", "c"], BEAM, [1, 1]))
        kept = asyncio.create_task(batcher.submit(["d"], GREEDY, [1]))
        await asyncio.sleep(0)
        queued.cancel()  # behind the first batch
        recorder.gate.set()
        await first
        answer = [t.text for t in await kept]
        waiting = asyncio.create_task(batcher.submit(["e"], GREEDY, [1]))
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
    with pytest.raises(ValueError, match="tokens of a batch"):
        BatchingOptions(max_batch_tokens=0)


class Stepper:
    """A stand-in for the model that runs one batch each time the test calls ``step``, so that
    the test decides what arrives during which batch."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.go = threading.Semaphore(0)

    def __call__(
        self, sentences: list[str], options: SearchOptions, batch_size: int
    ) -> list[Translation]:
        self.batches.append(list(sentences))
        assert self.go.acquire(timeout=30), "the test never let this batch run"
        return [Translation(sentence.upper()) for sentence in sentences]

    async def started(self, count: int) -> None:
        """Until ``count`` batches have reached the model."""
        while len(self.batches) < count:
            await asyncio.sleep(0.001)


def test_a_large_request_takes_turns_and_a_small_one_waits_one_batch() -> None:
    """A request of more sentences than a batch takes goes on a batch at a time, each time behind
    the requests that arrived meanwhile: a one-sentence request sent during its first batch is
    in the second, not after all of it; and each gets its own answers, in order."""

    async def scenario() -> tuple[list[str], list[str], list[list[str]]]:
        model = Stepper()
        batcher = MicroBatcher(model, BatchingOptions(max_batch_size=3, max_wait=0))
        batcher.start()
        large = [f"l{i}" for i in range(7)]
        big = asyncio.create_task(batcher.submit(large, GREEDY, ones(large)))
        await model.started(1)  # l0 l1 l2 in the model
        small = asyncio.create_task(batcher.submit(["s"], GREEDY, [1]))
        await asyncio.sleep(0.01)
        model.go.release()
        await model.started(2)
        model.go.release(5)
        answers = [t.text for t in await big], [t.text for t in await small]
        await batcher.close()
        return *answers, model.batches

    big, small, batches = asyncio.run(scenario())
    assert big == [f"L{i}" for i in range(7)] and small == ["S"]
    assert batches == [["l0", "l1", "l2"], ["s", "l3", "l4"], ["l5", "l6"]]


def test_a_batch_holds_at_most_max_batch_tokens() -> None:
    """Rows × the longest limit × beam within ``max_batch_tokens``: a request's sentences go
    shortest first, the batch ends where the next would take it over; one sentence over the
    bound alone goes in a batch of its own. The answers come back in the request's order."""

    async def scenario() -> list[list[str]]:
        model = Stepper()
        model.go.release(100)
        options = BatchingOptions(max_batch_size=64, max_wait=0, max_batch_tokens=100)
        batcher = MicroBatcher(model, options)
        batcher.start()
        sentences = ["a", "b", "c", "long", "d", "huge", "e"]
        limits = [10, 10, 10, 40, 10, 150, 10]
        answers = await batcher.submit(sentences, GREEDY, limits)
        assert [t.text for t in answers] == [s.upper() for s in sentences]
        beam = SearchOptions(beam_size=5)
        await batcher.submit(["f", "g", "h"], beam, [10, 10, 10])
        await batcher.close()
        return model.batches

    assert asyncio.run(scenario()) == [
        ["a", "b", "c", "d", "e"],  # shortest first: 5 × 10
        ["long"],  # with "huge", 2 × 150 > 100
        ["huge"],
        ["f", "g"],  # beam 5: 2 × 10 × 5 = 100
        ["h"],
    ]


def test_a_large_request_cancelled_between_its_batches_gives_the_model_no_more() -> None:
    async def scenario() -> tuple[list[list[str]], list[int]]:
        model, dropped = Stepper(), []
        batcher = MicroBatcher(model, BatchingOptions(max_batch_size=2, max_wait=0), None,
                               dropped.append)  # fmt: skip
        batcher.start()
        large = [f"l{i}" for i in range(6)]
        big = asyncio.create_task(batcher.submit(large, GREEDY, ones(large)))
        await model.started(1)
        big.cancel()  # the client went away during its first batch
        model.go.release(10)
        other = await batcher.submit(["x"], GREEDY, [1])
        assert [t.text for t in other] == ["X"]
        await batcher.close()
        return model.batches, dropped

    batches, dropped = asyncio.run(scenario())
    assert batches == [["l0", "l1"], ["x"]] and dropped == [4]


def test_without_batching_a_large_request_still_takes_turns_alone() -> None:
    async def scenario() -> list[list[str]]:
        model = Stepper()
        batcher = MicroBatcher(model, BatchingOptions(max_batch_size=2, enabled=False))
        batcher.start()
        large = ["l0", "l1", "l2", "l3"]
        big = asyncio.create_task(batcher.submit(large, GREEDY, ones(large)))
        await model.started(1)
        small = asyncio.create_task(batcher.submit(["s", "t"], GREEDY, [1, 1]))
        await asyncio.sleep(0.01)
        model.go.release(10)
        await asyncio.gather(big, small)
        await batcher.close()
        return model.batches

    assert asyncio.run(scenario()) == [["l0", "l1"], ["s", "t"], ["l2", "l3"]]


def test_limits_must_match_the_sentences() -> None:
    async def scenario() -> None:
        batcher = MicroBatcher(Recorder(), BatchingOptions())
        with pytest.raises(ValueError, match="2 sentences but 1 limits"):
            await batcher.submit(["a", "b"], GREEDY, [1])
        assert await batcher.submit([], GREEDY, []) == []

    asyncio.run(scenario())


def test_a_short_request_is_not_made_to_wait_for_long_sentences_in_its_batch() -> None:
    """A batch runs as many steps as its longest sentence: sentences whose limit is over SPREAD
    times the batch's first one's (and over SPREAD × SHORT) wait for a batch of their own, while
    short ones may join a batch that long ones lead."""

    async def scenario() -> list[list[str]]:
        model = Stepper()
        batcher = MicroBatcher(model, BatchingOptions(max_batch_size=64, max_wait=0))
        batcher.start()
        long = ["l0", "l1", "l2", "l3"]
        large = asyncio.create_task(batcher.submit(long, GREEDY, [100, 150, 200, 201]))
        await model.started(1)  # l0 l1 l2 (up to 2 × 100)
        short = asyncio.create_task(batcher.submit(["s", "t"], GREEDY, [10, 30]))
        await asyncio.sleep(0.01)
        model.go.release()
        await model.started(2)  # s t, not l3 (201 > 2 × 64)
        later = asyncio.create_task(batcher.submit(["u"], GREEDY, [20]))
        await asyncio.sleep(0.01)
        model.go.release(10)
        await asyncio.gather(large, short, later)
        await batcher.close()
        return model.batches

    assert asyncio.run(scenario()) == [["l0", "l1", "l2"], ["s", "t"], ["l3", "u"]]
    assert SPREAD == 2 and SHORT == 64  # the numbers above


def test_other_work_takes_its_turn_alone_and_is_dropped_if_cancelled() -> None:
    """``run``: work of its own (the explorer's) waits in line like a request, runs in the
    model's thread alone, never in a batch with translations, and never runs if cancelled."""

    async def scenario() -> tuple[list[list[str]], list[str], str, list[int]]:
        model, ran, dropped = Stepper(), [], []
        batcher = MicroBatcher(model, BatchingOptions(max_wait=0), None, dropped.append)
        batcher.start()
        first = asyncio.create_task(batcher.submit(["a"], GREEDY, [1]))
        await model.started(1)

        def work(name: str) -> str:
            ran.append(name)
            return name.upper()

        kept = asyncio.create_task(batcher.run(lambda: work("kept"), "k", 1))
        gone = asyncio.create_task(batcher.run(lambda: work("gone"), "g", 1))
        after = asyncio.create_task(batcher.submit(["b"], GREEDY, [1]))
        await asyncio.sleep(0.01)
        gone.cancel()
        model.go.release(10)
        await first
        answer = await kept
        await after
        await batcher.close()
        return model.batches, ran, answer, dropped

    batches, ran, answer, dropped = asyncio.run(scenario())
    assert batches == [["a"], ["b"]] and ran == ["kept"] and answer == "KEPT"
    assert dropped == [1]
