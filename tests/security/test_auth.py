"""Bearer-token authentication, per plane, over REST and gRPC on real servers.

One server with both tokens (and ``protect_metrics``) answers the route table over
both transports: no token → 401 / UNAUTHENTICATED, a wrong one → 403 /
PERMISSION_DENIED, the plane's token → served; after every refusal a good request
still succeeds. Further servers cover the optional data plane, tokens from the
environment and from files, the refusal to serve unprotected on a non-loopback
address, and tokens never reaching logs or ``/v2/stats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import pytest_asyncio

from modelyard.app import App, StartupError
from modelyard.config.settings import load_settings
from modelyard.frontends.grpc.convert import request_to_proto
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from modelyard.protocol.types import InferInput, InferRequest
from tests.servers import running_server, write_config

pytestmark = pytest.mark.asyncio(loop_scope="module")

MANAGEMENT = "mgmt-" + secrets.token_urlsafe(24)
DATA = "data-" + secrets.token_urlsafe(24)
WRONG = "wrong-" + secrets.token_urlsafe(24)
ADDED = [2.0, 3.0, 4.0, 5.0]
"""What ``add`` (its latest version adds 2) answers to INFER_BODY."""
MODELS = [{"name": "add", "path": "add", "preload": True, "isolation": "inline"}]
INFER_BODY = {
    "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [0, 1, 2, 3]}]
}


def bearer(token: str) -> dict[str, str]:
    """The ``Authorization`` header carrying ``token``."""
    return {"authorization": f"Bearer {token}"}


def grpc_bearer(token: str) -> tuple[tuple[str, str], ...]:
    """The ``authorization`` call metadata carrying ``token``."""
    return (("authorization", f"Bearer {token}"),)


@dataclass(frozen=True)
class RestCall:
    method: str
    path: str
    plane: str
    body: object = None


REST_CALLS = {
    "live": RestCall("GET", "/v2/health/live", "open"),
    "ready": RestCall("GET", "/v2/health/ready", "open"),
    "server-metadata": RestCall("GET", "/v2", "open"),
    "dashboard-page": RestCall("GET", "/dashboard", "open"),
    "infer": RestCall("POST", "/v2/models/add/infer", "data", INFER_BODY),
    "infer-version": RestCall("POST", "/v2/models/add/versions/2/infer", "data", INFER_BODY),
    "predict": RestCall(
        "POST", "/predict", "data", {"model": "add", "inputs": {"input": [1, 2, 3, 4]}}
    ),
    "model-metadata": RestCall("GET", "/v2/models/add", "data"),
    "model-version-metadata": RestCall("GET", "/v2/models/add/versions/2", "data"),
    "model-ready": RestCall("GET", "/v2/models/add/ready", "data"),
    "repository-index": RestCall("POST", "/v2/repository/index", "management", {}),
    "repository-load": RestCall("POST", "/v2/repository/models/add/load", "management", {}),
    "pin": RestCall("POST", "/v2/repository/models/add/pin", "management"),
    "unpin": RestCall("POST", "/v2/repository/models/add/unpin", "management"),
    "aliases": RestCall("GET", "/v2/repository/models/add/aliases", "management"),
    "set-alias": RestCall(
        "PUT", "/v2/repository/models/add/aliases/default", "management", {"version": "2"}
    ),
    "stats": RestCall("GET", "/v2/stats", "management"),
    "stats-timeseries": RestCall("GET", "/v2/stats/timeseries", "management"),
    "health-details": RestCall("GET", "/v2/health/details", "management"),
    "metrics": RestCall("GET", "/metrics", "management"),  # protect_metrics is on here
}


@dataclass(frozen=True)
class Guarded:
    """A running server with both tokens, and clients for both transports."""

    app: App
    client: httpx.AsyncClient
    stub: pb_grpc.GRPCInferenceServiceStub


def _stub(channel: grpc.aio.Channel) -> pb_grpc.GRPCInferenceServiceStub:
    return pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]  # generated


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def guarded(
    model_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Guarded]:
    security = {"management_token": MANAGEMENT, "data_token": DATA, "protect_metrics": True}
    cfg = write_config(
        tmp_path_factory.mktemp("guarded"),
        MODELS,
        model_repository=str(model_root),
        security=security,
    )
    async with contextlib.AsyncExitStack() as stack:
        app, client = await stack.enter_async_context(running_server(cfg, grpc=True))
        channel = await stack.enter_async_context(
            grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")
        )
        yield Guarded(app, client, _stub(channel))


async def _rest(client: httpx.AsyncClient, call: RestCall, token: str | None) -> httpx.Response:
    headers = bearer(token) if token is not None else {}
    return await client.request(call.method, call.path, json=call.body, headers=headers)


async def _good_infer(client: httpx.AsyncClient, token: str | None = DATA) -> None:
    """A good inference request succeeds (the server kept serving after a refusal)."""
    r = await client.post(
        "/v2/models/add/infer", json=INFER_BODY, headers=bearer(token) if token else {}
    )
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == ADDED


def _assert_refused(r: httpx.Response, status: int) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert isinstance(error, str)
    assert error
    for token in (MANAGEMENT, DATA, WRONG):
        assert token not in r.text
    if status == 401:
        assert r.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize("name", list(REST_CALLS), ids=list(REST_CALLS))
async def test_rest_route_by_token(guarded: Guarded, name: str) -> None:
    call = REST_CALLS[name]
    client = guarded.client
    if call.plane == "open":
        for token in (None, WRONG):
            r = await _rest(client, call, token)
            assert r.status_code == 200, (token, r.text)
        return
    _assert_refused(await _rest(client, call, None), 401)
    await _good_infer(client)
    _assert_refused(await _rest(client, call, WRONG), 403)
    await _good_infer(client)
    granted = [MANAGEMENT] if call.plane == "management" else [DATA, MANAGEMENT]
    for token in granted:
        r = await _rest(client, call, token)
        assert r.status_code == 200, (token[:4], r.text)
    if call.plane == "management":
        # The data token opens the data plane only.
        _assert_refused(await _rest(client, call, DATA), 403)
        await _good_infer(client)


@pytest.mark.parametrize(
    "header",
    ["Basic dXNlcjpwYXNz", "Bearer", MANAGEMENT, f"Token {MANAGEMENT}"],
    ids=["basic", "bearer-alone", "no-scheme", "other-scheme"],
)
async def test_rest_without_a_bearer_token_is_unauthenticated(
    guarded: Guarded, header: str
) -> None:
    r = await guarded.client.post(
        "/v2/repository/index", json={}, headers={"authorization": header}
    )
    _assert_refused(r, 401)
    await _good_infer(guarded.client)


async def test_rest_bearer_scheme_is_case_insensitive(guarded: Guarded) -> None:
    r = await guarded.client.post(
        "/v2/repository/index", json={}, headers={"authorization": f"bearer {MANAGEMENT}"}
    )
    assert r.status_code == 200, r.text


async def test_rest_unknown_route_is_management(guarded: Guarded) -> None:
    _assert_refused(await guarded.client.get("/v2/secret-admin-thing"), 401)
    r = await guarded.client.get("/v2/secret-admin-thing", headers=bearer(MANAGEMENT))
    assert r.status_code == 404


async def test_rest_refusal_before_body_is_read(guarded: Guarded) -> None:
    # A refused request is answered without its (large) body being taken.
    body = b"x" * (4 * 1024 * 1024)
    r = await guarded.client.post("/v2/repository/models/add/load", content=body)
    _assert_refused(r, 401)
    await _good_infer(guarded.client)


# ----------------------------------------------------------------------------- gRPC


def _infer_request() -> pb.ModelInferRequest:
    req = InferRequest(
        model_name="add",
        model_version=None,
        inputs=[InferInput("input", "FP32", (1, 4), np.arange(4, dtype=np.float32).reshape(1, 4))],
    )
    return request_to_proto(req)


GrpcCall = Callable[[pb_grpc.GRPCInferenceServiceStub, Any], Awaitable[object]]


async def _stream_infer(stub: pb_grpc.GRPCInferenceServiceStub, metadata: Any) -> object:
    """One request on a ``ModelStreamInfer`` stream; its one answer (an error in the
    stream would be a failure: the token check happens before, on the call)."""
    call = stub.ModelStreamInfer(iter([_infer_request()]), metadata=metadata)
    answers = [answer async for answer in call]
    assert [a.error_message for a in answers] == [""]
    return answers


GRPC_CALLS: dict[str, tuple[str, GrpcCall]] = {
    "ServerLive": ("open", lambda s, md: s.ServerLive(pb.ServerLiveRequest(), metadata=md)),
    "ServerReady": ("open", lambda s, md: s.ServerReady(pb.ServerReadyRequest(), metadata=md)),
    "ServerMetadata": (
        "open",
        lambda s, md: s.ServerMetadata(pb.ServerMetadataRequest(), metadata=md),
    ),
    "ModelInfer": ("data", lambda s, md: s.ModelInfer(_infer_request(), metadata=md)),
    "ModelStreamInfer": ("data", _stream_infer),
    "ModelMetadata": (
        "data",
        lambda s, md: s.ModelMetadata(pb.ModelMetadataRequest(name="add"), metadata=md),
    ),
    "ModelReady": (
        "data",
        lambda s, md: s.ModelReady(pb.ModelReadyRequest(name="add"), metadata=md),
    ),
    "ModelStatistics": (
        "data",
        lambda s, md: s.ModelStatistics(pb.ModelStatisticsRequest(name="add"), metadata=md),
    ),
    "ModelConfig": (
        "data",
        lambda s, md: s.ModelConfig(pb.ModelConfigRequest(name="add"), metadata=md),
    ),
    "LogSettings": (
        "management",
        lambda s, md: s.LogSettings(pb.LogSettingsRequest(), metadata=md),
    ),
    "RepositoryIndex": (
        "management",
        lambda s, md: s.RepositoryIndex(pb.RepositoryIndexRequest(), metadata=md),
    ),
    "RepositoryModelLoad": (
        "management",
        lambda s, md: s.RepositoryModelLoad(
            pb.RepositoryModelLoadRequest(model_name="add"), metadata=md
        ),
    ),
    "RepositoryModelUnload": (
        "management",
        # An unknown model: authorised, the call reaches the data plane and says NOT_FOUND.
        lambda s, md: s.RepositoryModelUnload(
            pb.RepositoryModelUnloadRequest(model_name="no-such-model"), metadata=md
        ),
    ),
}


async def _grpc_code(
    stub: pb_grpc.GRPCInferenceServiceStub, call: GrpcCall, token: str | None
) -> grpc.StatusCode:
    try:
        await call(stub, grpc_bearer(token) if token is not None else None)
    except grpc.aio.AioRpcError as exc:
        details, code = exc.details() or "", exc.code()
    else:
        return grpc.StatusCode.OK
    for secret in (MANAGEMENT, DATA, WRONG):
        assert secret not in details
    return code


async def _good_grpc_infer(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    response = await stub.ModelInfer(_infer_request(), metadata=grpc_bearer(DATA))
    assert np.frombuffer(response.raw_output_contents[0], dtype="<f4").tolist() == ADDED


@pytest.mark.parametrize("name", list(GRPC_CALLS), ids=list(GRPC_CALLS))
async def test_grpc_rpc_by_token(guarded: Guarded, name: str) -> None:
    plane, call = GRPC_CALLS[name]
    stub = guarded.stub
    ok = grpc.StatusCode.NOT_FOUND if name == "RepositoryModelUnload" else grpc.StatusCode.OK
    if plane == "open":
        assert await _grpc_code(stub, call, None) is ok
        assert await _grpc_code(stub, call, WRONG) is ok
        return
    assert await _grpc_code(stub, call, None) is grpc.StatusCode.UNAUTHENTICATED
    await _good_grpc_infer(stub)
    assert await _grpc_code(stub, call, WRONG) is grpc.StatusCode.PERMISSION_DENIED
    await _good_grpc_infer(stub)
    granted = [MANAGEMENT] if plane == "management" else [DATA, MANAGEMENT]
    for token in granted:
        assert await _grpc_code(stub, call, token) is ok, token[:4]
    if plane == "management":
        assert await _grpc_code(stub, call, DATA) is grpc.StatusCode.PERMISSION_DENIED
        await _good_grpc_infer(stub)


async def test_grpc_other_scheme_is_unauthenticated(guarded: Guarded) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await guarded.stub.RepositoryIndex(
            pb.RepositoryIndexRequest(), metadata=(("authorization", MANAGEMENT),)
        )
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
    await _good_grpc_infer(guarded.stub)


async def test_tokens_never_in_stats_or_details(guarded: Guarded) -> None:
    for path in ("/v2/stats", "/v2/health/details", "/metrics"):
        r = await guarded.client.get(path, headers=bearer(MANAGEMENT))
        assert r.status_code == 200, path
        for token in (MANAGEMENT, DATA):
            assert token not in r.text, path
    assert MANAGEMENT not in repr(guarded.app.settings)
    assert MANAGEMENT not in repr(guarded.app.authorizer)


# ----------------------------------------------------------------------------- other setups


async def test_data_plane_optional_token_from_env(
    model_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only a management token (from the environment): inference needs none, the
    management plane does, ``/metrics`` is open, and the token is never logged."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("MODELYARD_SECURITY__MANAGEMENT_TOKEN", MANAGEMENT)
    cfg = write_config(tmp_path, MODELS, model_repository=str(model_root))
    async with contextlib.AsyncExitStack() as stack:
        app, client = await stack.enter_async_context(running_server(cfg, grpc=True))
        channel = await stack.enter_async_context(
            grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")
        )
        stub = _stub(channel)
        await _good_infer(client, token=None)
        r = await client.post("/predict", json={"model": "add", "inputs": {"input": [1, 2, 3, 4]}})
        assert r.status_code == 200, r.text
        assert (await client.get("/v2/models/add")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        await stub.ModelInfer(_infer_request())
        _assert_refused(await client.post("/v2/repository/index", json={}), 401)
        r = await client.post("/v2/repository/index", json={}, headers=bearer(WRONG))
        _assert_refused(r, 403)
        r = await client.post("/v2/repository/index", json={}, headers=bearer(MANAGEMENT))
        assert r.status_code == 200
        assert [row["name"] for row in r.json()] == ["add"]
        index = GRPC_CALLS["RepositoryIndex"][1]
        assert await _grpc_code(stub, index, None) is grpc.StatusCode.UNAUTHENTICATED
        assert await _grpc_code(stub, index, MANAGEMENT) is grpc.StatusCode.OK
        await _good_infer(client, token=None)
    assert "authentication" in caplog.text  # start-up says what is protected…
    assert MANAGEMENT not in caplog.text  # …and never with what
    assert WRONG not in caplog.text


async def test_tokens_from_files(model_root: Path, tmp_path: Path) -> None:
    # Relative paths are taken from the YAML's folder; the trailing newline is not the token's.
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "management").write_text(MANAGEMENT + "\n", encoding="utf-8")
    (tmp_path / "secrets" / "data").write_text(f"  {DATA}\n", encoding="utf-8")
    security = {
        "management_token_file": "secrets/management",
        "data_token_file": "secrets/data",
        "protect_metrics": True,
    }
    cfg = write_config(tmp_path, MODELS, model_repository=str(model_root), security=security)
    async with running_server(cfg) as (_, client):
        _assert_refused(await client.get("/metrics"), 401)
        assert (await client.get("/metrics", headers=bearer(MANAGEMENT))).status_code == 200
        _assert_refused(await client.get("/v2/models/add/ready"), 401)
        await _good_infer(client, token=DATA)
        await _good_infer(client, token=MANAGEMENT)
        r = await client.get("/v2/stats", headers=bearer(DATA))
        _assert_refused(r, 403)


async def test_unreadable_token_file_stops_start(model_root: Path, tmp_path: Path) -> None:
    security = {"management_token_file": "missing-token"}
    cfg = write_config(tmp_path, MODELS, model_repository=str(model_root), security=security)
    with pytest.raises(StartupError, match=r"security\.management_token_file: cannot read"):
        async with running_server(cfg):
            pass


async def test_refuses_non_loopback_without_management_token(
    model_root: Path, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path, MODELS, model_repository=str(model_root))
    settings = load_settings(cfg, host="0.0.0.0", http_port=0, grpc_port=0)
    app = App(settings)
    with pytest.raises(StartupError) as caught:
        await app.start()
    message = str(caught.value)
    assert "security.management_token" in message
    assert "allow_unauthenticated_remote" in message
    assert "0.0.0.0" in message
    assert app.http_port is None  # nothing was bound


async def test_opt_out_serves_non_loopback_unprotected(model_root: Path, tmp_path: Path) -> None:
    security = {"allow_unauthenticated_remote": True}
    cfg = write_config(tmp_path, MODELS, model_repository=str(model_root), security=security)
    app = App(load_settings(cfg, host="0.0.0.0", http_port=0, grpc_port=None))
    await app.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{app.http_port}") as client:
            r = await client.post("/v2/repository/index", json={})
            assert r.status_code == 200
    finally:
        await app.stop()


async def test_non_loopback_with_management_token_starts_protected(
    model_root: Path, tmp_path: Path
) -> None:
    security = {"management_token": MANAGEMENT}
    cfg = write_config(tmp_path, MODELS, model_repository=str(model_root), security=security)
    app = App(load_settings(cfg, host="0.0.0.0", http_port=0, grpc_port=None))
    await app.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{app.http_port}") as client:
            _assert_refused(await client.post("/v2/repository/index", json={}), 401)
            r = await client.post("/v2/repository/index", json={}, headers=bearer(MANAGEMENT))
            assert r.status_code == 200
    finally:
        await app.stop()


@pytest.mark.slow  # a fresh interpreter importing the server: seconds
async def test_serve_command_refuses_non_loopback_without_token(tmp_path: Path) -> None:
    """``modelyard serve --host 0.0.0.0`` exits at once with the setting to fix."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELYARD_")}
    argv = ["serve", "--host", "0.0.0.0", "--http-port", "0", "--grpc-port", "0"]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "modelyard.cli",
        *argv,
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(120):
        _, stderr = await process.communicate()
    assert process.returncode == 1
    assert "security.management_token" in stderr.decode()
