"""The KServe v2 REST API on a real server with real ONNX and scikit-learn models."""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from starlette.applications import Starlette

from modelyard.examples.sklearn_models import digits_data
from modelyard.frontends.http.app import RestApi
from tests.integration.conftest import python_model
from tests.servers import running_server, write_config

MODELS = [
    {"name": "digits-logreg", "path": "digits-logreg", "preload": True, "isolation": "inline"},
    {"name": "mlp", "path": "mlp", "isolation": "inline"},
    {"name": "add", "path": "add", "isolation": "inline", "version_policy": {"all": True}},
    {"name": "corrupt", "path": "corrupt", "isolation": "inline"},
    python_model("echo", "EchoModel", isolation="inline"),
]


@pytest.fixture
def config_file(model_root: Path, tmp_path: Path) -> Path:
    return write_config(tmp_path, MODELS, model_repository=str(model_root))


def _ort(path: Path, x: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [np.asarray(v) for v in sess.run(None, {sess.get_inputs()[0].name: x})]


async def test_health_and_server_metadata(config_file: Path) -> None:
    async with running_server(config_file) as (_, client):
        assert (await client.get("/v2/health/live")).status_code == 200
        assert (await client.get("/v2/health/ready")).status_code == 200
        meta = (await client.get("/v2")).json()
        assert meta["name"] == "modelyard"
        assert "model_repository" in meta["extensions"]
        details = (await client.get("/v2/health/details")).json()
        assert details["ready"] is True
        assert details["worker_memory_limits"] in ("cgroup2", "cgroup1", "rlimit")
        rows = {(m["name"], m["version"]): m for m in details["models"]}
        assert rows[("digits-logreg", "1")]["ready"] is True
        assert rows[("mlp", "1")]["state"] == "UNLOADED"


async def test_infer_equals_onnxruntime(config_file: Path, model_root: Path) -> None:
    x, _ = digits_data()
    batch = x[:5].astype(np.float32)
    label, proba = _ort(model_root / "digits-logreg" / "1" / "model.onnx", batch)
    async with running_server(config_file) as (_, client):
        body = {
            "id": "req-1",
            "inputs": [
                {
                    "name": "input",
                    "shape": [5, 64],
                    "datatype": "FP32",
                    "data": batch.ravel().tolist(),
                }
            ],
        }
        r = await client.post("/v2/models/digits-logreg/infer", json=body)
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["id"] == "req-1"
        assert doc["model_name"] == "digits-logreg"
        assert doc["model_version"] == "1"
        outs = {o["name"]: o for o in doc["outputs"]}
        assert outs["label"]["data"] == label.tolist()
        assert outs["label"]["datatype"] == "INT64"
        np.testing.assert_allclose(
            np.array(outs["probabilities"]["data"]).reshape(proba.shape), proba, rtol=1e-6
        )


async def test_binary_tensor_extension(config_file: Path, model_root: Path) -> None:
    x = np.random.default_rng(1).random((3, 64), dtype=np.float32)
    (expected,) = _ort(model_root / "mlp" / "1" / "model.onnx", x)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": [3, 64],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    ).encode()
    async with running_server(config_file) as (_, client):
        r = await client.post(
            "/v2/models/mlp/infer",
            content=header + x.tobytes(),
            headers={"Inference-Header-Content-Length": str(len(header))},
        )
        assert r.status_code == 200, r.text
        n = int(r.headers["inference-header-content-length"])
        doc = json.loads(r.content[:n])
        out = doc["outputs"][0]
        assert out["parameters"]["binary_data_size"] == expected.nbytes
        got = np.frombuffer(r.content[n:], dtype=np.float32).reshape(out["shape"])
        np.testing.assert_allclose(got, expected, rtol=1e-5)


async def test_cold_model_loads_on_first_request(config_file: Path) -> None:
    async with running_server(config_file) as (app, client):
        index = (await client.post("/v2/repository/index", json={})).json()
        states = {(r["name"], r["version"]): r["state"] for r in index}
        assert states[("digits-logreg", "1")] == "READY"
        assert states[("mlp", "1")] == "UNLOADED"
        assert (await client.get("/v2/models/mlp/ready")).status_code == 400
        x = [0.5] * 64
        r = await client.post(
            "/v2/models/mlp/infer",
            json={"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": x}]},
        )
        assert r.status_code == 200, r.text
        assert (await client.get("/v2/models/mlp/ready")).status_code == 200
        record = app.manager.resolve("mlp", None)
        assert record.stats.loads == 1
        assert record.stats.cold_starts == 1


async def test_concurrent_first_requests_cause_one_load(config_file: Path) -> None:
    body = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.1] * 64}]}
    async with running_server(config_file) as (app, client):
        results = await asyncio.gather(
            *(client.post("/v2/models/mlp/infer", json=body) for _ in range(20))
        )
        assert [r.status_code for r in results] == [200] * 20
        outputs = {json.dumps(r.json()["outputs"]) for r in results}
        assert len(outputs) == 1
        assert app.manager.resolve("mlp", None).stats.loads == 1


async def test_repository_load_unload_and_index(config_file: Path) -> None:
    async with running_server(config_file) as (_, client):
        r = await client.post("/v2/repository/models/mlp/load", json={})
        assert r.status_code == 200, r.text
        ready = (await client.post("/v2/repository/index", json={"ready": True})).json()
        assert {"mlp", "digits-logreg"} <= {row["name"] for row in ready}
        r = await client.post("/v2/repository/models/mlp/unload", json={})
        assert r.status_code == 200
        index = (await client.post("/v2/repository/index", json={})).json()
        mlp = next(row for row in index if row["name"] == "mlp")
        assert mlp["state"] == "UNLOADED"
        assert (await client.get("/v2/models/mlp/ready")).status_code == 400
        # And it loads again without a restart.
        assert (await client.post("/v2/repository/models/mlp/load", json={})).status_code == 200
        assert (await client.get("/v2/models/mlp/ready")).status_code == 200


async def test_versions_by_path(config_file: Path) -> None:
    body = {
        "inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]
    }
    async with running_server(config_file) as (_, client):
        v1 = (await client.post("/v2/models/add/versions/1/infer", json=body)).json()
        v2 = (await client.post("/v2/models/add/versions/2/infer", json=body)).json()
        default = (await client.post("/v2/models/add/infer", json=body)).json()
        assert v1["outputs"][0]["data"] == [1.0] * 4
        assert v2["outputs"][0]["data"] == [2.0] * 4
        assert default["model_version"] == "2"
        meta = (await client.get("/v2/models/add")).json()
        assert meta["versions"] == ["1", "2"]
        assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}]


async def test_starlette_infer_routes_answer_as_the_fast_path(config_file: Path) -> None:
    """The Starlette infer routes (reached when the fast path declines) run the same
    handler: same body, same headers, same errors."""
    body = {
        "inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]
    }
    bad = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0]}]}
    async with running_server(config_file) as (app, client):
        routed = Starlette(routes=RestApi(app.dataplane, 1 << 20).routes())
        transport = httpx.ASGITransport(app=routed)
        async with httpx.AsyncClient(transport=transport, base_url="http://asgi") as starlette:
            for path in ("/v2/models/add/infer", "/v2/models/add/versions/1/infer"):
                fast = await client.post(path, json=body)
                slow = await starlette.post(path, json=body)
                assert (slow.status_code, slow.json()) == (fast.status_code, fast.json())
                assert slow.headers["content-type"] == fast.headers["content-type"]
                fast = await client.post(path, json=bad)
                slow = await starlette.post(path, json=bad)
                assert fast.status_code == slow.status_code == 400
                assert slow.json() == fast.json()
                assert (await starlette.get(path)).status_code == 405


async def test_predict_adapter(config_file: Path) -> None:
    x, _ = digits_data()
    async with running_server(config_file) as (_, client):
        r = await client.post(
            "/predict", json={"model": "digits-logreg", "inputs": {"input": x[0].tolist()}}
        )
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["model"] == "digits-logreg"
        assert doc["outputs"]["label"] == [0]
        r = await client.post(
            "/predict", json={"model": "echo", "version": 1, "inputs": {"x": [[1.5], [2.5]]}}
        )
        assert r.json()["outputs"]["y"] == [[1.5], [2.5]]


async def test_failed_load_is_reported(config_file: Path) -> None:
    async with running_server(config_file) as (_, client):
        body = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}]}
        r = await client.post("/v2/models/corrupt/infer", json=body)
        assert r.status_code == 503
        assert "retry-after" in r.headers
        assert "corrupt" in r.json()["error"]
        index = (await client.post("/v2/repository/index", json={})).json()
        row = next(r for r in index if r["name"] == "corrupt")
        assert row["state"] == "FAILED"
        assert row["reason"]
        r = await client.post("/v2/models/corrupt/infer", json=body)
        assert r.status_code == 503, "a failed model is not retried by every request"
        r = await client.post("/v2/repository/models/corrupt/load", json={})
        assert r.status_code == 503
        assert "failed to load" in r.json()["error"]


def test_binary_bytes_encoding_roundtrip() -> None:
    from modelyard.protocol.tensors import array_from_binary

    raw = b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b"", b"xyz"))
    arr = array_from_binary("t", "BYTES", (3,), raw)
    assert arr.tolist() == [b"ab", b"", b"xyz"]
