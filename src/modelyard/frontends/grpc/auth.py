"""gRPC authentication: the plane of each RPC, for the one authoriser.

The token travels as ``authorization: Bearer <token>`` call metadata, as over REST. The
connection checks it when a call's headers arrive (``connection.GrpcConnection``); a
refused call ends with UNAUTHENTICATED or PERMISSION_DENIED (``errors.GRPC_STATUS``)
before its message is read or its handler runs; a method missing from the table is
management.
"""

from __future__ import annotations

from modelyard.frontends.auth import Plane

_SERVICE = "/inference.GRPCInferenceService/"
GRPC_PLANES: dict[str, Plane] = {
    "ServerLive": Plane.OPEN,
    "ServerReady": Plane.OPEN,
    "ServerMetadata": Plane.OPEN,
    "ModelReady": Plane.DATA,
    "ModelMetadata": Plane.DATA,
    "ModelInfer": Plane.DATA,
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
