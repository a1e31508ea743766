"""One HTTP/2 stream's state, the connection-level failure, and frame padding."""

from __future__ import annotations

import asyncio

from modelyard.frontends.grpc import wire

__all__ = ["ProtocolFailure", "Stream", "unpad"]


class Stream:
    """One request's state: its header block, headers, body and send window."""

    __slots__ = (
        "block",
        "body",
        "closed_remote",
        "headers",
        "id",
        "recv_unacked",
        "send_window",
        "task",
    )

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.block = bytearray()
        self.headers: list[tuple[bytes, bytes]] | None = None
        self.body = bytearray()
        self.closed_remote = False
        self.recv_unacked = 0
        self.send_window = send_window
        self.task: asyncio.Task[None] | None = None


class ProtocolFailure(Exception):
    """A connection-level protocol error: GOAWAY with ``code``, then close."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def unpad(flags: int, payload: bytes) -> bytes:
    """A DATA or HEADERS payload without its padding."""
    if not flags & wire.PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolFailure(wire.PROTOCOL_ERROR, "bad padding")
    return payload[1 : len(payload) - payload[0]]
