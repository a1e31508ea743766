"""gRPC client for the load generator, over the Open Inference Protocol's ``ModelInfer``.

The protobuf stubs come from ``modelyard.frontends.grpc.proto`` and are imported only when gRPC
mode is asked for; without them, gRPC mode fails with :class:`EngineUnavailableError`.

Each model's ``ModelInferRequest`` is serialised once. The hot path calls the method through
``channel.unary_unary`` with no serialisers, so requests go out as the stored bytes and
responses come back as bytes that are never parsed.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc
import numpy as np

from modelyard.bench.client import InferSession
from modelyard.bench.discovery import Discovery
from modelyard.bench.errors import EngineUnavailableError, TargetError
from modelyard.bench.payload import InferInput, ModelMetadata, Payload, TensorSpec
from modelyard.frontends.grpc.convert import TYPED_FIELD
from modelyard.protocol.datatypes import numpy_dtype
from modelyard.protocol.tensors import binary_bytes
from modelyard.protocol.types import InferOutput

STUBS_PACKAGE = "modelyard.frontends.grpc.proto"
"""Where the generated ``grpc_predict_v2_pb2`` and ``grpc_predict_v2_pb2_grpc`` live."""


@dataclass(frozen=True)
class GrpcStubs:
    """The generated modules and the full name of the inference service in them."""

    pb2: ModuleType
    pb2_grpc: ModuleType
    service: str
    """E.g. ``inference.GRPCInferenceService``."""
    methods: frozenset[str]

    def stub(self, channel: grpc.aio.Channel) -> Any:
        """The generated stub class bound to ``channel``."""
        return getattr(self.pb2_grpc, self.service.rsplit(".", 1)[-1] + "Stub")(channel)


def load_grpc_stubs() -> GrpcStubs:
    """Import the generated stubs; raises :class:`EngineUnavailableError` if they are absent."""
    try:
        pb2 = importlib.import_module(f"{STUBS_PACKAGE}.grpc_predict_v2_pb2")
        pb2_grpc = importlib.import_module(f"{STUBS_PACKAGE}.grpc_predict_v2_pb2_grpc")
    except ImportError as exc:
        raise EngineUnavailableError(
            f"gRPC mode needs the generated stubs {STUBS_PACKAGE}.grpc_predict_v2_pb2(_grpc), "
            f"which this installation lacks ({exc}); benchmark over REST with --url instead"
        ) from exc
    for service in pb2.DESCRIPTOR.services_by_name.values():
        methods = frozenset(method.name for method in service.methods)
        if "ModelInfer" in methods:
            return GrpcStubs(pb2, pb2_grpc, service.full_name, methods)
    raise EngineUnavailableError(f"{pb2.__name__} defines no service with a ModelInfer method")


def infer_request_bytes(stubs: GrpcStubs, payload: Payload) -> bytes:
    """Serialise ``payload`` as a ``ModelInferRequest``.

    Typed ``contents`` fields are used unless an input is FP16 or BF16, which have none; then
    every input goes in ``raw_input_contents``, as the protocol requires.
    """
    request = stubs.pb2.ModelInferRequest(model_name=payload.model)
    use_raw = any(item.datatype not in TYPED_FIELD for item in payload.inputs)
    for item in payload.inputs:
        tensor = request.inputs.add(name=item.name, datatype=item.datatype, shape=item.shape)
        if use_raw:
            request.raw_input_contents.append(_raw_bytes(item))
        elif item.datatype == "BYTES":
            tensor.contents.bytes_contents.extend(_as_bytes(value) for value in item.data)
        else:
            getattr(tensor.contents, TYPED_FIELD[item.datatype]).extend(item.data)
    data: bytes = request.SerializeToString()
    return data


class GrpcInferClient:
    """One ``grpc.aio`` channel shared by every session; create it inside a running loop."""

    def __init__(
        self,
        target: str,
        payloads: Mapping[str, Payload],
        *,
        timeout_s: float,
        stubs: GrpcStubs | None = None,
        metadata: tuple[tuple[str, str], ...] | None = None,
        root_certificates: bytes | None = None,
    ) -> None:
        stubs = stubs or load_grpc_stubs()
        self._requests = {model: infer_request_bytes(stubs, p) for model, p in payloads.items()}
        self._channel = open_channel(target, root_certificates)
        self._metadata = metadata
        self._call = self._channel.unary_unary(
            f"/{stubs.service}/ModelInfer", request_serializer=None, response_deserializer=None
        )
        self._timeout_s = timeout_s

    def session(self) -> InferSession:
        """A session over the shared channel."""
        return _GrpcSession(self._call, self._requests, self._timeout_s, self._metadata)

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close(None)


class _GrpcSession:
    def __init__(
        self,
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes],
        requests: Mapping[str, bytes],
        timeout_s: float,
        metadata: tuple[tuple[str, str], ...] | None = None,
    ) -> None:
        self._call = call
        self._requests = requests
        self._timeout_s = timeout_s
        self._metadata = metadata

    async def infer(self, model: str) -> str | None:
        try:
            await self._call(
                self._requests[model], timeout=self._timeout_s, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            return str(exc.code().name)
        return None


async def discover_grpc(
    target: str,
    models: Sequence[str],
    *,
    skip_metadata: Collection[str] = (),
    timeout_s: float = 10.0,
    stubs: GrpcStubs | None = None,
    call_metadata: tuple[tuple[str, str], ...] | None = None,
    root_certificates: bytes | None = None,
) -> Discovery:
    """Resolve ``models`` and fetch their metadata over gRPC.

    An empty ``models`` needs a ``RepositoryIndex`` method in the inference service (Triton and
    Seldon define one); otherwise pass the models explicitly.
    """
    stubs = stubs or load_grpc_stubs()
    async with open_channel(target, root_certificates) as channel:
        stub = stubs.stub(channel)
        try:
            names = tuple(models) or await _ready_models(
                stubs, stub, target, timeout_s, call_metadata
            )
            metadata = {}
            for name in names:
                if name not in skip_metadata:
                    request = stubs.pb2.ModelMetadataRequest(name=name)
                    response = await stub.ModelMetadata(
                        request, timeout=timeout_s, metadata=call_metadata
                    )
                    metadata[name] = ModelMetadata(
                        name=name,
                        inputs=tuple(
                            TensorSpec(t.name, t.datatype.upper(), tuple(t.shape))
                            for t in response.inputs
                        ),
                    )
        except grpc.aio.AioRpcError as exc:
            raise TargetError(f"gRPC {target}: {exc.code().name} {exc.details()}") from exc
    return Discovery(models=names, metadata=metadata)


async def _ready_models(
    stubs: GrpcStubs,
    stub: Any,
    target: str,
    timeout_s: float,
    metadata: tuple[tuple[str, str], ...] | None,
) -> tuple[str, ...]:
    if "RepositoryIndex" not in stubs.methods:
        raise TargetError(f"gRPC {target}: the service has no RepositoryIndex; pass --models")
    response = await stub.RepositoryIndex(
        stubs.pb2.RepositoryIndexRequest(), timeout=timeout_s, metadata=metadata
    )
    names = tuple(m.name for m in response.models if (m.state or "READY").upper() == "READY")
    if not names:
        raise TargetError(f"gRPC {target} reports no READY models; pass --models")
    return names


def open_channel(target: str, root_certificates: bytes | None) -> grpc.aio.Channel:
    """A channel to ``target``: TLS trusting ``root_certificates`` when given, else plaintext."""
    if root_certificates is None:
        return grpc.aio.insecure_channel(target)
    credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
    return grpc.aio.secure_channel(target, credentials)


def _raw_bytes(item: InferInput) -> bytes:
    if item.datatype == "BF16":
        # bfloat16 is the upper half of a float32 (other servers define it; modelyard does not).
        halves = np.asarray(item.data, dtype="<f4").view("<u4") >> 16
        return halves.astype("<u2").tobytes()
    if item.datatype == "BYTES":
        values = np.empty(len(item.data), dtype=object)
        values[:] = [_as_bytes(value) for value in item.data]
        return binary_bytes(InferOutput(item.name, "BYTES", item.shape, values))
    return np.asarray(item.data, dtype=numpy_dtype(item.datatype).newbyteorder("<")).tobytes()


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")
