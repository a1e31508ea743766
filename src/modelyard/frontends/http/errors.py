"""ErrorCode → HTTP status, the protocol's error body, and the one error handler.

Every REST answer to a failure comes from :func:`answer_error`: the infer fast path
calls it directly, every Starlette route through :func:`guarded`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import orjson
from starlette.requests import Request
from starlette.responses import Response

from modelyard.errors import ErrorCode, InternalError, ServerError, retry_after_value

log = logging.getLogger("modelyard.http")

Handler = Callable[[Request], Awaitable[Response]]
"""A Starlette request handler."""

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


def error_headers(exc: ServerError) -> dict[str, str]:
    """The headers of a JSON error answer: Retry-After when retryable, the auth scheme."""
    headers = {"content-type": "application/json"}
    if (retry_after := retry_after_value(exc)) is not None:
        headers["retry-after"] = retry_after
    if exc.code is ErrorCode.UNAUTHENTICATED:
        # RFC 6750: a 401 names the scheme the client should use.
        headers["www-authenticate"] = 'Bearer realm="modelyard"'
    return headers


def error_response(exc: ServerError) -> Response:
    """``{"error": message}`` with the code's status and, when retryable, Retry-After."""
    return Response(
        orjson.dumps({"error": exc.message}),
        status_code=HTTP_STATUS[exc.code],
        headers=error_headers(exc),
    )


def answer_error(exc: Exception, method: str, path: str) -> Response:
    """The response for ``exc`` raised while answering ``method path``.

    A :class:`ServerError` gets its code's status; anything unforeseen is logged with
    its traceback and becomes a 500 naming it, so the server keeps serving.
    """
    if isinstance(exc, ServerError):
        return error_response(exc)
    log.error("unhandled error in %s %s", method, path, exc_info=exc)
    return error_response(InternalError(f"internal error: {type(exc).__name__}: {exc}"))


def guarded(
    handler: Handler, answer: Callable[[Exception, str, str], Response] = answer_error
) -> Handler:
    """``handler`` with every exception answered by ``answer`` (:func:`answer_error`:
    the v2 error body; the OpenAI routes pass theirs)."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:  # the server must keep serving whatever happened
            return answer(exc, request.method, request.url.path)

    return wrapped
