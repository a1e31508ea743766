"""Fallback chains on a real server: who answers when the requested model cannot,
how the answer is marked, what is counted, and the checks at start."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from modelyard.app import StartupError
from modelyard.config.settings import load_settings
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from tests.servers import running_server, write_config

from .conftest import python_model

ADD_INPUT = {"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}


def _body(*inputs: dict[str, Any], **parameters: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"inputs": list(inputs)}
    if parameters:
        doc["parameters"] = parameters
    return doc


async def test_a_model_that_cannot_load_is_answered_by_its_fallback(
    model_root: Path, tmp_path: Path
) -> None:
    models = [
        {"name": "broken", "path": "corrupt", "isolation": "inline", "fallback": ["small"]},
        {"name": "small", "path": "add", "isolation": "inline", "default_version": "1"},
    ]
    cfg = write_config(tmp_path, models, model_repository=str(model_root))
    async with running_server(cfg) as (_, client):
        own = await client.post("/v2/models/small/infer", json=_body(ADD_INPUT))
        assert own.status_code == 200, own.text
        assert "x-modelyard-served-by" not in own.headers
        assert "parameters" not in own.json()
        # The parameter is checked whether or not the model has a fallback to forbid.
        r = await client.post("/v2/models/small/infer", json=_body(ADD_INPUT, fallback="no"))
        assert r.status_code == 400, r.text
        assert "'fallback' must be true or false" in r.json()["error"]

        r = await client.post("/v2/models/broken/infer", json=_body(ADD_INPUT))
        assert r.status_code == 200, r.text
        assert r.headers["x-modelyard-served-by"] == "small"
        doc = r.json()
        assert doc["parameters"] == {"served_by": "small", "fallback_reason": "unavailable"}
        assert doc["model_name"] == "small"
        assert doc["outputs"] == own.json()["outputs"]  # the fallback's own answer

        # A request may forbid the fallback: then the model's own error comes back.
        r = await client.post("/v2/models/broken/infer", json=_body(ADD_INPUT, fallback=False))
        assert r.status_code == 503, r.text
        assert r.json()["error"]
        r = await client.post("/v2/models/broken/infer", json=_body(ADD_INPUT, fallback="no"))
        assert r.status_code == 400
        assert "'fallback' must be true or false" in r.json()["error"]

        metrics = (await client.get("/metrics")).text
        assert (
            'modelyard_inference_fallbacks_total{fallback="small",model="broken",'
            'reason="unavailable"} 1.0'
        ) in metrics


async def test_a_full_queue_sends_requests_to_the_fallback(
    model_root: Path, tmp_path: Path
) -> None:
    models = [
        python_model(
            "faulty",
            "FaultyModel",
            max_batch_size=0,
            max_queue_size=1,
            early_rejection=False,
            fallback=["echo"],
        ),
        python_model("echo", "EchoModel", preload=True),
    ]
    cfg = write_config(tmp_path, models, model_repository=str(model_root))
    slow = {"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [4.0]}  # sleeps 0.3 s
    async with running_server(cfg) as (_, client):
        warm = await client.post("/v2/models/faulty/infer", json=_body({**slow, "data": [0.0]}))
        assert warm.status_code == 200, warm.text
        answers = await asyncio.gather(
            *(client.post("/v2/models/faulty/infer", json=_body(slow)) for _ in range(5))
        )
        assert [a.status_code for a in answers] == [200] * 5
        by_fallback = [a for a in answers if a.headers.get("x-modelyard-served-by") == "echo"]
        assert by_fallback, "no request overflowed to the fallback"
        assert len(by_fallback) < 5  # the model itself answered some
        for answer in by_fallback:
            assert answer.json()["parameters"]["fallback_reason"] == "queue_full"
            assert answer.json()["outputs"][0]["data"] == [4.0]  # echo's own answer
        for answer in answers:
            if answer not in by_fallback:
                assert "parameters" not in answer.json()


@pytest.mark.slow
async def test_grpc_answer_names_the_fallback(model_root: Path, tmp_path: Path) -> None:
    models = [
        {"name": "broken", "path": "corrupt", "isolation": "inline", "fallback": ["small"]},
        {"name": "small", "path": "add", "isolation": "inline", "default_version": "1"},
    ]
    cfg = write_config(tmp_path, models, model_repository=str(model_root))
    async with running_server(cfg, grpc=True) as (app, _):
        assert app.grpc_port is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            request = pb.ModelInferRequest(model_name="broken")
            tensor = request.inputs.add(name="input", datatype="FP32", shape=[1, 4])
            tensor.contents.fp32_contents.extend([1, 2, 3, 4])
            response = await stub.ModelInfer(request, timeout=30)
    assert response.parameters["served_by"].string_param == "small"
    assert response.parameters["fallback_reason"].string_param == "unavailable"


def test_a_fallback_must_be_a_configured_model(tmp_path: Path) -> None:
    models = [{"name": "a", "path": "a", "fallback": ["nowhere"]}]
    cfg = write_config(tmp_path, models)
    with pytest.raises(Exception, match="fallback names unknown model"):
        load_settings(cfg)


async def test_a_fallback_with_other_tensors_stops_the_start(
    model_root: Path, tmp_path: Path
) -> None:
    models = [
        {
            "name": "add",
            "path": "add",
            "isolation": "inline",
            "preload": True,
            "fallback": ["digits"],
        },
        {"name": "digits", "path": "digits-logreg", "isolation": "inline", "preload": True},
    ]
    cfg = write_config(tmp_path, models, model_repository=str(model_root))
    with pytest.raises(StartupError, match="fallback 'digits' does not take the same tensors"):
        async with running_server(cfg):
            pytest.fail("the server started with a fallback of other tensors")
