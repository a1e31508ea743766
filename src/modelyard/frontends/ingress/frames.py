"""Frames between an ingress process and the manager: one ASGI message per frame.

A frame is a 9-byte header (payload length, stream id, kind) and its payload, on a
SOCK_STREAM Unix socket pair. A stream is one HTTP request: the ingress sends its
head, body chunks and a disconnect; the manager answers with the response head and
body chunks. Request bodies (up to ``max_request_bytes``) exceed what one datagram of
the workers' SOCK_SEQPACKET channel may carry, so the tunnel has its own framing.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Mapping
from typing import Any, cast

import orjson

HEADER = struct.Struct("<IIB")
"""Payload length, stream id, kind."""

# Ingress → manager.
HELLO = 1
"""The ingress is serving; the payload is its process id (decimal ASCII)."""
REQUEST = 2
"""A request head: JSON of the ASGI scope's fields (see :func:`encode_scope`)."""
BODY = 3
"""A request body chunk: one flag byte (1: more follows) and the bytes."""
DISCONNECT = 4
"""The client went away."""
# Manager → ingress.
START = 5
"""The response head: JSON ``[status, [[name, value], ...]]``."""
RESPONSE_BODY = 6
"""A response body chunk: one flag byte (1: more follows) and the bytes."""

FrameHandler = Callable[[int, int, bytes], None]
"""Called with (stream id, kind, payload) for each complete frame."""


def frame(stream: int, kind: int, payload: bytes = b"") -> bytes:
    """One frame's bytes."""
    return HEADER.pack(len(payload), stream, kind) + payload


def body_frame(stream: int, kind: int, body: bytes, more: bool) -> bytes:
    """A ``BODY`` or ``RESPONSE_BODY`` frame."""
    return HEADER.pack(len(body) + 1, stream, kind) + (b"\x01" if more else b"\x00") + body


def encode_scope(scope: Mapping[str, Any], ingress_pid: int) -> bytes:
    """The parts of an HTTP scope the manager's app reads, as JSON (bytes as latin-1)."""
    client = scope.get("client")
    return orjson.dumps(
        [
            scope["method"],
            scope.get("scheme", "http"),
            scope.get("http_version", "1.1"),
            scope["path"],
            scope.get("raw_path", b"").decode("latin-1"),
            scope.get("query_string", b"").decode("latin-1"),
            [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]],
            list(client) if client else None,
            list(scope["server"]) if scope.get("server") else None,
            ingress_pid,
        ]
    )


def decode_scope(payload: bytes) -> dict[str, Any]:
    """The ASGI scope the manager's app is called with."""
    method, scheme, version, path, raw, query, headers, client, server, pid = orjson.loads(payload)
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": version,
        "method": method,
        "scheme": scheme,
        "path": path,
        "raw_path": raw.encode("latin-1"),
        "query_string": query.encode("latin-1"),
        "root_path": "",
        "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers],
        "client": tuple(client) if client else None,
        "server": tuple(server) if server else None,
        "state": {"ingress_pid": pid},
    }


def encode_start(status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
    """A ``START`` payload."""
    return orjson.dumps([status, [[k.decode("latin-1"), v.decode("latin-1")] for k, v in headers]])


def decode_start(payload: bytes) -> tuple[int, list[tuple[bytes, bytes]]]:
    """``(status, headers)`` of a ``START`` payload."""
    status, headers = orjson.loads(payload)
    return status, [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]


class FrameProtocol(asyncio.Protocol):
    """Splits a byte stream into frames for ``on_frame``; ``on_lost`` when it closes."""

    def __init__(self, on_frame: FrameHandler, on_lost: Callable[[], None]) -> None:
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._buffer = bytearray()
        self._pending: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport for :meth:`write`."""
        # uvloop's transports do not derive from asyncio's classes: cast, not isinstance.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        """Hand every complete frame on; keep the rest for the next read."""
        buffer = self._buffer
        buffer += data
        start = 0
        size = len(buffer)
        header = HEADER.size
        while size - start >= header:
            length, stream, kind = HEADER.unpack_from(buffer, start)
            end = start + header + length
            if end > size:
                break
            self._on_frame(stream, kind, bytes(buffer[start + header : end]))
            start = end
        if start:
            del buffer[:start]

    def connection_lost(self, exc: Exception | None) -> None:
        """The other process closed its end or exited."""
        self.transport = None
        self._on_lost()

    def write(self, data: bytes) -> bool:
        """Send bytes at the end of this loop iteration; False when the channel has
        closed (the bytes are dropped).

        Frames written in one iteration leave in one system call: under load many
        requests finish per iteration, and a send per frame was the tunnel's largest
        cost in profiles.
        """
        transport = self.transport
        if transport is None or transport.is_closing():
            return False
        pending = self._pending
        if not pending:
            asyncio.get_running_loop().call_soon(self._flush)
        pending.append(data)
        return True

    def _flush(self) -> None:
        pending = self._pending
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)
