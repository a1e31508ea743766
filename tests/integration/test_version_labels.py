"""Version labels (``1.3``, ``1.10``, ``2024-11-01``) are versions on every route.

``add`` is served as ``1.3`` (+1) and ``1.10`` (+2): numbers compare as numbers, so
``1.10`` is the newest and serves unversioned requests (a string sort would pick
``1.3``). Each route reaches ``1.3`` when asked for it by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from modelyard.examples.mlp import build_add_onnx
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from modelyard.repository.layout import list_versions
from tests.servers import running_server, write_config

BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}


def _repo(tmp_path: Path, versions: dict[str, float]) -> Path:
    root = tmp_path / "repo"
    for label, value in versions.items():
        build_add_onnx(root / "add" / label / "model.onnx", value)
    return root


async def _rest(client: httpx.AsyncClient, path: str) -> float:
    r = await client.post(path, json=BODY)
    assert r.status_code == 200, r.text
    return float(r.json()["outputs"][0]["data"][0])


async def _grpc(port: int, version: str) -> float:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]  # generated
        reply = await stub.ModelInfer(
            pb.ModelInferRequest(
                model_name="add",
                model_version=version,
                inputs=[
                    pb.ModelInferRequest.InferInputTensor(
                        name="input",
                        datatype="FP32",
                        shape=[1, 4],
                        contents=pb.InferTensorContents(fp32_contents=[0, 0, 0, 0]),
                    )
                ],
            )
        )
        assert reply.model_version == version
        if reply.raw_output_contents:
            return float(np.frombuffer(reply.raw_output_contents[0], dtype=np.float32)[0])
        return float(reply.outputs[0].contents.fp32_contents[0])


def test_labels_are_ordered_by_their_numbers(tmp_path: Path) -> None:
    for name in ("1.10", "1.3", "2", "1", "2024-11-01", "2024-09-30", "v3", ".hidden", "tok"):
        (tmp_path / name).mkdir()
    assert list_versions(tmp_path) == ["1", "1.3", "1.10", "2", "2024-09-30", "2024-11-01"]


async def test_a_labelled_version_is_served_on_every_route(tmp_path: Path) -> None:
    root = _repo(tmp_path, {"1.3": 1.0, "1.10": 2.0})
    model = {"name": "add", "path": "add", "isolation": "inline", "version_policy": {"all": True}}
    cfg = write_config(tmp_path, [model], model_repository=str(root))
    async with running_server(cfg, grpc=True) as (app, client):
        assert await _rest(client, "/v2/models/add/infer") == 2.0  # newest: 1.10
        assert await _rest(client, "/v2/models/add/versions/1.3/infer") == 1.0
        assert await _rest(client, "/v2/models/add/versions/1.10/infer") == 2.0
        r = await client.post(
            "/predict", json={"model": "add", "version": "1.3", "inputs": {"input": [0, 0, 0, 0]}}
        )
        assert r.status_code == 200, r.text
        assert r.json()["outputs"]["output"] == [[1.0, 1.0, 1.0, 1.0]]
        assert app.grpc_port is not None
        assert await _grpc(app.grpc_port, "1.3") == 1.0
        meta = (await client.get("/v2/models/add")).json()
        assert meta["versions"] == ["1.3", "1.10"]
        index = (await client.post("/v2/repository/index", json={})).json()
        assert sorted(row["version"] for row in index if row["name"] == "add") == ["1.10", "1.3"]
        missing = await client.post("/v2/models/add/versions/1.4/infer", json=BODY)
        assert missing.status_code == 404
        assert "1.4" in missing.json()["error"]
        alias = await client.put("/v2/repository/models/add/aliases/2.0", json={"version": "1.3"})
        assert alias.status_code == 400, "an alias may not look like a version"


async def test_a_dated_folder_is_the_newest_version_in_poll_mode(tmp_path: Path) -> None:
    root = _repo(tmp_path, {"2024-09-30": 1.0})
    model = {"name": "add", "path": "add", "isolation": "inline", "preload": True}
    cfg = write_config(
        tmp_path,
        [model],
        model_repository=str(root),
        model_control_mode="poll",
        poll_interval_s=0.1,
        poll_settle_s=0.2,
    )
    async with running_server(cfg) as (_app, client):
        assert await _rest(client, "/v2/models/add/infer") == 1.0
        staging = tmp_path / "staging"
        build_add_onnx(staging / "model.onnx", 3.0)
        shutil.copytree(staging, root / "add" / "2024-11-01")
        value = 1.0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(20):
                while value != 3.0:
                    await asyncio.sleep(0.1)
                    value = await _rest(client, "/v2/models/add/infer")
        assert value == 3.0, "the later date takes the default route"


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
