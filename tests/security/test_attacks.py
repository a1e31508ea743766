"""The attacks of issue 12, replayed against a real server over REST and gRPC.

Each row of ``ATTACKS`` is one probe an attacker who can reach the ports would try:
the load configs that ran code or filled the budget, traversal in names and paths
(plain and percent-encoded), a symlink out of the repository, ``/proc`` as a path,
long names and oversized management bodies. Every row asserts the status and the
error body, that no registration was left behind, that no absolute path leaked,
and that the server still answers a good request afterwards, on both transports.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import shutil
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import pytest_asyncio

from modelyard.app import App
from modelyard.examples.mlp import build_add_onnx
from modelyard.frontends.grpc.convert import request_to_proto, response_from_proto
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from modelyard.protocol.types import InferInput, InferRequest
from tests.servers import running_server, write_config

pytestmark = pytest.mark.asyncio(loop_scope="module")

BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}
PINNED_LOADS = 36

EVIL_MODEL = """
import numpy as np
from modelyard.runtimes.base import TensorSpec


class Evil:
    inputs = [TensorSpec("x", "FP32", (-1, 1))]
    outputs = [TensorSpec("y", "BYTES", (-1,))]

    def load(self, version_dir):
        with open("/etc/passwd", "rb") as f:
            self.secret = f.read()

    def predict(self, inputs):
        return {"y": np.array([self.secret], dtype=object)}
"""


class _Payload:
    """Unpickling this creates ``marker``: proof that a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


@dataclass
class Site:
    """The repository on disk, the folder outside it, and the running server."""

    tmp: Path
    root: Path
    outside: Path
    marker: Path
    app: App | None = None
    client: httpx.AsyncClient | None = None
    stub: Any = None
    declared: tuple[str, ...] = field(default_factory=tuple)

    @property
    def http(self) -> httpx.AsyncClient:
        assert self.client is not None
        return self.client

    @property
    def server(self) -> App:
        assert self.app is not None
        return self.app


def _build(tmp: Path) -> Site:
    root = tmp / "repo"
    outside = tmp / "outside"
    marker = tmp / "pickle-ran"
    build_add_onnx(root / "add" / "1" / "model.onnx", 1.0)
    build_add_onnx(root / "add2" / "1" / "model.onnx", 100.0)
    for i in range(PINNED_LOADS):
        shutil.copytree(root / "add2", root / f"m{i}")
    (root / "identity" / "1").mkdir(parents=True)
    (root / "corrupt" / "1").mkdir(parents=True)
    (root / "corrupt" / "1" / "model.onnx").write_bytes(b"this is not an onnx file")
    (root / "pickled" / "1").mkdir(parents=True)
    (root / "pickled" / "1" / "model.pkl").write_bytes(pickle.dumps(_Payload(marker)))
    (outside / "1").mkdir(parents=True)
    (outside / "1" / "evil.py").write_text(EVIL_MODEL, encoding="utf-8")
    # A folder of the repository that is a symlink to the outside folder.
    (root / "escape").symlink_to(outside, target_is_directory=True)
    # A model folder inside the repository whose version folder links outside.
    (root / "vlink").mkdir()
    (root / "vlink" / "1").symlink_to(outside / "1", target_is_directory=True)
    return Site(tmp=tmp, root=root, outside=outside, marker=marker)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def site(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Site]:
    """One server on a repository built for the attacks (gRPC on)."""
    s = _build(tmp_path_factory.mktemp("attacks"))
    models = [{"name": "add", "path": "add", "isolation": "inline"}]
    cfg = write_config(s.tmp, models, model_repository=str(s.root))
    async with running_server(cfg, grpc=True) as (app, client):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")
        s.app, s.client, s.declared = app, client, ("add",)
        s.stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            yield s
        finally:
            await channel.close(None)


# ---------------------------------------------------------------------- probes


async def raw_http(port: int, head: str, body: bytes = b"") -> tuple[int, dict[str, Any]]:
    """Send one request exactly as written (no URL normalisation); status and JSON body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.encode("latin-1") + body)
        await writer.drain()
        response = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    status_line, _, rest = response.partition(b"\r\n")
    payload = rest.partition(b"\r\n\r\n")[2]
    return int(status_line.split()[1]), json.loads(payload) if payload else {}


def load_head(port: int, path: str, length: int, method: str = "POST") -> str:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
    )


@dataclass(frozen=True)
class Attack:
    """One probe: a load (name and config), an infer by name, or a raw REST request."""

    id: str
    kind: str  # "load", "infer" or "raw"
    name: str = ""
    config: dict[str, Any] | None = None
    raw_path: str = ""
    raw_body: bytes = b""
    raw_method: str = "POST"
    declared_length: int | None = None
    status: int = 400
    grpc_code: grpc.StatusCode | None = grpc.StatusCode.INVALID_ARGUMENT
    error: str = ""
    rest_status: int | None = None
    """Where the URL itself refuses it over REST (a slash in a name: no such route)."""
    rest_error: str | None = None

    def __str__(self) -> str:
        return self.id


ATTACKS = [
    Attack(
        "os-abort-via-remote-config",
        "load",
        "boom",
        {"path": "identity", "runtime": "python", "class": "os:abort", "isolation": "inline"},
        error="remote_load.allow_code",
    ),
    Attack(
        "absolute-path-with-python-code",
        "load",
        "evil",
        {"path": "<outside>", "runtime": "python", "class": "evil:Evil"},
        error="absolute paths are not allowed",
    ),
    Attack(
        "dotdot-path-with-python-code",
        "load",
        "evil",
        {"path": "../outside", "runtime": "python", "class": "evil:Evil"},
        error="resolves outside the model repository",
    ),
    Attack(
        "trusted-pickle",
        "load",
        "pickled",
        {"runtime": "sklearn", "trusted": True},
        error="remote_load.allow_trusted",
    ),
    Attack(
        "reconfigure-declared-model-with-another-path",
        "load",
        "add",
        {"path": "add2"},
        error="remote_load.allow_reconfigure_declared",
    ),
    Attack(
        "pinned-priority-1",
        "load",
        "m0",
        {"pinned": True, "priority": 1},
        error="remote_load.allow_pinned",
    ),
    Attack("priority-above-floor", "load", "m1", {"priority": 2}, error="remote_load.min_priority"),
    Attack(
        "another-folder-of-the-repository",
        "load",
        "boom",
        {"path": "add2"},
        error="remote_load.allow_other_folder",
    ),
    Attack(
        "encoded-dotdot-in-path",
        "load",
        "boom",
        {"path": "..%2F..%2Fetc"},
        error="remote_load.allow_other_folder",
    ),
    Attack(
        "dotdot-in-path",
        "load",
        "boom",
        {"path": "../../../../../../etc"},
        error="outside the model repository",
    ),
    Attack("proc-self-as-path", "load", "boom", {"path": "/proc/self"}, error="absolute paths"),
    Attack(
        "proc-self-through-dotdot",
        "load",
        "boom",
        {"path": "../../../../../../../proc/self"},
        error="outside the model repository",
    ),
    Attack(
        "symlink-escape-by-name",
        "load",
        "escape",
        None,
        error="outside the model repository",
    ),
    Attack(
        "symlink-escape-by-path",
        "load",
        "boom",
        {"path": "escape/../escape"},
        error="outside the model repository",
    ),
    Attack(
        "symlinked-version-folder",
        "load",
        "vlink",
        {"runtime": "onnx"},
        error="outside the model repository",
    ),
    Attack("unknown-config-field", "load", "boom", {"shell": "sh"}, error="cannot be set"),
    Attack(
        "runtime-options",
        "load",
        "m2",
        {"options": {"inputs": "x:FP32:-1x4"}},
        error="remote_load.allow_runtime_options",
    ),
    Attack("unknown-device", "load", "m3", {"device": "cuda:7"}, error="does not have"),
    Attack(
        "a-thread-per-request-worth-of-threads",
        "load",
        "m2",
        {"intra_op_threads": 100_000},
        error="'intra_op_threads' over",
    ),
    Attack("a-queue-the-size-of-ram", "load", "m2", {"max_queue_size": 10**9}, error="queue"),
    Attack(
        "default-version-that-does-not-exist",
        "load",
        "m4",
        {"default_version": "99"},
        status=404,
        grpc_code=grpc.StatusCode.NOT_FOUND,
        error="no version '99'",
    ),
    Attack("dotdot-as-model-name", "load", "..", error="is not allowed"),
    Attack(
        "traversal-in-model-name",
        "load",
        "../../etc",
        error="is not allowed",
        rest_status=404,
        rest_error="no route",
    ),
    Attack("long-model-name-load", "load", "a" * 200, error="at most 128"),
    Attack("long-model-name-infer", "infer", "a" * 200, error="at most 128"),
    Attack("traversal-in-infer-name", "infer", "..", error="is not allowed"),
    Attack(
        "missing-folder",
        "load",
        "nowhere",
        status=404,
        grpc_code=grpc.StatusCode.NOT_FOUND,
        error="not in the repository",
    ),
    Attack(
        "load-failure-of-a-discovered-model",
        "load",
        "corrupt",
        status=503,
        grpc_code=grpc.StatusCode.UNAVAILABLE,
        error="failed to load",
    ),
    # REST only: what the URL itself can carry.
    Attack(
        "encoded-dotdot-in-url",
        "raw",
        raw_path="/v2/repository/models/%2E%2E/load",
        grpc_code=None,
        error="is not allowed",
    ),
    Attack(
        "encoded-slashes-in-url",
        "raw",
        raw_path="/v2/repository/models/..%2F..%2Fetc/load",
        status=404,
        grpc_code=None,
        error="no route",
    ),
    Attack(
        "encoded-dotdot-in-ready-url",
        "raw",
        raw_path="/v2/models/%2E%2E/ready",
        raw_method="GET",
        grpc_code=None,
        error="is not allowed",
    ),
    Attack(
        "long-name-in-metadata-url",
        "raw",
        raw_path="/v2/models/" + "a" * 200,
        raw_method="GET",
        grpc_code=None,
        error="at most 128",
    ),
    Attack(
        "traversal-in-predict-body",
        "raw",
        raw_path="/predict",
        raw_body=b'{"model": "../../etc", "inputs": {"input": [[0, 0, 0, 0]]}}',
        grpc_code=None,
        error="is not allowed",
    ),
    Attack(
        "traversal-in-alias-url",
        "raw",
        raw_path="/v2/repository/models/%2E%2E/aliases/blue",
        raw_body=b'{"version": "1"}',
        grpc_code=None,
        error="is not allowed",
    ),
    Attack(
        "300-MB-alias-body-declared",
        "raw",
        raw_path="/v2/repository/models/add/aliases/blue",
        declared_length=300 * 1024 * 1024,
        status=413,
        grpc_code=None,
        error="max_control_body_mb",
    ),
    Attack(
        "2-MB-load-body",
        "raw",
        raw_path="/v2/repository/models/add/load",
        declared_length=2 << 20,
        status=413,
        grpc_code=None,
        error="max_control_body_mb",
    ),
]


def _config(site: Site, attack: Attack) -> dict[str, Any] | None:
    if attack.config is None:
        return None
    return {k: str(site.outside) if v == "<outside>" else v for k, v in attack.config.items()}


async def _rest(site: Site, attack: Attack) -> tuple[int, str]:
    port = site.server.http_port
    assert port is not None
    if attack.kind == "raw":
        body = attack.raw_body
        length = attack.declared_length or len(body)
        head = load_head(port, attack.raw_path, length, attack.raw_method)
        status, doc = await raw_http(port, head, body)
        return status, str(doc.get("error", ""))
    # Sent as written: a client library would normalise ".." away before sending.
    name = urllib.parse.quote(attack.name, safe="")
    if attack.kind == "load":
        config = _config(site, attack)
        body = json.dumps({} if config is None else {"parameters": {"config": config}}).encode()
        path = f"/v2/repository/models/{name}/load"
    else:
        body = json.dumps(BODY).encode()
        path = f"/v2/models/{name}/infer"
    status, doc = await raw_http(port, load_head(port, path, len(body)), body)
    return status, str(doc.get("error", ""))


async def _grpc(site: Site, attack: Attack) -> tuple[grpc.StatusCode, str]:
    try:
        if attack.kind == "load":
            request = pb.RepositoryModelLoadRequest(model_name=attack.name)
            config = _config(site, attack)
            if config is not None:
                request.parameters["config"].string_param = json.dumps(config)
            await site.stub.RepositoryModelLoad(request, timeout=60)
        else:
            await site.stub.ModelInfer(_grpc_request(attack.name), timeout=30)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def _grpc_request(name: str) -> pb.ModelInferRequest:
    x = np.zeros((1, 4), dtype=np.float32)
    tensor = InferInput("input", "FP32", (1, 4), x)
    return request_to_proto(InferRequest(model_name=name, model_version=None, inputs=[tensor]))


async def assert_still_serving(site: Site) -> None:
    """The server is alive and the operator's model answers on both transports."""
    assert (await site.http.get("/v2/health/live")).status_code == 200
    r = await site.http.post("/v2/models/add/infer", json=BODY)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [1.0] * 4, "the declared model answers as declared"
    answer = response_from_proto(await site.stub.ModelInfer(_grpc_request("add"), timeout=30))
    assert answer.outputs[0].array.tolist() == [[1.0] * 4]


def assert_no_paths(site: Site, message: str) -> None:
    """Errors name paths relative to the repository, never the server's own layout."""
    assert str(site.root) not in message
    assert str(site.tmp) not in message
    assert "/etc/passwd" not in message


@pytest.mark.parametrize("attack", ATTACKS, ids=str)
async def test_attack_over_rest_is_refused(site: Site, attack: Attack) -> None:
    before = dict(site.server.manager.entries)
    status, error = await _rest(site, attack)
    assert status == (attack.rest_status or attack.status), error
    assert (attack.rest_error or attack.error) in error
    assert_no_paths(site, error)
    assert site.server.manager.entries == before, "a refused load left a registration"
    assert not site.marker.exists(), "the pickle ran"
    await assert_still_serving(site)


@pytest.mark.parametrize("attack", [a for a in ATTACKS if a.grpc_code is not None], ids=str)
async def test_attack_over_grpc_is_refused(site: Site, attack: Attack) -> None:
    before = dict(site.server.manager.entries)
    code, details = await _grpc(site, attack)
    assert code == attack.grpc_code, details
    assert attack.error in details
    assert_no_paths(site, details)
    assert site.server.manager.entries == before, "a refused load left a registration"
    assert not site.marker.exists(), "the pickle ran"
    await assert_still_serving(site)


@pytest.mark.parametrize("name", ["..", "../../etc", "a" * 200, "x/y", "%2E%2E"])
async def test_bad_names_in_grpc_metadata_and_ready_are_invalid_argument(
    site: Site, name: str
) -> None:
    for call in (
        site.stub.ModelReady(pb.ModelReadyRequest(name=name), timeout=10),
        site.stub.ModelMetadata(pb.ModelMetadataRequest(name=name), timeout=10),
        site.stub.RepositoryModelUnload(
            pb.RepositoryModelUnloadRequest(model_name=name), timeout=10
        ),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await assert_still_serving(site)


async def test_pinned_priority_one_loads_cannot_take_the_budget(site: Site) -> None:
    before = dict(site.server.manager.entries)
    config = {"pinned": True, "priority": 1}
    for i in range(PINNED_LOADS):
        r = await site.http.post(
            f"/v2/repository/models/m{i}/load", json={"parameters": {"config": config}}
        )
        assert r.status_code == 400, r.text
        assert "remote_load.allow_pinned" in r.json()["error"]
        assert "remote_load.min_priority" in r.json()["error"]
    assert site.server.manager.entries == before
    assert not any(r.pinned for r in site.server.manager.records())
    await assert_still_serving(site)


async def test_a_declared_model_unloaded_cannot_come_back_as_another(site: Site) -> None:
    assert (await site.http.post("/v2/repository/models/add/unload")).status_code == 200
    for config in ({"path": "add2"}, {"path": "add2", "runtime": "onnx"}, {"max_batch_size": 1}):
        r = await site.http.post(
            "/v2/repository/models/add/load", json={"parameters": {"config": config}}
        )
        assert r.status_code == 400, r.text
        assert "declared" in r.json()["error"]
    assert site.server.manager.entry("add").config.path == "add"
    # Loading it by name (no config) is the operator's own model again.
    assert (await site.http.post("/v2/repository/models/add/load")).status_code == 200
    await assert_still_serving(site)


async def test_an_undeclared_folder_still_loads_by_name_and_answers(site: Site) -> None:
    r = await site.http.post(
        "/v2/repository/models/add2/load",
        json={"parameters": {"config": {"max_batch_size": 2, "priority": 5}}},
    )
    assert r.status_code == 200, r.text
    r = await site.http.post("/v2/models/add2/infer", json=BODY)
    assert r.json()["outputs"][0]["data"] == [100.0] * 4
    assert (await site.http.post("/v2/repository/models/add2/unload")).status_code == 200
    await assert_still_serving(site)


async def test_a_chunked_admin_body_over_the_limit_is_refused(site: Site) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(64):
            yield b" " * 65536

    r = await site.http.post("/v2/repository/models/add/aliases/blue", content=chunks())
    assert r.status_code == 413
    assert "max_control_body_mb" in r.json()["error"]
    await assert_still_serving(site)


async def test_model_control_mode_none_refuses_load_and_unload(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    build_add_onnx(repo / "add" / "1" / "model.onnx", 1.0)
    build_add_onnx(repo / "other" / "1" / "model.onnx", 1.0)
    cfg = write_config(
        tmp_path,
        [{"name": "add", "path": "add", "isolation": "inline"}],
        model_repository=str(repo),
        model_control_mode="none",
    )
    async with running_server(cfg) as (app, client):
        for path in ("add/load", "add/unload", "other/load"):
            r = await client.post(f"/v2/repository/models/{path}")
            assert r.status_code == 501, r.text
            assert "model_control_mode" in r.json()["error"]
        assert set(app.manager.entries) == {"add"}
        assert (await client.post("/v2/models/add/infer", json=BODY)).status_code == 200


ECHO_MODEL = """
import numpy as np
from modelyard.runtimes.base import TensorSpec


class Echo:
    inputs = [TensorSpec("x", "FP32", (-1, 1))]
    outputs = [TensorSpec("y", "FP32", (-1, 1))]

    def predict(self, inputs):
        return {"y": inputs["x"]}
"""


@pytest.mark.asyncio(loop_scope="function")
async def test_each_power_is_granted_by_its_own_flag_and_never_leaves_the_repository(
    tmp_path: Path,
) -> None:
    s = _build(tmp_path)
    (s.root / "echo" / "1").mkdir(parents=True)
    (s.root / "echo" / "1" / "security_echo_model.py").write_text(ECHO_MODEL, encoding="utf-8")
    cfg = write_config(
        s.tmp,
        [{"name": "add", "path": "add", "isolation": "inline"}],
        model_repository=str(s.root),
        remote_load={"allow_code": True, "allow_inline": True, "allow_other_folder": True},
    )
    python = {"runtime": "python", "class": "security_echo_model:Echo", "isolation": "inline"}
    async with running_server(cfg) as (app, client):
        r = await client.post(
            "/v2/repository/models/echo/load", json={"parameters": {"config": python}}
        )
        assert r.status_code == 200, r.text
        x = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [7]}]}
        r = await client.post("/v2/models/echo/infer", json=x)
        assert r.json()["outputs"][0]["data"] == [7.0]
        # Another folder of the repository is allowed now; outside it never is.
        r = await client.post(
            "/v2/repository/models/other/load",
            json={"parameters": {"config": {**python, "path": "echo"}}},
        )
        assert r.status_code == 200, r.text
        for path in ("../outside", str(s.outside), "escape"):
            evil = {"path": path, "runtime": "python", "class": "evil:Evil"}
            r = await client.post(
                "/v2/repository/models/evil/load", json={"parameters": {"config": evil}}
            )
            assert r.status_code == 400, r.text
            assert_no_paths(s, r.json()["error"])
        # Flags not given stay off.
        r = await client.post(
            "/v2/repository/models/m0/load", json={"parameters": {"config": {"pinned": True}}}
        )
        assert r.status_code == 400
        assert "remote_load.allow_pinned" in r.json()["error"]
        assert "evil" not in app.manager.entries


@pytest.mark.asyncio(loop_scope="function")
async def test_remote_load_disabled_keeps_to_the_declared_models(tmp_path: Path) -> None:
    s = _build(tmp_path)
    cfg = write_config(
        s.tmp,
        [{"name": "add", "path": "add", "isolation": "inline"}],
        model_repository=str(s.root),
        remote_load={"enabled": False},
    )
    async with running_server(cfg) as (app, client):
        r = await client.post("/v2/repository/models/add2/load")
        assert r.status_code == 400
        assert "remote_load.enabled" in r.json()["error"]
        assert (await client.post("/v2/repository/models/add/load")).status_code == 200
        assert set(app.manager.entries) == {"add"}
