"""A lean gRPC client for the load generator: ``ModelInfer`` over one hand-driven HTTP/2 connection.

The REST counterpart of :class:`modelyard.bench.client.RawHttpClient`: each request is a
pre-built header block and message written in one call, and the response is read only
as far as its ``grpc-status``. Every session shares one connection (as grpcio's channel
does), each call on its own stream. Like the raw REST client it sends no deadline (the
request timeout is kept on this side, and a late call is reset). ``grpc.aio``'s client
costs several times this CPU per call, which on a small machine the load generator takes
from the server it measures.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping

import grpc
import hpack

from modelyard.bench.client import ERROR_CONNECTION, ERROR_TIMEOUT, InferSession
from modelyard.bench.grpc_client import GrpcStubs, infer_request_bytes, load_grpc_stubs
from modelyard.bench.payload import Payload
from modelyard.frontends.grpc import wire

_STATUS_NAMES = {status.value[0]: status.name for status in grpc.StatusCode}
_WINDOW = 1 << 24


class _ClientConnection(asyncio.Protocol):
    """The client side of one HTTP/2 connection: streams resolve to a gRPC status or error."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.decoder = hpack.Decoder()
        self.calls: dict[int, asyncio.Future[str | None]] = {}
        self.statuses: dict[int, bytes] = {}
        self.block = bytearray()
        self.next_id = 1
        self.send_window = wire.DEFAULT_WINDOW
        self.initial_window = wire.DEFAULT_WINDOW
        self.unacked = 0
        self.opened = asyncio.Event()
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        settings = {wire.ENABLE_PUSH: 0, wire.INITIAL_WINDOW_SIZE: _WINDOW}
        transport.write(  # type: ignore[attr-defined]
            wire.PREFACE
            + wire.settings_frame(settings)
            + wire.window_update(0, _WINDOW - wire.DEFAULT_WINDOW)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        for future in self.calls.values():
            if not future.done():
                future.set_result(ERROR_CONNECTION)
        self.calls.clear()
        self.opened.set()

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        pos, end = 0, len(buf)
        while end - pos >= 9:
            word, flags, stream_id = wire.FRAME_HEADER.unpack_from(buf, pos)
            length = word >> 8
            if end - pos - 9 < length:
                break
            payload = bytes(buf[pos + 9 : pos + 9 + length])
            pos += 9 + length
            self._frame(word & 0xFF, flags, stream_id & 0x7FFFFFFF, payload)
        del buf[:pos]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == wire.DATA:
            self._data(flags, stream_id, payload)
        elif kind in (wire.HEADERS, wire.CONTINUATION):
            self._headers(kind, flags, stream_id, payload)
        elif kind == wire.SETTINGS and not flags & wire.ACK:
            for setting, amount in wire.parse_settings(payload):
                if setting == wire.INITIAL_WINDOW_SIZE:
                    self.initial_window = amount
            self._write(wire.frame(wire.SETTINGS, wire.ACK, 0))
            self.opened.set()
        elif kind == wire.WINDOW_UPDATE and stream_id == 0:
            self.send_window += wire.u32(payload) & 0x7FFFFFFF
            self.opened.set()
        elif kind == wire.PING and not flags & wire.ACK:
            self._write(wire.frame(wire.PING, wire.ACK, 0, payload))
        elif kind == wire.RST_STREAM:
            self._done(stream_id, ERROR_CONNECTION)
        elif kind == wire.GOAWAY:
            self.connection_lost(None)

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self.unacked += len(payload)
        if self.unacked >= _WINDOW // 2:
            self._write(wire.window_update(0, self.unacked))
            self.unacked = 0
        if flags & wire.END_STREAM:
            self._done(stream_id, ERROR_CONNECTION)

    def _headers(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == wire.HEADERS:
            if flags & wire.PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & wire.PRIORITY_FLAG:
                payload = payload[5:]
            self.block = bytearray(payload)
            if flags & wire.END_STREAM:
                self.statuses[stream_id] = b""
        else:
            self.block += payload
        if not flags & wire.END_HEADERS:
            return
        for key, value in self.decoder.decode(bytes(self.block), raw=True):
            if key == b"grpc-status":
                self.statuses[stream_id] = value
        status = self.statuses.pop(stream_id, None)
        if status is not None:
            self._done(stream_id, None if status == b"0" else _status_name(status))

    def _done(self, stream_id: int, outcome: str | None) -> None:
        future = self.calls.pop(stream_id, None)
        if future is not None and not future.done():
            future.set_result(outcome)

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    async def call(self, block: bytes, message: bytes, timeout_s: float) -> str | None:
        """Send one call; its gRPC status name, None for OK, or a timeout after ``timeout_s``."""
        # Requests are small: a call waits only for the connection window, whole.
        while self.send_window < len(message) or len(message) > self.initial_window:
            if self.lost:
                return ERROR_CONNECTION
            self.opened.clear()
            await self.opened.wait()
        if self.lost:
            return ERROR_CONNECTION
        stream_id, self.next_id = self.next_id, self.next_id + 2
        future: asyncio.Future[str | None] = self.loop.create_future()
        self.calls[stream_id] = future
        self.send_window -= len(message)
        self._write(
            wire.frame(wire.HEADERS, wire.END_HEADERS, stream_id, block)
            + wire.frame(wire.DATA, wire.END_STREAM, stream_id, message)
        )
        # A timer, not asyncio.wait_for: no extra task per call.
        timer = self.loop.call_later(timeout_s, self._expire, stream_id)
        try:
            return await future
        finally:
            timer.cancel()

    def _expire(self, stream_id: int) -> None:
        if stream_id in self.calls:
            self._write(wire.rst_stream(stream_id, wire.CANCEL))
            self._done(stream_id, ERROR_TIMEOUT)


def _status_name(value: bytes) -> str:
    try:
        return _STATUS_NAMES.get(int(value), value.decode("latin-1"))
    except ValueError:
        return "UNKNOWN"


class RawGrpcClient:
    """``ModelInfer`` calls over one HTTP/2 connection shared by every session."""

    def __init__(
        self,
        target: str,
        payloads: Mapping[str, Payload],
        *,
        timeout_s: float,
        stubs: GrpcStubs | None = None,
        metadata: tuple[tuple[str, str], ...] | None = None,
        root_certificates: bytes | None = None,
    ) -> None:
        stubs = stubs or load_grpc_stubs()
        host, _, port = target.rpartition(":")
        self._host, self._port = host.strip("[]"), int(port)
        self._timeout_s = timeout_s
        self._ssl: ssl.SSLContext | None = None
        if root_certificates is not None:
            self._ssl = ssl.create_default_context(cadata=root_certificates.decode("ascii"))
            self._ssl.set_alpn_protocols(["h2"])
        scheme = b"https" if self._ssl is not None else b"http"
        path = f"/{stubs.service}/ModelInfer".encode()
        block = (
            b"\x83"  # :method POST (static entry 3)
            + wire.literal(b":scheme", scheme)
            + wire.literal(b":path", path)
            + wire.literal(b":authority", target.encode())
            + wire.literal(b"content-type", b"application/grpc")
            + wire.literal(b"te", b"trailers")
        )
        for key, value in metadata or ():
            block += wire.literal(key.lower().encode(), value.encode("latin-1"))
        self._block = block
        self._messages = {
            model: b"\x00" + len(data).to_bytes(4, "big") + data
            for model, data in (
                (model, infer_request_bytes(stubs, payload)) for model, payload in payloads.items()
            )
        }
        self._connection: _ClientConnection | None = None
        self._connecting = asyncio.Lock()

    async def connection(self) -> _ClientConnection | None:
        """The shared connection, opened on first use (None when it cannot be opened)."""
        if self._connection is not None and not self._connection.lost:
            return self._connection
        async with self._connecting:
            if self._connection is None or self._connection.lost:
                loop = asyncio.get_running_loop()
                try:
                    _, protocol = await loop.create_connection(
                        _ClientConnection,
                        self._host,
                        self._port,
                        ssl=self._ssl,
                        server_hostname=self._host if self._ssl is not None else None,
                    )
                except OSError:
                    return None
                self._connection = protocol
        return self._connection

    def session(self) -> InferSession:
        """A session over the shared connection."""
        return _RawGrpcSession(self)

    async def infer(self, model: str) -> str | None:
        """One call with ``model``'s payload: None, or the error's name."""
        connection = await self.connection()
        if connection is None:
            return ERROR_CONNECTION
        return await connection.call(self._block, self._messages[model], self._timeout_s)

    async def close(self) -> None:
        """Close the connection."""
        if self._connection is not None and self._connection.transport is not None:
            self._connection.transport.close()


class _RawGrpcSession:
    def __init__(self, client: RawGrpcClient) -> None:
        self._client = client

    async def infer(self, model: str) -> str | None:
        return await self._client.infer(model)
