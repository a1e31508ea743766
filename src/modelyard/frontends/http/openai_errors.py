"""OpenAI's error object on the wire, and which routes answer with it.

Routes under ``/v1/`` are the OpenAI-compatible API: every refusal there, the token
check's, the body limit's and an unknown route's included, is OpenAI's
``{"error": {"message", "type", "param", "code"}}`` so that OpenAI's clients read it.
"""

from __future__ import annotations

import logging

import orjson
from starlette.responses import Response

from modelyard.errors import InternalError, ServerError
from modelyard.frontends.http.errors import HTTP_STATUS, error_headers, error_response
from modelyard.protocol.openai_answers import error_object

log = logging.getLogger("modelyard.http")

OPENAI_PREFIX = "/v1/"
"""Every OpenAI-compatible route starts with this."""


def is_openai_path(path: str) -> bool:
    """Whether ``path`` belongs to the OpenAI-compatible API."""
    return path.startswith(OPENAI_PREFIX) or path in ("/tokenize", "/detokenize")


def error_response_at(path: str, exc: ServerError) -> Response:
    """The error answer for ``path``: OpenAI's object under ``/v1/``, else the protocol's."""
    return openai_error_response(exc) if is_openai_path(path) else error_response(exc)


def openai_error_response(exc: Exception, method: str = "", path: str = "") -> Response:
    """OpenAI's ``{"error": {...}}`` with the status of ``exc``'s kind (and Retry-After).

    Anything that is not a :class:`ServerError` is logged and answered as a 500.
    """
    if not isinstance(exc, ServerError):
        log.error("unhandled error in %s %s", method, path, exc_info=exc)
        exc = InternalError(f"internal error: {type(exc).__name__}: {exc}")
    return Response(
        orjson.dumps(error_object(exc)),
        status_code=HTTP_STATUS[exc.code],
        headers=error_headers(exc),
    )
