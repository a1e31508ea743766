"""Request bodies in, JSON bodies out: the one body reader of the REST front end.

The infer fast path and every Starlette route read bodies here, so the limit, the
``Content-Length`` check and a client leaving mid-body are handled one way.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive

from modelyard.errors import InvalidInputError, PayloadTooLargeError, RequestCancelledError
from modelyard.frontends.http.offload import decode_off_loop, gate
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


async def read_body(
    receive: Receive,
    limit: int | None,
    declared: int = -1,
    encoding: bytes | None = None,
    client: str | None = None,
) -> bytes:
    """The whole body from ``receive``, refused once over ``limit`` bytes (None: the
    route's :class:`~modelyard.frontends.http.limits.BodyLimit` already bounds it).

    ``declared`` is the ``Content-Length`` (-1: none); a body declared over the limit is
    refused before a byte is read. A client that disconnects mid-body gets
    RequestCancelledError, which nobody reads but which keeps the logs quiet.
    ``encoding`` is the ``Content-Encoding`` (gzip or deflate: inflated off the event
    loop, within ``client``'s share, its output bounded by ``limit`` as it inflates).
    """
    wbits = content_coding(encoding, limit)
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
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if wbits is None or limit is None:
        return body
    return await gate().run(client, inflate, body, wbits, limit)


def content_coding(encoding: bytes | None, limit: int | None) -> int | None:
    """zlib's ``wbits`` for a ``Content-Encoding`` (None: identity); refuses the rest."""
    if encoding is None:
        return None
    name = encoding.strip().lower()
    if name in (b"", b"identity"):
        return None
    if name not in _CODINGS:
        raise InvalidInputError(
            f"Content-Encoding {name.decode('latin-1')!r} is not supported "
            "(gzip, deflate or identity, one coding)"
        )
    if limit is None:
        raise InvalidInputError("this route takes no Content-Encoding")
    return _CODINGS[name]


_GZIP = 16 + zlib.MAX_WBITS
_CODINGS = {b"gzip": _GZIP, b"x-gzip": _GZIP, b"deflate": zlib.MAX_WBITS}


_INFLATE_STEP = 1024 * 1024
"""Output bytes per zlib call: zlib runs without the interpreter lock, and between calls
the loop gets it back (one call for the whole body would hold it while the result is
assembled: a quarter of a second for 64 MiB)."""


def inflate(body: bytes, wbits: int, limit: int) -> bytes:
    """``body`` inflated; PayloadTooLargeError as soon as the output passes ``limit``
    (a bomb never costs more than ``limit`` bytes, and what it inflated is dropped)."""
    inflater = zlib.decompressobj(wbits)
    chunks: list[bytes] = []
    size = 0
    data = body
    try:
        while not inflater.eof:
            out = inflater.decompress(data, _INFLATE_STEP)
            size += len(out)
            if size > limit:
                raise PayloadTooLargeError(
                    f"request body inflates past the {limit}-byte limit (max_request_mb)"
                )
            chunks.append(out)
            data = inflater.unconsumed_tail
            if not out and not data:
                break  # the input ended before the stream did
    except zlib.error as exc:
        raise InvalidInputError(f"request body is not a valid compressed stream: {exc}") from None
    if not inflater.eof or inflater.unused_data:
        raise InvalidInputError("request body is a truncated or padded compressed stream")
    return b"".join(chunks)


async def read_json(
    request: Request, limit: int | None = None, *, allow_empty: bool = True
) -> dict[str, Any]:
    """The body as a JSON object (``{}`` for an empty body when ``allow_empty``)."""
    client = request.client.host if request.client else None
    encoding = content_encoding(request.headers.raw)
    body = await read_body(request.receive, limit, declared_length(request), encoding, client)
    parse = functools.partial(json_object, allow_empty=allow_empty)
    return await decode_off_loop(client, len(body), parse, body)


def content_encoding(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The request's ``Content-Encoding`` value, if it has one."""
    for key, value in headers:
        if key == b"content-encoding":
            return value
    return None
