"""gRPC mode of the load generator, against a small grpc.aio server built on modelyard's stubs."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import grpc
import numpy as np
import pytest

from modelyard.bench import BenchConfig, EngineUnavailableError, TargetError, run_bench
from modelyard.bench.grpc_client import STUBS_PACKAGE, infer_request_bytes, load_grpc_stubs
from modelyard.bench.payload import ModelMetadata, TensorSpec, random_payload

PB2 = f"{STUBS_PACKAGE}.grpc_predict_v2_pb2"
MODELS = {
    "add": [("x", "FP32", [-1, 4])],
    "ints": [("i", "INT64", [2]), ("b", "BOOL", [1])],
    "text": [("t", "BYTES", [1])],
    "half": [("h", "FP16", [3])],
    "flaky": [("x", "FP32", [1])],
}


@dataclass
class Stubs:
    pb2: ModuleType
    pb2_grpc: ModuleType


@pytest.fixture
def stubs() -> Stubs:
    """modelyard's own generated stubs, as a client of any v2 server would use them."""
    real = load_grpc_stubs()
    return Stubs(real.pb2, real.pb2_grpc)


@dataclass
class Servicer:
    pb2: ModuleType
    counts: Counter[str] = field(default_factory=Counter)
    last: dict[str, Any] = field(default_factory=dict)

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if request.name not in MODELS:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.name} not found")
        tensor = self.pb2.ModelMetadataResponse.TensorMetadata
        inputs = [tensor(name=n, datatype=d, shape=s) for n, d, s in MODELS[request.name]]
        return self.pb2.ModelMetadataResponse(name=request.name, inputs=inputs)

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        self.counts[request.model_name] += 1
        self.last[request.model_name] = request
        if request.model_name == "flaky":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "model flaky is not ready")
        return self.pb2.ModelInferResponse(model_name=request.model_name)

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        entry = self.pb2.RepositoryIndexResponse.ModelIndex
        models = [entry(name=name, state="READY") for name in MODELS]
        return self.pb2.RepositoryIndexResponse(models=[*models, entry(name="x", state="LOADING")])


@dataclass
class GrpcServer:
    target: str
    servicer: Servicer


@pytest.fixture
async def grpc_server(stubs: Stubs) -> AsyncIterator[GrpcServer]:
    server = grpc.aio.server()
    # The generated base answers UNIMPLEMENTED for every RPC this test server leaves out.
    servicer_class = type(
        "TestServicer", (Servicer, stubs.pb2_grpc.GRPCInferenceServiceServicer), {}
    )
    servicer = servicer_class(stubs.pb2)
    stubs.pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield GrpcServer(f"127.0.0.1:{port}", servicer)
    finally:
        await server.stop(None)


def test_missing_stubs_make_grpc_mode_fail_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, PB2, None)
    with pytest.raises(EngineUnavailableError, match="gRPC mode needs the generated stubs"):
        load_grpc_stubs()


async def test_grpc_closed_loop_counts_ok_and_errors_by_status(grpc_server: GrpcServer) -> None:
    config = BenchConfig(grpc_target=grpc_server.target, concurrency=(4,), requests=100, warmup_s=0)
    [result] = await run_bench(config)
    counts = grpc_server.servicer.counts
    assert result.engine == "python/grpc"
    assert result.requests == 100 == sum(counts.values())
    assert set(result.requests_by_model) == set(MODELS)
    assert result.errors == {"UNAVAILABLE": counts["flaky"]}
    assert result.ok == 100 - counts["flaky"]


async def test_grpc_requests_carry_typed_or_raw_contents(grpc_server: GrpcServer) -> None:
    config = BenchConfig(grpc_target=grpc_server.target, requests=100, warmup_s=0)
    await run_bench(config)
    last = grpc_server.servicer.last
    add = last["add"].inputs[0]
    assert (add.name, add.datatype, list(add.shape), len(add.contents.fp32_contents)) == (
        "x",
        "FP32",
        [1, 4],
        4,
    )
    ints, flag = last["ints"].inputs
    assert (len(ints.contents.int64_contents), len(flag.contents.bool_contents)) == (2, 1)
    assert last["text"].inputs[0].contents.bytes_contents[0].startswith(b"s")
    # FP16 has no typed field: every input of that request goes raw.
    [raw] = last["half"].raw_input_contents
    assert np.frombuffer(raw, dtype="<f2").shape == (3,)


async def test_grpc_unknown_model_stops_the_run(grpc_server: GrpcServer) -> None:
    config = BenchConfig(grpc_target=grpc_server.target, models=("nope",), requests=1)
    with pytest.raises(TargetError, match="NOT_FOUND model nope not found"):
        await run_bench(config)


def test_requests_parse_with_modelyards_own_stubs() -> None:
    """The encoder must produce what the real server's stubs accept."""
    real = load_grpc_stubs()
    assert real.service == "inference.GRPCInferenceService"
    specs = (TensorSpec("x", "FP32", (-1, 2)), TensorSpec("s", "BYTES", (1,)))
    payload = random_payload(ModelMetadata("m", specs))
    request = real.pb2.ModelInferRequest.FromString(infer_request_bytes(real, payload))
    assert request.model_name == "m"
    assert [len(request.inputs[0].contents.fp32_contents), list(request.inputs[0].shape)] == [
        2,
        [1, 2],
    ]
