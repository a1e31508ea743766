"""The server-sent-event writer of the OpenAI routes, driven through its ASGI interface.

A stream ends with ``data: [DONE]``; a failure mid-stream is one last error event (no
``[DONE]``); a client that disconnects stops the sending and closes the source, which
is what stops generation in the worker.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from starlette.types import Message

from modelyard.errors import WorkerCrashedError
from modelyard.frontends.http.openai import EventStream


class _Wire:
    """The ASGI receive/send pair of one request whose body was already read."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.gone = asyncio.Event()

    async def receive(self) -> Message:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def events(self) -> list[str]:
        body = b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        return [e.removeprefix("data: ") for e in body.decode().split("\n\n") if e]


async def _source(
    count: int, closed: list[bool], fail: bool = False, pause_s: float = 0.0
) -> AsyncGenerator[dict[str, Any], None]:
    try:
        for i in range(count):
            if pause_s:
                await asyncio.sleep(pause_s)
            yield {"i": i}
        if fail:
            raise WorkerCrashedError("the worker serving 'm' died")
    finally:
        closed.append(True)


async def test_a_stream_ends_with_done() -> None:
    wire, closed = _Wire(), list[bool]()
    await EventStream({"i": -1}, _source(2, closed))(
        {"path": "/v1/completions"}, wire.receive, wire.send
    )
    assert wire.sent[0]["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in wire.sent[0]["headers"]
    assert wire.events() == ['{"i":-1}', '{"i":0}', '{"i":1}', "[DONE]"]
    assert closed == [True]
    assert wire.sent[-1].get("more_body", False) is False


async def test_a_failure_mid_stream_is_one_last_error_event_without_done() -> None:
    wire, closed = _Wire(), list[bool]()
    stream = EventStream({"i": -1}, _source(1, closed, fail=True))
    await stream({"path": "/v1/completions"}, wire.receive, wire.send)
    events = wire.events()
    assert events[:2] == ['{"i":-1}', '{"i":0}']
    error = json.loads(events[2])["error"]
    assert error["code"] == "worker_crashed"
    assert error["type"] == "server_error"
    assert "died" in error["message"]
    assert len(events) == 3  # no [DONE] after an error
    assert wire.sent[-1]["more_body"] is False
    assert closed == [True]


async def test_a_client_that_disconnects_closes_the_source() -> None:
    wire, closed = _Wire(), list[bool]()
    stream = EventStream({"i": -1}, _source(10_000, closed, pause_s=0.005))
    task = asyncio.create_task(stream({"path": "/v1/completions"}, wire.receive, wire.send))
    await asyncio.sleep(0.05)
    wire.gone.set()
    await asyncio.wait_for(task, 5)  # returns quietly: nobody is left to answer
    assert closed == [True]
    sent = len(wire.events())
    assert 1 < sent < 100
    assert "[DONE]" not in wire.events()
