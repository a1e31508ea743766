"""The thin gRPC servicer: convert the message, call the data plane, convert back.

Every unary handler runs inside :func:`_translated`, which turns a :class:`ServerError`
into the status of its code (``errors.GRPC_STATUS``) and anything unforeseen into
INTERNAL. ``ModelStreamInfer`` answers each request's error in the stream instead
(Triton's ``error_message``), so that one bad request does not end the others.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf import json_format

from modelyard.errors import (
    DeadlineExceededError,
    InternalError,
    InvalidInputError,
    ServerError,
    retry_after_value,
)
from modelyard.frontends.grpc.convert import (
    request_from_proto,
    response_to_proto,
)
from modelyard.frontends.grpc.errors import grpc_status
from modelyard.frontends.grpc.generate import (
    answer_response,
    chunk_response,
    generate_request,
)
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from modelyard.observability.log_settings import LogSettings as LogSettingsView
from modelyard.protocol.generate import GenerateChunk, GenerateRequest
from modelyard.protocol.load_parameters import check_load_parameters
from modelyard.protocol.names import check_model_name
from modelyard.protocol.types import (
    TIMEOUT_HEADER,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ServerMetadata,
    earliest,
    header_timeout_s,
)

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

_Self = TypeVar("_Self")
_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


class DataPlaneProtocol(Protocol):
    """What the servicer needs of ``modelyard.frontends.dataplane.DataPlane``."""

    def live(self) -> bool: ...

    def ready(self) -> bool: ...

    def model_ready(self, name: str, version: str | None) -> bool: ...

    def server_metadata(self) -> ServerMetadata: ...

    @property
    def log_settings(self) -> LogSettingsView: ...

    def statistics(self, name: str | None, version: str | None) -> dict[str, object]: ...

    async def model_config(
        self, name: str, version: str | None, timeout_s: float | None = None
    ) -> dict[str, Any]: ...

    async def model_metadata_loaded(
        self, name: str, version: str | None, timeout_s: float | None = None
    ) -> ModelMetadata: ...

    async def infer(self, request: InferRequest) -> InferResponse: ...

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]: ...

    async def load(self, name: str, config: object = None) -> None:
        """Load the model; ModelNotReadyError when it did not become ready."""

    async def unload(self, name: str) -> None: ...

    @property
    def max_request_elements(self) -> int: ...

    def check_response_bytes(self, size: int) -> None: ...

    def is_generative(self, name: str) -> bool: ...

    def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]: ...

    async def generate_text(self, request: GenerateRequest) -> dict[str, object]: ...


def _retry_metadata(exc: ServerError) -> tuple[tuple[str, str], ...]:
    retry_after = retry_after_value(exc)
    return () if retry_after is None else (("retry-after", retry_after),)


def _translated(
    handler: Callable[[_Self, _Req, Context], Awaitable[_Resp]],
) -> Callable[[_Self, _Req, Context], Awaitable[_Resp]]:
    """Run ``handler``; abort the RPC with the status its error maps to."""

    @functools.wraps(handler)
    async def wrapper(self: _Self, request: _Req, context: Context) -> _Resp:
        try:
            return await handler(self, request, context)
        except grpc.aio.AbortError:
            raise
        except ServerError as exc:
            await context.abort(grpc_status(exc.code), exc.message, _retry_metadata(exc))
        except Exception as exc:
            log.exception("gRPC %s failed with an unexpected error", handler.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc}")

    return wrapper


def _client_timeout_s(context: Context) -> float | None:
    """The shorter of the RPC's deadline and ``x-modelyard-timeout-ms`` metadata (None: neither)."""
    timeout_s: float | None = None
    for key, value in context.invocation_metadata() or ():
        if key == TIMEOUT_HEADER:
            timeout_s = earliest(timeout_s, header_timeout_s(value))
    remaining_s = context.time_remaining()
    if remaining_s is not None:
        if remaining_s <= 0:
            raise DeadlineExceededError("the client's deadline passed before the call began")
        timeout_s = earliest(timeout_s, remaining_s)
    return timeout_s


def _stream_error(request: pb.ModelInferRequest, message: str) -> pb.ModelStreamInferResponse:
    """A stream's answer to one failed request (the stream itself goes on)."""
    response = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
    return pb.ModelStreamInferResponse(error_message=message, infer_response=response)


def _version(version: str) -> str | None:
    return version or None


def _model_name(name: str) -> str:
    if not name:
        raise InvalidInputError("a model name is required")
    return check_model_name(name)


def _load_config(params: Mapping[str, pb.ModelRepositoryParameter]) -> str | None:
    """The ``config`` load parameter (a JSON string of model fields), as over REST;
    ``file:`` parameters are refused by name, as over REST."""
    check_load_parameters(params)
    if "config" not in params:
        return None
    param = params["config"]
    if param.WhichOneof("parameter_choice") != "string_param":
        raise InvalidInputError("load parameter 'config' must be a JSON string")
    config: str = param.string_param
    return config


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService`` over a protocol-neutral data plane."""

    def __init__(self, dataplane: DataPlaneProtocol) -> None:
        self.dataplane = dataplane

    @_translated
    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: Context
    ) -> pb.ServerLiveResponse:
        """Whether the process is up."""
        return pb.ServerLiveResponse(live=self.dataplane.live())

    @_translated
    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: Context
    ) -> pb.ServerReadyResponse:
        """Whether the server accepts inference requests."""
        return pb.ServerReadyResponse(ready=self.dataplane.ready())

    @_translated
    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: Context
    ) -> pb.ModelReadyResponse:
        """Whether that model version can serve now; NOT_FOUND for an unknown model."""
        ready = self.dataplane.model_ready(_model_name(request.name), _version(request.version))
        return pb.ModelReadyResponse(ready=ready)

    @_translated
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Context
    ) -> pb.ServerMetadataResponse:
        """Server name, version and protocol extensions."""
        meta = self.dataplane.server_metadata()
        return pb.ServerMetadataResponse(
            name=meta.name, version=meta.version, extensions=list(meta.extensions)
        )

    @_translated
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: Context
    ) -> pb.ModelMetadataResponse:
        """The model's versions, platform and tensors (loading it to learn them)."""
        meta = await self.dataplane.model_metadata_loaded(
            _model_name(request.name), _version(request.version), _client_timeout_s(context)
        )
        response = pb.ModelMetadataResponse(
            name=meta.name, versions=list(meta.versions), platform=meta.platform
        )
        for spec in meta.inputs:
            response.inputs.add(name=spec.name, datatype=spec.datatype, shape=spec.shape)
        for spec in meta.outputs:
            response.outputs.add(name=spec.name, datatype=spec.datatype, shape=spec.shape)
        return response

    @_translated
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: Context
    ) -> pb.ModelStatisticsResponse:
        """Triton's statistics extension: every model, one model, or one version."""
        name = _model_name(request.name) if request.name else None
        doc = self.dataplane.statistics(name, _version(request.version))
        return json_format.ParseDict(doc, pb.ModelStatisticsResponse())

    @_translated
    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: Context
    ) -> pb.ModelConfigResponse:
        """The model version's configuration in Triton's shape (loading it to learn its
        tensors, within the client's deadline)."""
        doc = await self.dataplane.model_config(
            _model_name(request.name), _version(request.version), _client_timeout_s(context)
        )
        return pb.ModelConfigResponse(config=json_format.ParseDict(doc, pb.ModelConfig()))

    @_translated
    async def LogSettings(
        self, request: pb.LogSettingsRequest, context: Context
    ) -> pb.LogSettingsResponse:
        """Triton's logging extension: change the settings given, answer them all."""
        changes = {}
        for key, value in request.settings.items():
            choice = value.WhichOneof("parameter_choice")
            if choice is None:
                raise InvalidInputError(f"log setting {key!r} has no value")
            changes[key] = getattr(value, choice)
        response = pb.LogSettingsResponse()
        for key, setting in self.dataplane.log_settings.update(changes).items():
            target = response.settings[key]
            if isinstance(setting, bool):
                target.bool_param = setting
            elif isinstance(setting, int):
                target.uint32_param = setting
            else:
                target.string_param = str(setting)
        return response

    @_translated
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: Context
    ) -> pb.ModelInferResponse:
        """Run one inference within the client's deadline: the RPC's own, the ``timeout``
        parameter and ``x-modelyard-timeout-ms`` metadata, whichever ends first."""
        return await self._infer(request, _client_timeout_s(context))

    async def _infer(
        self, request: pb.ModelInferRequest, timeout_s: float | None
    ) -> pb.ModelInferResponse:
        """One request answered whole (a generative model's text in one response)."""
        if self.dataplane.is_generative(request.model_name):
            gen = generate_request(request, self.dataplane.max_request_elements, timeout_s)
            message = answer_response(await self.dataplane.generate_text(gen), request.id)
        else:
            infer_request = request_from_proto(request, self.dataplane.max_request_elements)
            infer_request.timeout_s = earliest(infer_request.timeout_s, timeout_s)
            message = response_to_proto(await self.dataplane.infer(infer_request))
        self.dataplane.check_response_bytes(message.ByteSize())
        return message

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Context
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Triton's bidirectional streaming inference: requests are answered in order,
        one response each, or (generative models) one per piece of text, the last
        flagged ``triton_final_response``. A request's error is answered in the stream
        (``error_message``) and the stream goes on."""
        async for request in request_iterator:
            try:
                # Per request: what is left of the stream's deadline, and the metadata's
                # x-modelyard-timeout-ms as each request's own budget.
                timeout_s = _client_timeout_s(context)
                if self.dataplane.is_generative(request.model_name):
                    # Closed on the way out, also when the client cancels mid-answer:
                    # that stops the generation in the worker.
                    pieces = self._generate_stream(request, timeout_s)
                    async with contextlib.aclosing(pieces):
                        async for piece in pieces:
                            yield pb.ModelStreamInferResponse(infer_response=piece)
                else:
                    message = await self._infer(request, timeout_s)
                    yield pb.ModelStreamInferResponse(infer_response=message)
            except ServerError as exc:
                yield _stream_error(request, exc.message)
            except Exception as exc:
                log.exception("gRPC ModelStreamInfer failed with an unexpected error")
                yield _stream_error(request, f"internal error: {exc}")

    async def _generate_stream(
        self, request: pb.ModelInferRequest, timeout_s: float | None
    ) -> AsyncGenerator[pb.ModelInferResponse, None]:
        """A generative model's pieces of text, each as a response as soon as it exists,
        the last (the chunk with a finish reason) flagged final. Closing this generator
        (the client cancelled the stream) stops generation in the worker."""
        gen = generate_request(request, self.dataplane.max_request_elements, timeout_s)
        stream = self.dataplane.generate(gen)
        try:
            async for chunk in stream:
                final = chunk.finish_reason is not None
                yield chunk_response(chunk, gen.model, request.id, final=final)
                if final:
                    return
            raise InternalError(f"model {gen.model!r} ended its answer without a finish reason")
        finally:
            await stream.aclose()

    @_translated
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Context
    ) -> pb.RepositoryIndexResponse:
        """Every known model version and its state (``repository_name`` is ignored)."""
        response = pb.RepositoryIndexResponse()
        for row in self.dataplane.repository_index(ready_only=request.ready):
            response.models.add(
                name=str(row["name"]),
                version=str(row.get("version") or ""),
                state=str(row.get("state") or ""),
                reason=str(row.get("reason") or ""),
            )
        return response

    @_translated
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Context
    ) -> pb.RepositoryModelLoadResponse:
        """Load (or reload) a model; returns once it is ready, as the REST verb does."""
        name = _model_name(request.model_name)
        await self.dataplane.load(name, _load_config(request.parameters))
        return pb.RepositoryModelLoadResponse()

    @_translated
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Context
    ) -> pb.RepositoryModelUnloadResponse:
        """Unload every loaded version of a model (parameters are ignored)."""
        await self.dataplane.unload(_model_name(request.model_name))
        return pb.RepositoryModelUnloadResponse()
