"""Request bodies in, JSON bodies out: the one body reader of the REST front end.

The infer fast path and every Starlette route read bodies here, so the limit, the
``Content-Length`` check and a client leaving mid-body are handled one way.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive

from modelyard.errors import PayloadTooLargeError, RequestCancelledError
from modelyard.protocol.documents import json_object

JSON = {"content-type": "application/json"}


def json_response(doc: object, status: int = 200) -> Response:
    """A JSON response serialised with orjson (numpy arrays allowed)."""
    return Response(
        orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status, headers=JSON
    )


def declared_length(request: Request) -> int:
    """The request's ``Content-Length`` (-1 when absent or not a number)."""
    declared = request.headers.get("content-length")
    return int(declared) if declared is not None and declared.isdigit() else -1


async def read_body(receive: Receive, limit: int | None, declared: int = -1) -> bytes:
    """The whole body from ``receive``, refused once over ``limit`` bytes (None: the
    route's :class:`~modelyard.frontends.http.limits.BodyLimit` already bounds it).

    ``declared`` is the ``Content-Length`` (-1: none); a body declared over the limit is
    refused before a byte is read. A client that disconnects mid-body gets
    RequestCancelledError, which nobody reads but which keeps the logs quiet.
    """
    if limit is not None and declared > limit:
        raise PayloadTooLargeError(
            f"request body of {declared} bytes is over the {limit}-byte limit"
        )
    chunks: list[bytes] = []
    size = 0
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestCancelledError("the client disconnected while sending its request")
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            raise PayloadTooLargeError(f"request body is over the {limit}-byte limit")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def read_json(
    request: Request, limit: int | None = None, *, allow_empty: bool = True
) -> dict[str, Any]:
    """The body as a JSON object (``{}`` for an empty body when ``allow_empty``)."""
    body = await read_body(request.receive, limit, declared_length(request))
    return json_object(body, allow_empty=allow_empty)
