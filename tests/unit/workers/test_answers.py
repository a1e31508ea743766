"""AnswerGate: calls waiting for their first answer, counted per worker and per factory."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from modelyard.errors import WorkerCrashedError
from modelyard.protocol.generate import GenerateRequest, SamplingParams
from modelyard.workers.answers import AnswerGate
from modelyard.workers.messages import Chunk, Generate, Message
from modelyard.workers.streams import GenerationStreams

REQUEST = GenerateRequest("m", None, "hi", None, SamplingParams(max_tokens=2))


async def test_quiet_returns_at_once_when_no_call_waits() -> None:
    gate = AnswerGate()
    assert gate.waiting == 0
    assert await asyncio.wait_for(gate.quiet(10.0), 1.0)


async def test_quiet_waits_for_the_last_answer() -> None:
    gate = AnswerGate()
    first, second = gate.begin(), gate.begin()
    waiter = asyncio.ensure_future(gate.quiet(10.0))
    await asyncio.sleep(0.01)
    first.end()
    first.end()  # idempotent: one call ends once
    await asyncio.sleep(0.01)
    assert not waiter.done(), "returned while a call still waited"
    assert gate.waiting == 1
    second.end()
    assert await asyncio.wait_for(waiter, 1.0)
    assert gate.waiting == 0


async def test_quiet_gives_up_after_its_timeout() -> None:
    gate = AnswerGate()
    pending = gate.begin()
    assert not await gate.quiet(0.02)
    pending.end()
    assert await gate.quiet(0.02)


async def test_a_workers_calls_count_in_the_factorys_gate_too() -> None:
    factory = AnswerGate()
    one, two = AnswerGate(factory), AnswerGate(factory)
    a, b = one.begin(), two.begin()
    assert (one.waiting, two.waiting, factory.waiting) == (1, 1, 2)
    a.end()
    assert await one.quiet(0.01)
    assert not await factory.quiet(0.01)
    b.end()
    assert await factory.quiet(0.01)


async def test_a_generation_stream_waits_until_its_first_chunk_is_passed_on() -> None:
    """A stream counts from its Generate until its consumer has taken its first chunk and
    comes back for more (it has passed it on), not until its end: work that waits for
    the gate may run while the rest is decoded."""
    gate = AnswerGate()
    sent: list[Message] = []
    seqs = itertools.count(1)
    streams = GenerationStreams(sent.append, lambda: next(seqs), gate)
    chunks = streams.generate(REQUEST)
    first = asyncio.ensure_future(anext(chunks))
    await asyncio.sleep(0.01)
    assert isinstance(sent[0], Generate)
    assert gate.waiting == 1
    assert streams.owns(Chunk(sent[0].job.seq, "a", (1,), None, 1, 1))
    assert (await first).text == "a"
    assert gate.waiting == 1, "ended before the first chunk was passed on"
    assert streams.owns(Chunk(sent[0].job.seq, "b", (2,), "stop", 1, 2))
    assert [c.text async for c in chunks] == ["b"]
    assert gate.waiting == 0


async def test_an_abandoned_stream_stops_waiting() -> None:
    gate = AnswerGate()
    streams = GenerationStreams(lambda _: None, lambda: 1, gate)
    chunks = streams.generate(REQUEST)
    first = asyncio.ensure_future(anext(chunks))
    await asyncio.sleep(0.01)
    assert gate.waiting == 1
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await chunks.aclose()
    assert gate.waiting == 0


async def test_a_stream_that_fails_before_its_first_chunk_stops_waiting() -> None:
    gate = AnswerGate()
    streams = GenerationStreams(lambda _: None, lambda: 1, gate)
    chunks = streams.generate(REQUEST)
    first = asyncio.ensure_future(anext(chunks))
    await asyncio.sleep(0.01)
    streams.fail_all(WorkerCrashedError("worker 1 of model 'm' was killed"))
    with pytest.raises(WorkerCrashedError):
        await first
    assert gate.waiting == 0
