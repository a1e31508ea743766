"""ErrorCode → gRPC status code: the gRPC front end's one error table (STYLE.md §4)."""

from __future__ import annotations

import grpc

from modelyard.errors import ErrorCode

GRPC_STATUS: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.MODEL_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.INVALID_INPUT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.MODEL_NOT_READY: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.STATE_CONFLICT: grpc.StatusCode.ABORTED,
    ErrorCode.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.MEMORY_BUDGET: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.WORKER_CRASHED: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.MODEL_LOAD_FAILED: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.CIRCUIT_OPEN: grpc.StatusCode.UNAVAILABLE,
    # gRPC itself answers RESOURCE_EXHAUSTED for a message over the size limit.
    ErrorCode.PAYLOAD_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.NOT_SUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
}
"""The gRPC status of every :class:`ErrorCode`; a unit test keeps it complete."""


def grpc_status(code: ErrorCode) -> grpc.StatusCode:
    """The status for ``code``; INTERNAL for a code missing from the table."""
    return GRPC_STATUS.get(code, grpc.StatusCode.INTERNAL)
