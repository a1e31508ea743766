"""The HTTP status table covers every ErrorCode, as the gRPC one does (test_errors.py)."""

from __future__ import annotations

import pytest

from modelyard.errors import ErrorCode, ServerError
from modelyard.frontends.http.errors import HTTP_STATUS, answer_error, error_response

EXPECTED: dict[ErrorCode, int] = {
    ErrorCode.MODEL_NOT_FOUND: 404,
    ErrorCode.INVALID_INPUT: 400,
    ErrorCode.MODEL_NOT_READY: 503,
    ErrorCode.STATE_CONFLICT: 409,
    ErrorCode.OVERLOADED: 429,
    ErrorCode.MEMORY_BUDGET: 503,
    ErrorCode.DEADLINE_EXCEEDED: 504,
    ErrorCode.CANCELLED: 499,
    ErrorCode.WORKER_CRASHED: 503,
    ErrorCode.MODEL_LOAD_FAILED: 503,
    ErrorCode.CIRCUIT_OPEN: 503,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.NOT_SUPPORTED: 501,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.INTERNAL: 500,
}


def test_every_error_code_has_an_http_status() -> None:
    assert set(HTTP_STATUS) == set(ErrorCode)


@pytest.mark.parametrize("code", list(ErrorCode), ids=[c.value for c in ErrorCode])
def test_status_of_each_code(code: ErrorCode) -> None:
    # Every class of a code answers alike; a subclass per code covers codes with no class.
    error_class = type(f"Error_{code.value}", (ServerError,), {"code": code})
    exc: ServerError = error_class("boom")
    response = error_response(exc)
    assert response.status_code == EXPECTED[code]
    assert response.body == b'{"error":"boom"}'


def test_an_unforeseen_error_is_a_500_naming_it() -> None:
    response = answer_error(KeyError("x"), "GET", "/v2")
    assert response.status_code == 500
    assert response.body == b'{"error":"internal error: KeyError: \'x\'"}'
