"""ErrorCode → HTTP status, and the protocol's error body."""

from __future__ import annotations

import orjson
from starlette.responses import Response

from modelyard.errors import ErrorCode, ServerError, retry_after_value

HTTP_STATUS: dict[ErrorCode, int] = {
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


def error_response(exc: ServerError) -> Response:
    """``{"error": message}`` with the code's status and, when retryable, Retry-After."""
    headers = {"content-type": "application/json"}
    if (retry_after := retry_after_value(exc)) is not None:
        headers["retry-after"] = retry_after
    if exc.code is ErrorCode.UNAUTHENTICATED:
        # RFC 6750: a 401 names the scheme the client should use.
        headers["www-authenticate"] = 'Bearer realm="modelyard"'
    return Response(
        orjson.dumps({"error": exc.message}),
        status_code=HTTP_STATUS[exc.code],
        headers=headers,
    )
