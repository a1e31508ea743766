"""The servicer on a real grpc.aio server (127.0.0.1:0), driven through the generated stub."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest

from modelyard.errors import (
    CircuitOpenError,
    DeadlineExceededError,
    InvalidInputError,
    MemoryBudgetError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    ModelStateConflictError,
    NotSupportedError,
    OverloadedError,
    RequestCancelledError,
    ServerError,
    WorkerCrashedError,
)
from modelyard.frontends.grpc.convert import request_to_proto, response_from_proto
from modelyard.frontends.grpc.errors import GRPC_STATUS
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from modelyard.frontends.grpc.server import GrpcLimits, start_grpc_server, stop_grpc_server
from modelyard.frontends.grpc.servicer import DataPlaneProtocol
from modelyard.observability.log_settings import LogSettings
from modelyard.protocol.generate import GenerateChunk, GenerateRequest
from modelyard.protocol.tensors import output_from_array
from modelyard.protocol.types import (
    InferInput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ServerMetadata,
    TensorMetadata,
)

MAX_MESSAGE_BYTES = 1 << 20
LIMITS = GrpcLimits(max_message_bytes=MAX_MESSAGE_BYTES)


class FakeDataPlane:
    """Echoes inputs back as outputs; records calls; raises ``error`` when set."""

    def __init__(self) -> None:
        self.models = {"echo": ["1", "2"]}
        self.ready_models = {"echo"}
        self.error: Exception | None = None
        self.requests: list[InferRequest] = []
        self.loaded: list[str] = []
        self.configs: list[object] = []
        self.unloaded: list[str] = []
        self.max_request_elements = 1 << 20
        self.hold: asyncio.Event | None = None
        """When set, ``infer`` waits for it (calls kept running)."""

    def check_response_bytes(self, size: int) -> None:
        pass

    def _check(self, name: str) -> None:
        if self.error is not None:
            raise self.error
        if name not in self.models:
            raise ModelNotFoundError(f"model {name!r} not found")

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self.error is None

    def model_ready(self, name: str, version: str | None) -> bool:
        self._check(name)
        return name in self.ready_models

    log_settings = LogSettings()

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata("modelyard", "0.1.0", ("model_repository",))

    async def model_metadata_loaded(
        self, name: str, version: str | None, timeout_s: float | None = None
    ) -> ModelMetadata:
        self._check(name)
        tensor = TensorMetadata("x", "FP32", (-1, 3))
        return ModelMetadata(name, tuple(self.models[name]), "python", (tensor,), (tensor,))

    async def infer(self, request: InferRequest) -> InferResponse:
        self._check(request.model_name)
        self.requests.append(request)
        if self.hold is not None:
            await self.hold.wait()
        return InferResponse(
            model_name=request.model_name,
            model_version=request.model_version or "2",
            outputs=[output_from_array(t.name, t.array) for t in request.inputs],
            id=request.id,
        )

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return [
            {"name": n, "version": v, "state": "READY", "reason": None}
            for n, versions in self.models.items()
            for v in versions
            if not ready_only or n in self.ready_models
        ] + (
            []
            if ready_only
            else [{"name": "broken", "version": "1", "state": "FAILED", "reason": "bad file"}]
        )

    async def load(self, name: str, config: object = None) -> None:
        self._check(name)
        self.loaded.append(name)
        self.configs.append(config)
        if name not in self.ready_models:  # as DataPlane.load answers it
            raise ModelNotReadyError(f"model {name!r} did not become ready")

    async def unload(self, name: str) -> None:
        self._check(name)
        self.unloaded.append(name)

    def is_generative(self, name: str) -> bool:
        return False  # generative models are tested on a real server (test_stream_infer)

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        raise NotSupportedError("no generative model here")
        yield  # an async generator, as the data plane's

    async def generate_text(self, request: GenerateRequest) -> dict[str, object]:
        raise NotSupportedError("no generative model here")

    def statistics(self, name: str | None, version: str | None) -> dict[str, object]:
        if name is not None:
            self._check(name)
        return {"model_stats": []}

    async def model_config(
        self, name: str, version: str | None, timeout_s: float | None = None
    ) -> dict[str, Any]:
        self._check(name)
        return {"name": name}


def _as_protocol(fake: FakeDataPlane) -> DataPlaneProtocol:
    return fake  # the fake is type-checked against the real protocol here


@dataclass
class Client:
    stub: Any
    fake: FakeDataPlane


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    fake = FakeDataPlane()
    server, port = await start_grpc_server(_as_protocol(fake), "127.0.0.1", 0, LIMITS)
    assert port > 0
    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 4 * MAX_MESSAGE_BYTES)]
    )
    try:
        # The generated stub has no annotations; Any is what it is.
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        yield Client(stub, fake)
    finally:
        await channel.close(grace=None)
        await stop_grpc_server(server, grace_s=1.0)


def _infer_request(**kwargs: Any) -> pb.ModelInferRequest:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    return request_to_proto(
        InferRequest("echo", None, [InferInput("x", "FP32", arr.shape, arr)], **kwargs)
    )


async def test_health_and_server_metadata(client: Client) -> None:
    assert (await client.stub.ServerLive(pb.ServerLiveRequest())).live is True
    assert (await client.stub.ServerReady(pb.ServerReadyRequest())).ready is True
    meta = await client.stub.ServerMetadata(pb.ServerMetadataRequest())
    assert (meta.name, meta.version, list(meta.extensions)) == (
        "modelyard",
        "0.1.0",
        ["model_repository"],
    )


async def test_model_ready(client: Client) -> None:
    assert (await client.stub.ModelReady(pb.ModelReadyRequest(name="echo"))).ready is True
    client.fake.ready_models.clear()
    assert (await client.stub.ModelReady(pb.ModelReadyRequest(name="echo"))).ready is False
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.stub.ModelReady(pb.ModelReadyRequest(name="nope"))
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "model 'nope' not found"


async def test_model_metadata(client: Client) -> None:
    meta = await client.stub.ModelMetadata(pb.ModelMetadataRequest(name="echo", version="1"))
    assert (meta.name, list(meta.versions), meta.platform) == ("echo", ["1", "2"], "python")
    (tensor,) = meta.inputs
    assert (tensor.name, tensor.datatype, list(tensor.shape)) == ("x", "FP32", [-1, 3])
    assert len(meta.outputs) == 1


async def test_model_infer_echoes_raw_outputs(client: Client) -> None:
    msg = _infer_request(id="abc", priority=3)
    response = await client.stub.ModelInfer(msg)
    assert len(response.raw_output_contents) == 1
    decoded = response_from_proto(response)
    assert (decoded.model_name, decoded.model_version, decoded.id) == ("echo", "2", "abc")
    np.testing.assert_array_equal(
        decoded.outputs[0].array, np.arange(6, dtype=np.float32).reshape(2, 3)
    )
    (seen,) = client.fake.requests
    assert seen.priority == 3
    assert seen.timeout_s is None


async def test_client_deadline_becomes_the_timeout(client: Client) -> None:
    await client.stub.ModelInfer(_infer_request(), timeout=30.0)
    await client.stub.ModelInfer(_infer_request(timeout_s=0.5), timeout=30.0)
    await client.stub.ModelInfer(_infer_request(timeout_s=60.0), timeout=30.0)
    deadline_only, shorter_param, longer_param = client.fake.requests
    # gRPC encodes the deadline coarsely (grpc-timeout), so allow it to round up a little.
    assert deadline_only.timeout_s is not None
    assert 25.0 < deadline_only.timeout_s <= 31.0
    assert shorter_param.timeout_s == pytest.approx(0.5)
    assert longer_param.timeout_s is not None
    assert 25.0 < longer_param.timeout_s <= 31.0


async def test_invalid_request_is_invalid_argument(client: Client) -> None:
    msg = pb.ModelInferRequest(model_name="echo")
    msg.inputs.add(name="x", datatype="FP16", shape=[1]).contents.fp32_contents.append(1.0)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.stub.ModelInfer(msg)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "raw_input_contents" in (info.value.details() or "")


ERRORS: list[ServerError] = [
    ModelNotFoundError("m"),
    InvalidInputError("m"),
    ModelNotReadyError("m"),
    ModelStateConflictError("m"),
    OverloadedError("m"),
    MemoryBudgetError("m"),
    DeadlineExceededError("m"),
    RequestCancelledError("m"),
    WorkerCrashedError("m"),
    ModelLoadError("m"),
    CircuitOpenError("m"),
    NotSupportedError("m"),
]


@pytest.mark.parametrize("error", ERRORS, ids=[type(e).__name__ for e in ERRORS])
async def test_server_errors_map_to_their_status(client: Client, error: ServerError) -> None:
    client.fake.error = error
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.stub.ModelInfer(_infer_request())
    assert info.value.code() is GRPC_STATUS[error.code]
    assert info.value.details() == "m"


async def test_retryable_errors_carry_retry_after(client: Client) -> None:
    client.fake.error = OverloadedError("queue full", retry_after_s=2.5)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.stub.ModelInfer(_infer_request())
    # grpc-stubs types these as the sync API's objects; grpc.aio returns a Metadata.
    trailers: Any = info.value.trailing_metadata()
    assert dict(trailers)["retry-after"] == "3"


async def test_unexpected_error_is_internal_with_its_message(client: Client) -> None:
    client.fake.error = RuntimeError("boom")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.stub.ModelInfer(_infer_request())
    assert info.value.code() is grpc.StatusCode.INTERNAL
    assert "boom" in (info.value.details() or "")


async def test_message_over_the_limit_is_resource_exhausted(client: Client) -> None:
    big = np.zeros(MAX_MESSAGE_BYTES // 4 + 16, dtype=np.float32)
    msg = request_to_proto(InferRequest("echo", None, [InferInput("x", "FP32", big.shape, big)]))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.stub.ModelInfer(msg)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert client.fake.requests == []


async def test_repository_index(client: Client) -> None:
    index = await client.stub.RepositoryIndex(pb.RepositoryIndexRequest())
    rows = [(m.name, m.version, m.state, m.reason) for m in index.models]
    assert rows == [
        ("echo", "1", "READY", ""),
        ("echo", "2", "READY", ""),
        ("broken", "1", "FAILED", "bad file"),
    ]
    ready = await client.stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))
    assert [m.name for m in ready.models] == ["echo", "echo"]


async def test_repository_load_and_unload(client: Client) -> None:
    await client.stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="echo"))
    await client.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="echo"))
    assert (client.fake.loaded, client.fake.unloaded) == (["echo"], ["echo"])


async def test_load_that_does_not_become_ready_is_unavailable(client: Client) -> None:
    client.fake.ready_models.clear()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="echo"))
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_load_passes_a_config_override_on(client: Client) -> None:
    msg = pb.RepositoryModelLoadRequest(model_name="echo")
    msg.parameters["config"].string_param = '{"max_batch_size": 4}'
    await client.stub.RepositoryModelLoad(msg)
    assert client.fake.loaded == ["echo"]
    assert client.fake.configs == ['{"max_batch_size": 4}']


async def test_load_with_file_parameters_is_refused_by_name(client: Client) -> None:
    msg = pb.RepositoryModelLoadRequest(model_name="echo")
    msg.parameters["file:1/model.onnx"].bytes_param = b"..."
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.stub.RepositoryModelLoad(msg)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "'file:1/model.onnx'" in (info.value.details() or "")
    assert client.fake.loaded == []


async def test_missing_model_name_is_invalid_argument(client: Client) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest())
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_port_in_use_is_an_os_error(client: Client) -> None:
    server, port = await start_grpc_server(_as_protocol(FakeDataPlane()), "127.0.0.1", 0, LIMITS)
    try:
        with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
            await start_grpc_server(_as_protocol(FakeDataPlane()), "127.0.0.1", port, LIMITS)
    finally:
        await stop_grpc_server(server, grace_s=0)


async def test_calls_beyond_the_buffered_bytes_bound_are_resource_exhausted() -> None:
    # 2 MiB buffered at most with 1 MiB messages: two calls run at once, whatever
    # max_concurrent_rpcs says.
    limits = GrpcLimits(max_message_bytes=1 << 20, max_buffered_bytes=2 << 20)
    assert limits.concurrent_rpcs == 2
    fake = FakeDataPlane()
    fake.hold = asyncio.Event()
    server, port = await start_grpc_server(_as_protocol(fake), "127.0.0.1", 0, limits)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            running = [asyncio.ensure_future(stub.ModelInfer(_infer_request())) for _ in range(2)]
            while len(fake.requests) < 2:
                await asyncio.sleep(0.01)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(_infer_request())
            assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            fake.hold.set()
            for call in running:
                assert list((await call).outputs[0].shape) == [2, 3]
            assert list((await stub.ModelInfer(_infer_request())).outputs[0].shape) == [2, 3]
    finally:
        await stop_grpc_server(server, grace_s=0)
