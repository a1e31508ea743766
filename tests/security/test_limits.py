"""The ``limits:`` block against a real server: elements, response bytes, slow and
silent connections, and the connection cap, each with a good request afterwards."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import pytest_asyncio

from modelyard.app import App
from modelyard.examples.mlp import build_add_onnx
from modelyard.frontends.grpc.convert import request_to_proto
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from modelyard.frontends.http.connections import overflow_connections
from modelyard.protocol.types import InferInput, InferRequest
from tests.polling import wait_until
from tests.servers import running_server, write_config

pytestmark = pytest.mark.asyncio(loop_scope="module")

ELEMENTS = 100
RESPONSE_BYTES = 300
BOUNDS = {
    "max_request_elements": ELEMENTS,
    "max_response_bytes": RESPONSE_BYTES,
    "max_control_body_bytes": 1024,  # the old name, in bytes: still accepted
    "header_timeout_s": 0.5,
    "body_idle_timeout_s": 0.5,
}


def body(rows: int) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "input", "shape": [rows, 4], "datatype": "FP32", "data": [0.0] * (rows * 4)}
        ]
    }


def config(tmp_path: Path, **server: Any) -> Path:
    repo = tmp_path / "repo"
    build_add_onnx(repo / "add" / "1" / "model.onnx", 1.0)
    models = [{"name": "add", "path": "add", "isolation": "inline", "preload": True}]
    return write_config(tmp_path, models, model_repository=str(repo), **server)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bounded(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[App, httpx.AsyncClient]]:
    """One server with small bounds (elements, response bytes, bodies, head deadline)."""
    cfg = config(tmp_path_factory.mktemp("limits"), limits=BOUNDS)
    async with running_server(cfg, grpc=True) as served:
        yield served


async def good_request(client: httpx.AsyncClient) -> None:
    r = await client.post("/v2/models/add/infer", json=body(1))
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [1.0] * 4


async def grpc_infer(app: App, rows: int) -> grpc.StatusCode | str:
    x = np.zeros((rows, 4), dtype=np.float32)
    request = request_to_proto(
        InferRequest("add", None, [InferInput("input", "FP32", (rows, 4), x)])
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        stub: Any = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            await stub.ModelInfer(request, timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc.details() or str(exc.code())
    return grpc.StatusCode.OK


async def test_elements_and_response_bytes_are_bounded_on_every_decoder(
    bounded: tuple[App, httpx.AsyncClient],
) -> None:
    app, client = bounded
    await good_request(client)
    # JSON: 30 rows of 4 are 120 elements.
    r = await client.post("/v2/models/add/infer", json=body(30))
    assert r.status_code == 413
    assert "limits.max_request_elements" in r.json()["error"]
    # A shape that claims a billion rows is refused from the shape, before its data.
    doc = body(1)
    doc["inputs"][0]["shape"] = [1_000_000_000, 4]
    r = await client.post("/v2/models/add/infer", json=doc)
    assert r.status_code == 413, r.text
    # The binary extension.
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": [30, 4],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 480},
                }
            ]
        }
    ).encode()
    r = await client.post(
        "/v2/models/add/infer",
        content=header + bytes(480),
        headers={"inference-header-content-length": str(len(header))},
    )
    assert r.status_code == 413
    assert "limits.max_request_elements" in r.json()["error"]
    # /predict builds its arrays itself; the data plane counts them too.
    r = await client.post("/predict", json={"model": "add", "inputs": {"input": [[0.0] * 4] * 30}})
    assert r.status_code == 413
    # gRPC.
    assert "limits.max_request_elements" in str(await grpc_infer(app, 30))
    # 20 rows fit the element budget, but their answer is over 300 bytes.
    r = await client.post("/v2/models/add/infer", json=body(20))
    assert r.status_code == 413
    assert "limits.max_response_bytes" in r.json()["error"]
    assert "limits.max_response_bytes" in str(await grpc_infer(app, 20))
    assert await grpc_infer(app, 1) == grpc.StatusCode.OK
    await good_request(client)


async def _closed_within(reader: asyncio.StreamReader, limit_s: float) -> float:
    started = time.monotonic()
    try:
        data = await asyncio.wait_for(reader.read(), limit_s)
    except ConnectionResetError:
        # Closed with bytes of ours still unread (the slow client kept writing): the
        # kernel resets instead of a clean end. Closed all the same.
        return time.monotonic() - started
    assert data == b"", "the server answered instead of closing"
    return time.monotonic() - started


async def test_silent_and_slow_request_heads_are_closed(
    bounded: tuple[App, httpx.AsyncClient],
) -> None:
    app, client = bounded
    port = app.http_port
    assert port is not None
    silent_r, silent_w = await asyncio.open_connection("127.0.0.1", port)
    slow_r, slow_w = await asyncio.open_connection("127.0.0.1", port)

    async def slowloris() -> None:
        # One byte every 0.1 s: each byte is progress, but the head is never done.
        with_bytes = b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nX-Pad: "
        for b in with_bytes + b"a" * 100:
            if slow_w.is_closing():
                return
            slow_w.write(bytes([b]))
            await asyncio.sleep(0.1)

    drip = asyncio.create_task(slowloris())
    try:
        assert await _closed_within(silent_r, 3.0) < 2.0
        assert await _closed_within(slow_r, 3.0) < 2.0
    finally:
        drip.cancel()
        silent_w.close()
        slow_w.close()
    await good_request(client)


async def test_a_stalled_request_body_is_closed(bounded: tuple[App, httpx.AsyncClient]) -> None:
    app, client = bounded
    reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
    # A complete head, part of the body, then nothing: the request never completes.
    writer.write(
        b"POST /v2/repository/models/add/aliases/blue HTTP/1.1\r\nHost: x\r\n"
        b'Content-Length: 100\r\n\r\n{"version"'
    )
    started = time.monotonic()
    data = await asyncio.wait_for(reader.read(), 5.0)
    assert time.monotonic() - started < 3.0
    assert b" 200 " not in data
    writer.close()
    await good_request(client)


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="function")
async def test_idle_keep_alive_connections_are_closed(tmp_path: Path) -> None:
    cfg = config(tmp_path, limits={"keep_alive_timeout_s": 1})
    async with running_server(cfg) as (app, client):
        port = app.http_port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        payload = json.dumps(body(1)).encode()
        writer.write(
            f"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}"
            "\r\nContent-Type: application/json\r\n\r\n".encode()
            + payload
        )
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        elapsed = await _closed_within(reader, 5.0)
        assert 0.5 < elapsed < 3.0
        writer.close()
        await good_request(client)


async def _silent(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


@pytest.fixture
def connection_cap() -> int:
    return 20


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="function")
async def test_silent_connections_over_the_cap_do_not_lock_out_good_clients(
    tmp_path: Path, connection_cap: int
) -> None:
    # A long head deadline: what saves the good clients here is the cap making room.
    cfg = config(tmp_path, limits={"max_connections": connection_cap, "header_timeout_s": 60})
    async with running_server(cfg) as (app, _):
        port = app.http_port
        assert port is not None
        silent = [await _silent(port) for _ in range(2 * connection_cap)]
        await asyncio.sleep(0.1)
        for _ in range(5):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as fresh:
                await good_request(fresh)

        async def is_closed(reader: asyncio.StreamReader) -> bool:
            try:
                return await asyncio.wait_for(reader.read(), 0.3) == b""
            except TimeoutError:
                return False

        closed = await asyncio.gather(*(is_closed(reader) for reader, _ in silent))
        for _, writer in silent:
            writer.close()
        assert sum(closed) >= connection_cap, "the oldest silent connections made room"
        assert not any(closed[-connection_cap // 2 :]), "the newest ones were kept"


async def _busy(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    # A complete head whose body never comes: the connection is in a request.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v2/repository/models/add/aliases/blue HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: 100\r\n\r\n"
    )
    await writer.drain()
    return reader, writer


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="function")
async def test_busy_connections_at_the_cap_get_503_and_descriptors_stay_bounded(
    tmp_path: Path, connection_cap: int
) -> None:
    cfg = config(tmp_path, limits={"max_connections": connection_cap})
    async with running_server(cfg) as (app, client):
        port = app.http_port
        assert port is not None
        assert app._http is not None
        busy = [await _busy(port) for _ in range(connection_cap)]
        server_state = app._http.server_state
        await wait_until(
            lambda: len(server_state.connections) >= connection_cap,
            30.0,
            what="the server has taken every busy connection",
        )
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as fresh:
            r = await fresh.post("/v2/models/add/infer", json=body(1))
            assert r.status_code == 503
        # Many more: those past a small overflow are closed at once, so the server's
        # descriptors stay bounded whatever a client opens.
        busy += [await _busy(port) for _ in range(3 * connection_cap)]
        await asyncio.sleep(0.2)
        open_now = len(app._http.server_state.connections)
        assert open_now <= connection_cap + overflow_connections(connection_cap) + 1
        for _, writer in busy:
            writer.close()
        await asyncio.sleep(0.2)
        await good_request(client)


async def test_every_admin_route_reads_a_bounded_body(
    bounded: tuple[App, httpx.AsyncClient],
) -> None:
    client = bounded[1]

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(8):
            yield b" " * 512

    reading = (
        "/v2/repository/models/add/aliases/blue",
        "/v2/repository/models/add/rollback",
        "/v2/repository/models/add/load",
        "/v2/repository/models/add/unload",
        "/v2/repository/index",
    )
    for path in (*reading, "/v2/repository/models/add/pin", "/v2/stats", "/metrics"):
        r = await client.request(
            "GET" if path in ("/v2/stats", "/metrics") else "POST", path, content=b" " * 2048
        )
        assert r.status_code == 413, (path, r.text)
        assert "limits.max_control_body_mb" in r.json()["error"]
    # Without a declared length, the body is counted as it arrives (routes that
    # never read a body, like pin, never buffer more than the transport's window).
    for path in reading:
        r = await client.post(path, content=chunks())
        assert r.status_code == 413, (path, r.text)
    # Inference bodies keep the larger max_request_bytes.
    doc = body(1)
    doc["parameters"] = {"padding": "x" * 4096}
    r = await client.post("/v2/models/add/infer", json=doc)
    assert r.status_code == 200, r.text
    await good_request(client)
