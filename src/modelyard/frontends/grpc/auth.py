"""gRPC authentication: an interceptor mapping each RPC to its plane for the one authoriser.

The token travels as ``authorization: Bearer <token>`` call metadata, as over REST. A
refused call ends with UNAUTHENTICATED or PERMISSION_DENIED (``errors.GRPC_STATUS``)
before its handler runs, hence before its request message is deserialised; a method
missing from the table is management.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from modelyard.errors import ServerError
from modelyard.frontends.auth import Authorizer, Plane
from modelyard.frontends.grpc.errors import grpc_status

_SERVICE = "/inference.GRPCInferenceService/"
GRPC_PLANES: dict[str, Plane] = {
    "ServerLive": Plane.OPEN,
    "ServerReady": Plane.OPEN,
    "ServerMetadata": Plane.OPEN,
    "ModelReady": Plane.DATA,
    "ModelMetadata": Plane.DATA,
    "ModelInfer": Plane.DATA,
    "ModelStreamInfer": Plane.DATA,
    "ModelConfig": Plane.DATA,
    "ModelStatistics": Plane.DATA,
    "RepositoryIndex": Plane.MANAGEMENT,
    "RepositoryModelLoad": Plane.MANAGEMENT,
    "RepositoryModelUnload": Plane.MANAGEMENT,
    "LogSettings": Plane.MANAGEMENT,
}
"""The plane of each RPC of the inference service."""


def grpc_plane(method: str) -> Plane:
    """The plane of a full method name (``/package.Service/Method``)."""
    if not method.startswith(_SERVICE):
        return Plane.MANAGEMENT
    return GRPC_PLANES.get(method[len(_SERVICE) :], Plane.MANAGEMENT)


if TYPE_CHECKING:
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
    _Handler = grpc.RpcMethodHandler[Any, Any]
else:  # the runtime classes are not generic; only their stubs are
    _Interceptor = grpc.aio.ServerInterceptor
    _Handler = grpc.RpcMethodHandler


class AuthInterceptor(_Interceptor):
    """Checks every call's ``authorization`` metadata against its RPC's plane."""

    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler:
        """The RPC's own handler, or one that ends the call with the refusal."""
        plane = grpc_plane(handler_call_details.method)
        if self.authorizer.tokens_for(plane):
            authorization = None
            for key, value in handler_call_details.invocation_metadata or ():
                if key == "authorization":
                    authorization = value
                    break
            try:
                self.authorizer.check(plane, authorization)
            except ServerError as exc:
                handler = await continuation(handler_call_details)
                return _refusal(handler, exc) if handler is not None else handler
        return await continuation(handler_call_details)


def _refusal(handler: Any, exc: ServerError) -> _Handler:
    """A handler of the same kind and (de)serialisers as ``handler`` that aborts with ``exc``."""
    status, message = grpc_status(exc.code), exc.message

    async def abort(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(status, message)

    kind = (handler.request_streaming, handler.response_streaming)
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[kind]
    refusal: _Handler = make(
        abort,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
    return refusal
