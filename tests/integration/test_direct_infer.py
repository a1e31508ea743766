"""Infer requests answered on uvicorn's request cycle without ASGI (frontends/http/direct.py).

Raw HTTP/1.1 over a real socket, so what the wire carries is what is checked: pipelined
requests answered in order, ``Connection: close``, ``Expect: 100-continue``, and errors on
the same connection; with tokens configured the auth layer keeps every request on ASGI.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from modelyard.frontends.http.fastpath import InferFastPath
from tests.integration.conftest import python_model
from tests.servers import running_server, write_config

MODELS = [
    python_model("echo", "EchoModel", isolation="inline"),
    {**python_model("echo", "EchoModel", isolation="process"), "name": "echo-process"},
]
X = {"inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP32", "data": [1.5, 2.5]}]}


@pytest.fixture
def config_file(model_root: Path, tmp_path: Path) -> Path:
    return write_config(tmp_path, MODELS, model_repository=str(model_root))


def _post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "host: test", f"content-length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    status_line = await reader.readline()
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) != b"\r\n":
        name, _, value = line.decode("latin-1").partition(":")
        assert name.lower() not in headers, f"header {name} sent twice"
        headers[name.lower()] = value.strip()
    body = await reader.readexactly(int(headers["content-length"]))
    return status, headers, body


async def _spy_asgi_infer(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths that reached the ASGI fast path (the direct path never calls it)."""
    seen: list[str] = []
    original = InferFastPath.__call__

    async def spy(self: InferFastPath, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        seen.append(scope["path"])
        await original(self, scope, receive, send)

    monkeypatch.setattr(InferFastPath, "__call__", spy)
    return seen


async def test_pipelined_requests_are_answered_in_order_without_asgi(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = await _spy_asgi_infer(monkeypatch)
    async with running_server(config_file) as (app, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
        body = json.dumps(X).encode()
        bad = b'{"inputs": []}'
        writer.write(
            _post("/v2/models/echo/infer", body)
            + _post("/v2/models/echo-process/infer", body)
            + _post("/v2/models/echo/infer", bad)
            + b"GET /v2/health/ready HTTP/1.1\r\nhost: test\r\n\r\n"
            + _post("/v2/models/echo/versions/1/infer", body)
        )
        await writer.drain()
        answers = [await _read_response(reader) for _ in range(5)]
        writer.close()
        await writer.wait_closed()
    statuses = [status for status, _, _ in answers]
    assert statuses == [200, 200, 400, 200, 200]
    for i in (0, 1, 4):
        _, headers, payload = answers[i]
        assert headers["content-type"] == "application/json"
        doc = json.loads(payload)
        assert doc["outputs"][0]["data"] == [1.5, 2.5]
    assert "inputs" in json.loads(answers[2][2])["error"]
    assert json.loads(answers[3][2]) == {"ready": True}
    # Only the health check went through ASGI routing; no infer request did.
    assert seen == ["/v2/health/ready"]


async def test_connection_close_and_expect_continue(config_file: Path) -> None:
    async with running_server(config_file) as (app, _):
        body = json.dumps(X).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
        head = _post("/v2/models/echo/infer", body, "expect: 100-continue")
        writer.write(head[: -len(body)])  # the head alone: the server invites the body
        await writer.drain()
        assert await reader.readline() == b"HTTP/1.1 100 Continue\r\n"
        assert await reader.readline() == b"\r\n"
        writer.write(body)
        status, _, payload = await _read_response(reader)
        assert status == 200
        assert json.loads(payload)["outputs"][0]["data"] == [1.5, 2.5]

        writer.write(_post("/v2/models/echo/infer", body, "connection: close"))
        status, headers, _ = await _read_response(reader)
        assert status == 200
        assert headers["connection"] == "close"
        assert await reader.read() == b"", "the server closes the connection after answering"
        writer.close()
        await writer.wait_closed()


async def test_with_tokens_every_infer_request_goes_through_asgi(
    model_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = await _spy_asgi_infer(monkeypatch)
    config = write_config(
        tmp_path,
        MODELS[:1],
        model_repository=str(model_root),
        security={"data_token": "s3cret-data-token-0123456789"},
    )
    async with running_server(config) as (_, client):
        refused = await client.post("/v2/models/echo/infer", json=X)
        assert refused.status_code == 401
        ok = await client.post(
            "/v2/models/echo/infer",
            json=X,
            headers={"authorization": "Bearer s3cret-data-token-0123456789"},
        )
        assert ok.status_code == 200, ok.text
    assert seen == ["/v2/models/echo/infer"]
