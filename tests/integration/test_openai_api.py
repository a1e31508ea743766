"""The OpenAI-compatible routes on a real server, through the stock ``openai`` client.

Every refusal is OpenAI's error object with the right status, which the client turns
into its own typed exception; the server keeps serving after each.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from modelyard.app import App
from tests.servers import running_server, write_config

pytest.importorskip("openai", reason="the test extra installs the openai client")
import openai

DATA_TOKEN = "data-token-for-openai-tests"
MODELS = [{"name": "add", "path": "add", "isolation": "inline"}]


@contextlib.asynccontextmanager
async def _server(
    model_root: Path, tmp_path: Path, **server: object
) -> AsyncIterator[tuple[App, httpx.AsyncClient, openai.AsyncOpenAI]]:
    cfg = write_config(tmp_path, MODELS, model_repository=str(model_root), **server)
    async with running_server(cfg) as (app, client):
        stock = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{app.http_port}/v1",
            api_key=DATA_TOKEN,
            max_retries=0,  # a 429 or 503 must show, not be retried away
        )
        try:
            yield app, client, stock
        finally:
            await stock.close()


def _error(r: httpx.Response) -> dict[str, object]:
    body = r.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict)
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def plain(
    model_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[App, httpx.AsyncClient, openai.AsyncOpenAI]]:
    """One server without tokens for the tests that need nothing else."""
    async with _server(model_root, tmp_path_factory.mktemp("plain")) as served:
        yield served


@pytest.mark.asyncio(loop_scope="module")
async def test_models_are_listed_and_unknown_models_are_404(
    plain: tuple[App, httpx.AsyncClient, openai.AsyncOpenAI],
) -> None:
    _, client, stock = plain
    listed = await stock.models.list()
    assert [m.id for m in listed.data] == ["add"]
    assert (await stock.models.retrieve("add")).id == "add"
    with pytest.raises(openai.NotFoundError) as info:
        await stock.completions.create(model="no-such-model", prompt="hi")
    assert info.value.status_code == 404
    assert info.value.code == "model_not_found"
    assert info.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        await stock.models.retrieve("add:9")
    r = await client.post("/v1/embeddings", json={"model": "nope", "input": "x"})
    assert r.status_code == 404
    assert _error(r)["code"] == "model_not_found"


@pytest.mark.asyncio(loop_scope="module")
async def test_bad_requests_get_the_openai_error_object_with_a_4xx(
    plain: tuple[App, httpx.AsyncClient, openai.AsyncOpenAI],
) -> None:
    _, client, stock = plain
    malformed: Any = [{"role": "user"}]  # no content: malformed on purpose
    with pytest.raises(openai.BadRequestError) as info:
        await stock.chat.completions.create(model="add", messages=malformed)
    assert info.value.status_code == 400
    assert info.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as info:
        await stock.completions.create(model="add", prompt="hi", n=17)  # at most 16
    assert info.value.param == "n"
    cases = [
        ("/v1/chat/completions", b'{"model": "add", "messages": ['),  # not JSON
        ("/v1/chat/completions", b"[]"),  # not an object
        ("/v1/chat/completions", b'{"model": "add", "messages": [], "stream": true}'),
        ("/v1/completions", b'{"model": "add", "prompt": "x", "tools_x": 1}'),
        ("/v1/completions", b'{"model": "add", "prompt": "x", "max_tokens": -1}'),
        ("/v1/embeddings", b'{"model": "add", "input": [[1, 2]]}'),
    ]
    for path, body in cases:
        r = await client.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, (path, body, r.text)
        error = _error(r)
        assert error["type"] == "invalid_request_error"
        assert error["code"] == "invalid_input"
    # A model that is not an embedding model: refused, naming the model.
    r = await client.post("/v1/embeddings", json={"model": "add", "input": "x"})
    assert r.status_code == 400, r.text
    assert _error(r)["param"] == "model"
    # Unknown routes and methods under /v1 answer in OpenAI's shape too.
    r = await client.post("/v1/responses", json={})
    assert r.status_code == 404
    _error(r)
    r = await client.get("/v1/completions")
    assert r.status_code == 405
    _error(r)
    # And the server still serves.
    assert (await client.get("/v2/health/ready")).status_code == 200


async def test_v1_routes_are_data_plane_routes_with_bounded_bodies(
    model_root: Path, tmp_path: Path
) -> None:
    security = {"management_token": "mgmt-token-for-openai-tests", "data_token": DATA_TOKEN}
    server = _server(model_root, tmp_path, security=security, max_request_mb=1)
    async with server as (app, client, stock):
        assert [m.id for m in (await stock.models.list()).data] == ["add"]
        anonymous = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{app.http_port}/v1", api_key="wrong", max_retries=0
        )
        try:
            with pytest.raises(openai.PermissionDeniedError) as denied:
                await anonymous.models.list()
            assert denied.value.code == "permission_denied"
        finally:
            await anonymous.close()
        r = await client.post("/v1/chat/completions", json={})
        assert r.status_code == 401
        assert _error(r)["type"] == "authentication_error"
        assert r.headers["www-authenticate"].startswith("Bearer")
        # Prompts count against max_request_mb, refused in OpenAI's shape too.
        body = {"model": "add", "prompt": "x" * (1 << 20)}
        r = await client.post(
            "/v1/completions", json=body, headers={"authorization": f"Bearer {DATA_TOKEN}"}
        )
        assert r.status_code == 413
        assert _error(r)["code"] == "payload_too_large"
