"""An output requested twice is refused with the same 400 on every transport (issue 33:
100,000 copies of one output name turned a 2.7 MB request into a 28 MB answer)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from tests.servers import running_server, write_config

COPIES = 1000


@pytest.fixture
def config_file(model_root: Path, tmp_path: Path) -> Path:
    models = [
        {"name": "digits-logreg", "path": "digits-logreg", "preload": True, "isolation": "inline"}
    ]
    return write_config(tmp_path, models, model_repository=str(model_root))


def _grpc_request(outputs: list[str]) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name="digits-logreg",
        inputs=[
            pb.ModelInferRequest.InferInputTensor(
                name="input",
                datatype="FP32",
                shape=[1, 64],
                contents=pb.InferTensorContents(fp32_contents=[0.0] * 64),
            )
        ],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name=n) for n in outputs],
    )


async def test_repeated_outputs_are_refused_on_rest_and_grpc(config_file: Path) -> None:
    async with running_server(config_file, grpc=True) as (app, client):
        tensor = {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}
        body = {"inputs": [tensor], "outputs": [{"name": "label"}] * COPIES}
        r = await client.post("/v2/models/digits-logreg/infer", json=body)
        assert r.status_code == 400, r.text
        assert "output 'label' is requested twice" in r.json()["error"]
        # Distinct outputs are still served, each once.
        body["outputs"] = [{"name": "label"}, {"name": "probabilities"}]
        r = await client.post("/v2/models/digits-logreg/infer", json=body)
        assert r.status_code == 200, r.text
        assert [o["name"] for o in r.json()["outputs"]] == ["label", "probabilities"]

        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]  # generated
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ModelInfer(_grpc_request(["label"] * COPIES))
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "output 'label' is requested twice" in (caught.value.details() or "")
            reply = await stub.ModelInfer(_grpc_request(["probabilities", "label"]))
            assert [o.name for o in reply.outputs] == ["probabilities", "label"]
