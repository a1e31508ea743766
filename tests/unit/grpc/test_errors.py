"""The gRPC error table covers every ErrorCode with the status STYLE.md §4 gives it."""

from __future__ import annotations

import grpc
import pytest

from modelyard.errors import ErrorCode
from modelyard.frontends.grpc.errors import GRPC_STATUS, grpc_status

EXPECTED: dict[ErrorCode, grpc.StatusCode] = {
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
    ErrorCode.PAYLOAD_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.NOT_SUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
}


def test_every_error_code_has_a_grpc_status() -> None:
    assert set(GRPC_STATUS) == set(ErrorCode)


@pytest.mark.parametrize("code", list(ErrorCode), ids=[c.value for c in ErrorCode])
def test_status_of_each_code(code: ErrorCode) -> None:
    assert GRPC_STATUS[code] is EXPECTED[code]
    assert grpc_status(code) is EXPECTED[code]
