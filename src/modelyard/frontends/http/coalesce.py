"""A transport that joins the writes of one loop turn into one.

uvicorn's ASGI ``send`` writes a response's head and its body apart: two system calls
per answer, and a client that may wake twice. Given to uvicorn's protocol in place of
asyncio's transport (the ``asyncio.Transport`` interface, nothing more), this wrapper
holds the writes made during one turn of the event loop and hands them to the real
transport together at the end of the turn: one write for a small answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

_JOIN_BELOW_BYTES = 64 * 1024
"""Writes up to this size in all are joined into one buffer; larger ones go to
``writelines`` uncopied."""


class CoalescingTransport(asyncio.Transport):
    """``inner`` with the writes of one loop turn handed over together."""

    def __init__(self, inner: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(inner.get_extra_info("extra") or {})
        self._inner = inner
        self._loop = loop
        self._pending: list[bytes] = []
        self._scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Hold ``data`` until the end of this loop turn."""
        if not data:
            return
        self._pending.append(bytes(data) if not isinstance(data, bytes) else data)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def writelines(self, list_of_data: Any) -> None:
        """Hold each buffer until the end of this loop turn."""
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Hand what is held to the real transport now."""
        self._scheduled = False
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if self._inner.is_closing():
            return
        if len(pending) == 1:
            self._inner.write(pending[0])
        elif sum(map(len, pending)) < _JOIN_BELOW_BYTES:
            self._inner.write(b"".join(pending))
        else:
            self._inner.writelines(pending)

    def close(self) -> None:
        """Write what is held, then close."""
        self.flush()
        self._inner.close()

    def abort(self) -> None:
        """Drop what is held and close at once."""
        self._pending = []
        self._inner.abort()

    def write_eof(self) -> None:
        """Write what is held, then half-close."""
        self.flush()
        self._inner.write_eof()

    def can_write_eof(self) -> bool:
        """As the real transport."""
        return self._inner.can_write_eof()

    def is_closing(self) -> bool:
        """As the real transport."""
        return self._inner.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """As the real transport (socket, peer and TLS details)."""
        return self._inner.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        """As the real transport (a WebSocket upgrade hands the connection on)."""
        self.flush()
        self._inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        """As the real transport."""
        return self._inner.get_protocol()

    def pause_reading(self) -> None:
        """As the real transport."""
        self._inner.pause_reading()

    def resume_reading(self) -> None:
        """As the real transport."""
        self._inner.resume_reading()

    def is_reading(self) -> bool:
        """As the real transport."""
        return self._inner.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """As the real transport."""
        self._inner.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        """The real transport's buffer, plus what is held."""
        return self._inner.get_write_buffer_size() + sum(map(len, self._pending))

    def get_write_buffer_limits(self) -> tuple[int, int]:
        """As the real transport."""
        return self._inner.get_write_buffer_limits()
