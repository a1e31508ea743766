"""A new user's first mistakes get helpful answers: a misspelt model name is met with
"did you mean …?" over REST, ``/predict`` and gRPC, and a repository without manifests
warns once per start, not once per model."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest

from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from tests.servers import running_server, write_config

X = {"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}

MODELS = [
    {"name": "digits-logreg", "path": "digits-logreg", "isolation": "inline"},
    {"name": "add", "path": "add", "isolation": "inline", "version_policy": {"all": True}},
    {"name": "mlp", "path": "mlp", "isolation": "inline", "preload": True},
]


@pytest.fixture
def config_file(model_root: Path, tmp_path: Path) -> Path:
    return write_config(tmp_path, MODELS, model_repository=str(model_root))


async def test_misspelt_model_names_get_a_suggestion(config_file: Path) -> None:
    async with running_server(config_file, grpc=True) as (app, client):
        r = await client.get("/v2/models/digits-logrg")
        assert r.status_code == 404
        assert "did you mean 'digits-logreg'?" in r.json()["error"]
        r = await client.post("/v2/models/ad/infer", json={"inputs": [X]})
        assert r.status_code == 404
        assert "did you mean 'add'?" in r.json()["error"]
        r = await client.post("/predict", json={"model": "mpl", "inputs": {"x": [1.0]}})
        assert r.status_code == 404
        assert "did you mean 'mlp'?" in r.json()["error"]
        # A load of a folder that is not there: the closest folders and models.
        r = await client.post("/v2/repository/models/digits-logre/load")
        assert r.status_code == 404
        assert "did you mean 'digits-logreg'" in r.json()["error"]
        # Nothing close: no guess.
        r = await client.get("/v2/models/zzzzzz")
        assert r.status_code == 404
        assert "did you mean" not in r.json()["error"]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]  # generated
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelMetadata(pb.ModelMetadataRequest(name="digits-logrg"))
        assert info.value.code() is grpc.StatusCode.NOT_FOUND
        assert "did you mean 'digits-logreg'?" in (info.value.details() or "")


async def test_missing_manifests_are_reported_once_per_start(
    config_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="modelyard.manager")
    async with running_server(config_file) as (_app, client):
        for name in ("digits-logreg", "add"):
            assert (await client.post(f"/v2/repository/models/{name}/load")).status_code == 200
    warnings = [r.getMessage() for r in caplog.records if "has no manifest" in r.getMessage()]
    # mlp (preloaded), digits-logreg and both add versions all load unverified.
    assert len(warnings) == 1, warnings
    assert "said once" in warnings[0]
