"""Whole infer requests recognised in one read, before uvicorn's parser sees them.

The hot route's requests usually arrive as one segment: ``POST /v2/models/{m}/infer``,
a few headers and a small JSON body. Feeding them to httptools costs a Python callback
per header, per URL piece and per body chunk, a scope built in three steps and a URL
parse (about a quarter of the server's CPU per request at concurrency 1). This module
reads such a request with one ``find``, one ``split`` and one compiled match per header,
and says what the protocol needs to answer it (see
:mod:`~modelyard.frontends.http.connections`).

It recognises only what it can read exactly as uvicorn would; anything else (a partial
or pipelined read, a query string, percent-encoding, HTTP/1.0, chunked bodies,
``Expect``, ``Upgrade``, an unusual ``Connection``, a body over the limit, any byte
outside the strict header grammar) returns None, and the bytes go to httptools as
before, which answers them (or their errors) as it always did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = b"POST /v2/models/"
"""Every request this module can recognise starts with these bytes."""

# A path segment's characters that uvicorn passes through unchanged (no '%', '?', '#').
_SEGMENT = rb"[A-Za-z0-9._~!$&'()*+,;=:@-]+"
_TARGET = re.compile(rb"/v2/models/(" + _SEGMENT + rb")(?:/versions/(" + _SEGMENT + rb"))?/infer")
# RFC 9110 token, then a value of visible ASCII with inner spaces or tabs; the optional
# whitespace around the value is dropped, as llhttp does.
_HEADER = re.compile(
    rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?)[ \t]*"
)
_DECLINED = frozenset((b"transfer-encoding", b"expect", b"upgrade"))


@dataclass(slots=True)
class RawInfer:
    """One complete infer request, as uvicorn's scope and the handler would read it."""

    model: str
    version: str | None
    path: str
    raw_path: bytes
    headers: list[tuple[bytes, bytes]]
    """Names lower-cased, values trimmed, in order (the ASGI scope's ``headers``)."""
    body: bytes
    header_length: str | None
    """``Inference-Header-Content-Length`` (binary tensor extension), if sent."""
    timeout_ms: str | None
    """``X-Modelyard-Timeout-Ms``, if sent."""
    keep_alive: bool


def parse_raw_infer(data: bytes, max_body: int) -> RawInfer | None:
    """The infer request that ``data`` holds exactly, or None (see the module docstring).

    ``max_body``: bodies over it are declined, so that the usual path answers 413.
    """
    if not data.startswith(PREFIX):
        return None
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = data[:end].split(b"\r\n")
    request_line = lines[0]
    if not request_line.endswith(b" HTTP/1.1"):
        return None
    raw_path = request_line[5:-9]
    target = _TARGET.fullmatch(raw_path)
    if target is None:
        return None
    headers: list[tuple[bytes, bytes]] = []
    length = -1
    header_length = timeout_ms = None
    keep_alive = True
    match = _HEADER.fullmatch
    for line in lines[1:]:
        header = match(line)
        if header is None:
            return None
        name = header[1].lower()
        value = header[2]
        if name == b"content-length":
            # At most 18 digits: int() of a longer one may raise (CPython's digit limit)
            # or exceed any body; httptools answers those as it always did.
            if length >= 0 or len(value) > 18 or not value.isdigit():
                return None
            length = int(value)
        elif name == b"inference-header-content-length":
            header_length = value.decode("latin-1")
        elif name == b"x-modelyard-timeout-ms":
            timeout_ms = value.decode("latin-1")
        elif name == b"connection":
            token = value.lower()
            if token == b"close":
                keep_alive = False
            elif token != b"keep-alive":
                return None
        elif name in _DECLINED:
            return None
        headers.append((name, value))
    start = end + 4
    if length < 0 or length > max_body or len(data) - start != length:
        return None
    version = target[2]
    return RawInfer(
        model=target[1].decode("ascii"),
        version=None if version is None else version.decode("ascii"),
        path=raw_path.decode("ascii"),
        raw_path=raw_path,
        headers=headers,
        body=data[start:],
        header_length=header_length,
        timeout_ms=timeout_ms,
        keep_alive=keep_alive,
    )
