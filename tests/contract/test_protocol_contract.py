"""One table of Open Inference Protocol cases, run over REST and over gRPC.

Both transports call the same data plane, so every case must give the same result:
the same outputs, or the same error class (HTTP status ⇔ gRPC code).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
import httpx
import numpy as np
import pytest

from modelyard.frontends.grpc.convert import request_to_proto, response_from_proto
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from modelyard.protocol.tensors import json_data, output_from_array
from modelyard.protocol.types import InferInput, InferRequest
from tests.integration.conftest import TYPES, model_root  # noqa: F401  (fixture)
from tests.servers import running_server, write_config

pytestmark = pytest.mark.integration

HTTP_FOR_GRPC = {
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
}


def _arrays() -> dict[str, np.ndarray]:
    return {
        "f32": np.array([[1.5, -2.0], [3.25, 4.0]], dtype=np.float32),
        "f16": np.array([[0.5, 1.0], [-1.5, 2.0]], dtype=np.float16),
        "f64": np.array([[1e-300, 2.0], [3.0, -4.0]], dtype=np.float64),
        "i8": np.array([[-128, 127], [0, 1]], dtype=np.int8),
        "i32": np.array([[-(2**31), 2**31 - 1], [0, 5]], dtype=np.int32),
        "i64": np.array([[-(2**62), 2**62], [0, 7]], dtype=np.int64),
        "u8": np.array([[0, 255], [1, 2]], dtype=np.uint8),
        "b": np.array([[True, False], [False, True]]),
        "s": np.array([[b"hello", b""], [b"caf\xc3\xa9", b"x y"]], dtype=object),
    }


def _request(model: str, arrays: dict[str, np.ndarray], **kw: Any) -> InferRequest:
    inputs = []
    for name, arr in arrays.items():
        datatype = kw.pop(f"dt_{name}", TYPES[name][0] if name in TYPES else "FP32")
        inputs.append(InferInput(name, datatype, tuple(arr.shape), arr))
    return InferRequest(model_name=model, model_version=kw.get("version"), inputs=inputs)


@dataclass
class Outcome:
    """What a transport answered: outputs by name, or an HTTP-equivalent status."""

    status: int
    outputs: dict[str, Any]


class Transport(Protocol):
    name: str

    async def live(self) -> bool: ...
    async def ready(self) -> bool: ...
    async def server_name(self) -> str: ...
    async def model_inputs(self, model: str) -> list[tuple[str, str, list[int]]]: ...
    async def model_ready(self, model: str) -> bool: ...
    async def infer(self, req: InferRequest) -> Outcome: ...
    async def index(self) -> set[tuple[str, str, str]]: ...


class Rest(Transport):
    name = "rest"

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.c = client

    async def live(self) -> bool:
        return (await self.c.get("/v2/health/live")).status_code == 200

    async def ready(self) -> bool:
        return (await self.c.get("/v2/health/ready")).status_code == 200

    async def server_name(self) -> str:
        name: str = (await self.c.get("/v2")).json()["name"]
        return name

    async def model_inputs(self, model: str) -> list[tuple[str, str, list[int]]]:
        meta = (await self.c.get(f"/v2/models/{model}")).json()
        return [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]]

    async def model_ready(self, model: str) -> bool:
        return (await self.c.get(f"/v2/models/{model}/ready")).status_code == 200

    async def infer(self, req: InferRequest) -> Outcome:
        body = {
            "inputs": [
                {
                    "name": t.name,
                    "datatype": t.datatype,
                    "shape": list(t.shape),
                    "data": json_data(output_from_array(t.name, t.array)),
                }
                for t in req.inputs
            ]
        }
        path = f"/v2/models/{req.model_name}"
        if req.model_version:
            path += f"/versions/{req.model_version}"
        r = await self.c.post(path + "/infer", json=body)
        if r.status_code != 200:
            return Outcome(r.status_code, {})
        return Outcome(
            200, {o["name"]: (o["datatype"], o["shape"], o["data"]) for o in r.json()["outputs"]}
        )

    async def index(self) -> set[tuple[str, str, str]]:
        rows = (await self.c.post("/v2/repository/index", json={})).json()
        return {(r["name"], r["version"], r["state"]) for r in rows}


class Grpc(Transport):
    name = "grpc"

    def __init__(self, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
        self.s = stub

    async def live(self) -> bool:
        return bool((await self.s.ServerLive(pb.ServerLiveRequest())).live)

    async def ready(self) -> bool:
        return bool((await self.s.ServerReady(pb.ServerReadyRequest())).ready)

    async def server_name(self) -> str:
        return str((await self.s.ServerMetadata(pb.ServerMetadataRequest())).name)

    async def model_inputs(self, model: str) -> list[tuple[str, str, list[int]]]:
        meta = await self.s.ModelMetadata(pb.ModelMetadataRequest(name=model))
        return [(t.name, t.datatype, list(t.shape)) for t in meta.inputs]

    async def model_ready(self, model: str) -> bool:
        return bool((await self.s.ModelReady(pb.ModelReadyRequest(name=model))).ready)

    async def infer(self, req: InferRequest) -> Outcome:
        try:
            resp = await self.s.ModelInfer(request_to_proto(req))
        except grpc.aio.AioRpcError as exc:
            return Outcome(HTTP_FOR_GRPC.get(exc.code(), 599), {})
        decoded = response_from_proto(resp)
        return Outcome(
            200,
            {
                o.name: (o.datatype, list(o.shape), json_data(output_from_array(o.name, o.array)))
                for o in decoded.outputs
            },
        )

    async def index(self) -> set[tuple[str, str, str]]:
        resp = await self.s.RepositoryIndex(pb.RepositoryIndexRequest())
        return {(m.name, m.version, m.state) for m in resp.models}


def _stub(channel: grpc.aio.Channel) -> pb_grpc.GRPCInferenceServiceStub:
    return pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]  # generated


@pytest.fixture
async def transports(model_root: Path, tmp_path: Path) -> AsyncIterator[dict[str, Transport]]:  # noqa: F811
    models = [
        {"name": "types", "path": "types", "preload": True, "isolation": "inline"},
        {"name": "add", "path": "add", "isolation": "inline", "version_policy": {"all": True}},
    ]
    cfg = write_config(tmp_path, models, model_repository=str(model_root))
    async with contextlib.AsyncExitStack() as stack:
        app, client = await stack.enter_async_context(running_server(cfg, grpc=True))
        channel = await stack.enter_async_context(
            grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")
        )
        yield {"rest": Rest(client), "grpc": Grpc(_stub(channel))}


Case = Callable[[Transport], Awaitable[object]]

ADD_IN = {"input": np.array([[0, 1, 2, 3]], dtype=np.float32)}

CASES: dict[str, Case] = {
    "live": lambda t: t.live(),
    "ready": lambda t: t.ready(),
    "server-metadata": lambda t: t.server_name(),
    "model-metadata": lambda t: t.model_inputs("types"),
    "model-ready": lambda t: t.model_ready("types"),
    "infer-every-datatype": lambda t: t.infer(_request("types", _arrays())),
    "infer-version-1": lambda t: t.infer(_request("add", ADD_IN, version="1")),
    "infer-default-version": lambda t: t.infer(_request("add", ADD_IN)),
    "error-unknown-model": lambda t: t.infer(_request("nope", ADD_IN)),
    "error-unknown-version": lambda t: t.infer(_request("add", ADD_IN, version="9")),
    "error-wrong-datatype": lambda t: t.infer(_request("add", ADD_IN, dt_input="FP64")),
    "error-wrong-shape": lambda t: t.infer(
        _request("add", {"input": np.zeros((1, 3), dtype=np.float32)})
    ),
    "error-missing-input": lambda t: t.infer(
        _request("types", {k: v for k, v in _arrays().items() if k != "s"})
    ),
    "repository-index": lambda t: t.index(),
}


async def test_rest_and_grpc_agree_on_every_case(transports: dict[str, Transport]) -> None:
    results: dict[str, dict[str, object]] = {}
    for case_id, case in CASES.items():
        results[case_id] = {name: await case(t) for name, t in transports.items()}
        assert results[case_id]["rest"] == results[case_id]["grpc"], case_id
    every = results["infer-every-datatype"]["rest"]
    assert isinstance(every, Outcome)
    assert every.status == 200
    for name, arr in _arrays().items():
        datatype, shape, data = every.outputs[f"{name}_out"]
        assert datatype == TYPES[name][0]
        assert shape == [2, 2]
        expected = json_data(output_from_array(name, arr))
        assert data == expected, name
    assert results["infer-version-1"]["rest"] == Outcome(
        200, {"output": ("FP32", [1, 4], [1.0, 2.0, 3.0, 4.0])}
    )
    assert results["infer-default-version"]["grpc"] == Outcome(
        200, {"output": ("FP32", [1, 4], [2.0, 3.0, 4.0, 5.0])}
    )
    statuses = {
        k: v["rest"].status
        for k, v in results.items()
        if k.startswith("error") and isinstance(v["rest"], Outcome)
    }
    assert statuses == {
        "error-unknown-model": 404,
        "error-unknown-version": 404,
        "error-wrong-datatype": 400,
        "error-wrong-shape": 400,
        "error-missing-input": 400,
    }


async def test_stock_grpc_client_concurrent_stream(transports: dict[str, Transport]) -> None:
    grpc_t = transports["grpc"]
    assert isinstance(grpc_t, Grpc)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    msg = pb.ModelInferRequest(model_name="add", model_version="1")
    tensor = msg.inputs.add(name="input", datatype="FP32", shape=[1, 4])
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    sem = asyncio.Semaphore(64)

    async def one(i: int) -> list[float]:
        async with sem:
            resp = await grpc_t.s.ModelInfer(msg)
        return list(np.frombuffer(resp.raw_output_contents[0], dtype=np.float32))

    results = await asyncio.gather(*(one(i) for i in range(1000)))
    assert all(r == [1.0, 2.0, 3.0, 4.0] for r in results)
