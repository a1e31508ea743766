"""Raw infer requests answered without uvicorn's per-request objects (raw_cycle.py).

Real servers on 127.0.0.1, requests written whole in one write (the raw route): no
``RequestResponseCycle`` is built for a good request, and one keep-alive timer serves a
run of them; an error is still answered through a real cycle, with the typed body; an
idle connection still closes after the keep-alive timeout while a busy one does not;
a client that goes cancels its queued request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from modelyard.app import App
from modelyard.scheduling.scheduler import ModelScheduler
from tests.fakes.fault_models import SLOW
from tests.integration.conftest import python_model
from tests.polling import wait_until
from tests.servers import running_server, write_config


def _post(model: str, value: float, *extra: str) -> bytes:
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}
    ).encode()
    head = [f"POST /v2/models/{model}/infer HTTP/1.1", "Host: test", *extra]
    head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return int(head.split()[1]), await reader.readexactly(length)


def _config(model_root: Path, tmp_path: Path, **server: Any) -> Path:
    faulty = python_model(
        "faulty", "FaultyModel", isolation="inline", preload=True, max_batch_size=1
    )
    return write_config(tmp_path, [faulty], model_repository=str(model_root), **server)


@asynccontextmanager
async def _slow_raw_request(
    model_root: Path, tmp_path: Path
) -> AsyncIterator[tuple[App, ModelScheduler, asyncio.StreamReader, asyncio.StreamWriter]]:
    """A server with one slow raw request running on a connection (closed on exit)."""
    async with running_server(_config(model_root, tmp_path)) as (app, _):
        scheduler = app.manager.resolve("faulty", None).scheduler
        assert scheduler is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
        writer.write(_post("faulty", SLOW))
        await wait_until(lambda: scheduler.pending == 1, what="the slow raw request runs")
        try:
            yield app, scheduler, reader, writer
        finally:
            writer.close()
            await writer.wait_closed()


def _protocol(app: App, writer: asyncio.StreamWriter) -> Any:
    """The server's protocol object of the client connection ``writer``."""
    assert app._http is not None
    ours = writer.get_extra_info("sockname")
    connections = app._http.server_state.connections
    (protocol,) = (c for c in connections if getattr(c, "client", None) == ours)
    return protocol


async def _closed_within(reader: asyncio.StreamReader, limit_s: float) -> float:
    started = time.monotonic()
    assert await asyncio.wait_for(reader.read(), limit_s) == b""
    return time.monotonic() - started


async def test_good_raw_requests_build_no_cycle_and_share_one_keep_alive_timer(
    model_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[RequestResponseCycle] = []
    original = RequestResponseCycle.__init__

    def counted(self: RequestResponseCycle, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(RequestResponseCycle, "__init__", counted)
    config = _config(model_root, tmp_path, limits={"keep_alive_timeout_s": 60})
    async with running_server(config) as (app, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
        protocol = _protocol(app, writer)
        timers = []
        for i in range(20):
            writer.write(_post("faulty", float(i + 10)))
            status, payload = await _answer(reader)
            assert status == 200
            assert json.loads(payload)["outputs"][0]["data"] == [float(i + 10)]
            timers.append(protocol.timeout_keep_alive_task)
        assert built == [], "no uvicorn request cycle for a good raw request"
        assert all(timer is timers[0] for timer in timers), "one keep-alive timer, not one each"
        assert timers[0] is not None

        # An error is answered through a real cycle, with the typed body, as before.
        writer.write(_post("nope", 1.0))
        status, payload = await _answer(reader)
        assert status == 404
        assert "nope" in json.loads(payload)["error"]
        assert len(built) == 1
        writer.write(_post("faulty", 5.0))  # and the connection goes on
        assert (await _answer(reader))[0] == 200
        writer.close()
        await writer.wait_closed()


@pytest.mark.slow
async def test_keep_alive_counts_from_the_last_answer_and_spares_a_busy_connection(
    model_root: Path, tmp_path: Path
) -> None:
    config = _config(model_root, tmp_path, limits={"keep_alive_timeout_s": 1})
    async with running_server(config) as (app, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
        # 0.3 s requests back to back for 2.5 keep-alive timeouts: the timer mostly
        # fires on a request in flight, which it must spare.
        started = time.monotonic()
        while time.monotonic() - started < 2.5:
            writer.write(_post("faulty", SLOW))
            assert (await _answer(reader))[0] == 200
        # Quick ones, a pause after each: the timer fires on an idle connection that
        # answered since it was armed, and waits for the rest of the timeout.
        started = time.monotonic()
        while True:
            writer.write(_post("faulty", 5.0))
            assert (await _answer(reader))[0] == 200
            if time.monotonic() - started > 2.5:
                break
            await asyncio.sleep(0.2)
        # Then idle: closed after the timeout, counted from that last answer.
        assert 0.8 < await _closed_within(reader, 8.0) < 5.0
        writer.close()


async def test_a_raw_client_that_goes_has_its_queued_request_removed(
    model_root: Path, tmp_path: Path
) -> None:
    async with _slow_raw_request(model_root, tmp_path) as (app, scheduler, first_r, _):
        _, second_w = await asyncio.open_connection("127.0.0.1", app.http_port)
        second_w.write(_post("faulty", SLOW))
        await wait_until(lambda: scheduler.pending == 2, what="the second request queues")
        second_w.close()  # the client goes before its answer
        await second_w.wait_closed()
        assert (await _answer(first_r))[0] == 200
        await wait_until(lambda: scheduler.counters["cancelled"] == 1, timeout_s=10.0)
        assert scheduler.counters["model_calls"] == 1, "the cancelled request never ran"


async def test_a_raw_request_under_way_at_shutdown_is_answered_then_closed(
    model_root: Path, tmp_path: Path
) -> None:
    async with _slow_raw_request(model_root, tmp_path) as (app, _, reader, _writer):
        assert app._http is not None
        app._http.should_exit = True  # uvicorn's graceful shutdown begins
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"\r\nconnection: close\r\n" in head.lower()
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        assert json.loads(await reader.readexactly(length))["outputs"][0]["data"] == [SLOW]
        assert await reader.read() == b"", "closed after its answer"


async def test_requests_sent_while_a_raw_one_runs_are_answered_after_it_in_order(
    model_root: Path, tmp_path: Path
) -> None:
    async with _slow_raw_request(model_root, tmp_path) as (_, _scheduler, reader, writer):
        # Queued behind it by uvicorn's parser (the raw route takes only idle reads).
        writer.write(_post("faulty", 6.0))
        await asyncio.sleep(0.05)
        writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n")
        status, payload = await _answer(reader)
        assert (status, json.loads(payload)["outputs"][0]["data"]) == (200, [SLOW])
        status, payload = await _answer(reader)
        assert (status, json.loads(payload)["outputs"][0]["data"]) == (200, [6.0])
        status, payload = await _answer(reader)
        assert status == 200
        assert json.loads(payload) == {"live": True}
