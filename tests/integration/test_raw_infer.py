"""The raw infer route (frontends/http/raw_infer.py) answers as httptools' route does.

Each request goes twice over real sockets: whole in one write (read raw, before
uvicorn's parser) and with its body sent after its head (parsed by httptools, answered
on the direct cycle). Status, headers (but the date) and body must be the same bytes,
for good requests and bad ones; which route answered is checked by which handler
method ran.
"""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path

import pytest

from modelyard.frontends.http.fastpath import InferHandler
from tests.integration.conftest import python_model
from tests.servers import running_server, write_config

MODELS = [
    python_model("echo", "EchoModel", isolation="inline"),
    {**python_model("echo", "EchoModel", isolation="process"), "name": "echo-process"},
]
X = json.dumps({"inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP32", "data": [1.5, 2.5]}]})
BINARY_HEAD = json.dumps(
    {
        "inputs": [
            {
                "name": "x",
                "shape": [2, 1],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 8},
            }
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }
).encode()
MAX_REQUEST_BYTES = 4096


def _post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: test", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


CASES: dict[str, tuple[bytes, bool]] = {
    # name: (request, whether the whole-in-one-write send is read raw)
    "json": (_post("/v2/models/echo/infer", X.encode()), True),
    "process": (_post("/v2/models/echo-process/infer", X.encode()), True),
    "version": (_post("/v2/models/echo/versions/1/infer", X.encode()), True),
    "binary": (
        _post(
            "/v2/models/echo/infer",
            BINARY_HEAD + struct.pack("<2f", 1.5, 2.5),
            f"Inference-Header-Content-Length: {len(BINARY_HEAD)}",
        ),
        True,
    ),
    "bad json": (_post("/v2/models/echo/infer", b'{"inputs": ['), True),
    "no inputs": (_post("/v2/models/echo/infer", b'{"inputs": []}'), True),
    "unknown model": (_post("/v2/models/nope/infer", X.encode()), True),
    "unknown version": (_post("/v2/models/echo/versions/9/infer", X.encode()), True),
    "bad timeout": (_post("/v2/models/echo/infer", X.encode(), "X-Modelyard-Timeout-Ms: x"), True),
    "bad header length": (
        _post("/v2/models/echo/infer", X.encode(), "Inference-Header-Content-Length: 9999"),
        True,
    ),
    "too large": (_post("/v2/models/echo/infer", b" " * (MAX_REQUEST_BYTES + 1)), False),
}


@pytest.fixture
def config_file(model_root: Path, tmp_path: Path) -> Path:
    return write_config(
        tmp_path,
        MODELS,
        model_repository=str(model_root),
        max_request_mb=MAX_REQUEST_BYTES / (1024 * 1024),
    )


async def _read_response(reader: asyncio.StreamReader) -> tuple[bytes, list[bytes], bytes]:
    status_line = await reader.readline()
    headers: list[bytes] = []
    length = 0
    while (line := await reader.readline()) != b"\r\n":
        name = line.split(b":", 1)[0].lower()
        if name == b"content-length":
            length = int(line.split(b":", 1)[1])
        if name != b"date":  # the only header that may differ between two answers
            headers.append(line)
    return status_line, headers, await reader.readexactly(length)


async def _exchange(port: int, request: bytes, *, split: bool) -> tuple[bytes, list[bytes], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if split:
            head_end = request.index(b"\r\n\r\n") + 4
            writer.write(request[:head_end])
            await writer.drain()
            await asyncio.sleep(0.05)  # the head is parsed before the body comes
            writer.write(request[head_end:])
        else:
            writer.write(request)
        await writer.drain()
        answer = await _read_response(reader)
        # The connection is still usable afterwards: a health check on it.
        writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n")
        status, _, _ = await _read_response(reader)
        assert status.startswith(b"HTTP/1.1 200"), status
        return answer
    finally:
        writer.close()
        await writer.wait_closed()


async def test_the_raw_route_answers_the_same_bytes_as_the_parsed_route(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[str] = []
    original = InferHandler.answer

    async def spy(self: InferHandler, scope, receive, model, version, **kw):  # type: ignore[no-untyped-def]
        parsed.append(scope["path"])
        return await original(self, scope, receive, model, version, **kw)

    monkeypatch.setattr(InferHandler, "answer", spy)
    async with running_server(config_file) as (app, _):
        port = app.http_port
        assert port is not None
        for name, (request, read_raw) in CASES.items():
            parsed.clear()
            whole = await _exchange(port, request, split=False)
            assert len(parsed) == (0 if read_raw else 1), f"{name}: route taken"
            parsed.clear()
            split = await _exchange(port, request, split=True)
            assert len(parsed) == 1, f"{name}: the split send is parsed by httptools"
            assert whole == split, name
            if name in ("json", "process", "version"):
                assert whole[0] == b"HTTP/1.1 200 OK\r\n"
                assert json.loads(whole[2])["outputs"][0]["data"] == [1.5, 2.5]
            elif name == "binary":
                assert whole[0] == b"HTTP/1.1 200 OK\r\n"
                assert whole[2].endswith(struct.pack("<2f", 1.5, 2.5))
            else:
                assert not whole[0].startswith(b"HTTP/1.1 200"), name


async def test_connection_close_on_the_raw_route_closes_after_the_answer(
    config_file: Path,
) -> None:
    async with running_server(config_file) as (app, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
        writer.write(_post("/v2/models/echo/infer", X.encode(), "Connection: close"))
        status, headers, payload = await _read_response(reader)
        assert status == b"HTTP/1.1 200 OK\r\n"
        assert b"connection: close\r\n" in headers
        assert json.loads(payload)["outputs"][0]["data"] == [1.5, 2.5]
        assert await reader.read() == b""
        writer.close()
        await writer.wait_closed()
