"""The HTTP/2 side of a gRPC connection: frames, streams, flow control, lifetime.

The protocol runs in ``data_received``: frames are parsed from one buffer and a request's
headers and body are collected per stream. What a stream means is left to a subclass
(:class:`modelyard.frontends.grpc.connection.GrpcConnection`), through four hooks: its
headers arrived, its body announces too large a message, its body is over the limit, the
client half-closed it. Flow control is honoured both ways; replies go out through
:meth:`Http2Connection.finish` and :meth:`Http2Connection.send_data`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import hpack
from hpack.exceptions import HPACKError

from modelyard.frontends.grpc import wire
from modelyard.frontends.grpc.h2_stream import ProtocolFailure, Stream, unpad
from modelyard.frontends.grpc.rpc import ServerState

log = logging.getLogger(__name__)
# hpack logs every decoded header at DEBUG, tokens included: keep it quiet whatever the
# server's log level (and its per-header logging calls cheap).
logging.getLogger("hpack").setLevel(logging.WARNING)

RECEIVE_WINDOW = 1 << 22
"""Each stream's and the connection's receive window: 4 MiB, replenished at half."""
MAX_FRAME = 1 << 20
"""The largest frame the server accepts (advertised in its SETTINGS)."""
MAX_HEADER_BLOCK = 1 << 16
"""A header block (HEADERS and its CONTINUATIONs) beyond this closes the connection."""
MAX_HEADER_LIST = 16_384
MAX_RESETS_PER_S = 200
"""Running calls a client may reset in one second before its connection is closed."""
LINGER_S = 2.0
"""After a connection-level error, how long the peer's bytes are drained before closing."""


class Http2Connection(asyncio.Protocol):
    """The server side of one HTTP/2 connection; subclasses give streams a meaning."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.preface_seen = False
        self.decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST)
        self.streams: dict[int, Stream] = {}
        self.last_stream_id = 0
        self.continuing: Stream | None = None
        self.peer_window = wire.DEFAULT_WINDOW
        self.peer_initial_window = wire.DEFAULT_WINDOW
        self.peer_max_frame = wire.DEFAULT_MAX_FRAME
        self.recv_unacked = 0
        self.window_opened = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()
        self.closing = False
        self.timer: asyncio.TimerHandle | None = None
        self.resets, self.resets_since = 0, 0.0
        self.aborted = False

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)
        self.state.connections.add(self)
        limits = self.state.limits
        self.transport.write(
            wire.settings_frame(
                {
                    wire.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
                    wire.INITIAL_WINDOW_SIZE: RECEIVE_WINDOW,
                    wire.MAX_FRAME_SIZE: MAX_FRAME,
                    wire.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
                }
            )
            + wire.window_update(0, RECEIVE_WINDOW - wire.DEFAULT_WINDOW)
        )
        # A client that never completes its preface is dropped (a silent client).
        self.timer = self.loop.call_later(limits.handshake_timeout_s, self._silent)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.state.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()
        for stream in self.streams.values():
            if stream.task is not None:
                stream.task.cancel()
        self.streams.clear()
        self.window_opened.set()
        self.writable.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        if self.aborted:
            return  # lingering after a GOAWAY: what the peer still sends is dropped
        buf = self.buffer
        buf += data
        try:
            if not self.preface_seen:
                if len(buf) < len(wire.PREFACE):
                    if not wire.PREFACE.startswith(bytes(buf)):
                        raise ProtocolFailure(wire.PROTOCOL_ERROR, "not an HTTP/2 preface")
                    return
                if buf[: len(wire.PREFACE)] != wire.PREFACE:
                    raise ProtocolFailure(wire.PROTOCOL_ERROR, "not an HTTP/2 preface")
                del buf[: len(wire.PREFACE)]
                self.preface_seen = True
                self._busy()
                self._idle_from_now()
            pos, end = 0, len(buf)
            while end - pos >= 9:
                word, flags, stream_id = wire.FRAME_HEADER.unpack_from(buf, pos)
                length = word >> 8
                if length > MAX_FRAME:
                    raise ProtocolFailure(wire.FRAME_SIZE_ERROR, "frame too large")
                if end - pos - 9 < length:
                    break
                payload = bytes(buf[pos + 9 : pos + 9 + length])
                pos += 9 + length
                self._frame(word & 0xFF, flags, stream_id & 0x7FFFFFFF, payload)
            del buf[:pos]
        except ProtocolFailure as exc:
            self._abort(exc.code, str(exc))
        except Exception:
            log.exception("gRPC connection failed on an unexpected error")
            self._abort(wire.INTERNAL_ERROR, "internal error")

    # ------------------------------------------------------------------ frames

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self.continuing is not None and kind != wire.CONTINUATION:
            raise ProtocolFailure(wire.PROTOCOL_ERROR, "header block interrupted")
        if kind == wire.DATA:
            self._data(flags, stream_id, payload)
        elif kind == wire.HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == wire.CONTINUATION:
            stream = self.continuing
            if stream is None or stream.id != stream_id:
                raise ProtocolFailure(wire.PROTOCOL_ERROR, "unexpected CONTINUATION")
            self._header_fragment(stream, flags, payload)
        elif kind == wire.SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == wire.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == wire.PING:
            if len(payload) != 8:
                raise ProtocolFailure(wire.FRAME_SIZE_ERROR, "PING must carry 8 bytes")
            if not flags & wire.ACK:
                self._write(wire.frame(wire.PING, wire.ACK, 0, payload))
        elif kind == wire.RST_STREAM:
            self._reset(stream_id)
        elif kind == wire.GOAWAY:
            self.closing = True
            if not self.streams:
                self._close()
        elif kind == wire.PUSH_PROMISE:
            raise ProtocolFailure(wire.PROTOCOL_ERROR, "clients cannot push")
        # PRIORITY and unknown frame types are ignored, as RFC 9113 says.

    def _reset(self, stream_id: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is not None and stream.task is not None:
            # The client gave up on the call: cancel its work; but a flood of such resets
            # (HTTP/2 "rapid reset", CVE-2023-44487) ends the connection.
            stream.task.cancel()
            now = self.loop.time()
            if now - self.resets_since > 1.0:
                self.resets_since, self.resets = now, 0
            self.resets += 1
            if self.resets > MAX_RESETS_PER_S:
                raise ProtocolFailure(wire.ENHANCE_YOUR_CALM, "too many calls reset")
        self._idle_from_now()

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0 or len(payload) % 6:
            raise ProtocolFailure(wire.PROTOCOL_ERROR, "malformed SETTINGS")
        if flags & wire.ACK:
            return
        for key, value in wire.parse_settings(payload):
            if key == wire.INITIAL_WINDOW_SIZE:
                if value > wire.MAX_WINDOW:
                    raise ProtocolFailure(wire.FLOW_CONTROL_ERROR, "window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == wire.MAX_FRAME_SIZE:
                if not wire.DEFAULT_MAX_FRAME <= value <= (1 << 24) - 1:
                    raise ProtocolFailure(wire.PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
                self.peer_max_frame = value
            elif key == wire.HEADER_TABLE_SIZE:
                pass  # the server's header blocks never use the dynamic table
        self._write(wire.frame(wire.SETTINGS, wire.ACK, 0))
        self.window_opened.set()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolFailure(wire.FRAME_SIZE_ERROR, "WINDOW_UPDATE must carry 4 bytes")
        increment = wire.u32(payload) & 0x7FFFFFFF
        if stream_id == 0:
            self.peer_window += increment
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            stream.send_window += increment
        self.window_opened.set()

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id % 2 == 0:
            raise ProtocolFailure(wire.PROTOCOL_ERROR, "client streams have odd ids")
        payload = unpad(flags, payload)
        if flags & wire.PRIORITY_FLAG:
            payload = payload[5:]
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id <= self.last_stream_id:
                # Trailers or a late frame for a stream the server has finished with;
                # the header block still has to go through the decoder (its table).
                finished = Stream(stream_id, 0)
                finished.headers = []
                self._header_fragment(finished, flags, payload)
                return
            self.last_stream_id = stream_id
            stream = Stream(stream_id, self.peer_initial_window)
            if self.state.draining or self.closing:
                self._write(wire.rst_stream(stream_id, wire.REFUSED_STREAM))
                stream.closed_remote = True  # decode the block, then drop the stream
            elif len(self.streams) >= self.state.limits.max_concurrent_streams:
                self._write(wire.rst_stream(stream_id, wire.REFUSED_STREAM))
                stream.closed_remote = True
            else:
                self.streams[stream_id] = stream
                self._busy()
        elif stream.headers is not None and not flags & wire.END_STREAM:
            raise ProtocolFailure(wire.PROTOCOL_ERROR, "trailers must end the stream")
        if flags & wire.END_STREAM:
            stream.closed_remote = True
        self._header_fragment(stream, flags, payload)

    def _header_fragment(self, stream: Stream, flags: int, payload: bytes) -> None:
        stream.block += payload
        if len(stream.block) > MAX_HEADER_BLOCK:
            raise ProtocolFailure(wire.ENHANCE_YOUR_CALM, "header block too large")
        if not flags & wire.END_HEADERS:
            self.continuing = stream
            return
        self.continuing = None
        headers = self._decode(bytes(stream.block))
        stream.block = bytearray()
        if stream.id not in self.streams:
            return  # a refused or finished stream: its block only updated the decoder
        if stream.headers is not None:
            # Request trailers: their END_STREAM completes the request.
            if stream.closed_remote and stream.task is None:
                self._end_of_request(stream)
            return
        stream.headers = headers
        self._begin(stream)
        if stream.closed_remote and stream.id in self.streams:
            self._end_of_request(stream)

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        try:
            headers = cast(list[tuple[bytes, bytes]], self.decoder.decode(block, raw=True))
        except HPACKError as exc:
            raise ProtocolFailure(wire.COMPRESSION_ERROR, f"bad header block: {exc}") from None
        return headers

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self.recv_unacked += len(payload)
        if self.recv_unacked >= RECEIVE_WINDOW // 2:
            self._write(wire.window_update(0, self.recv_unacked))
            self.recv_unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None or stream.closed_remote:
            if stream_id > self.last_stream_id:
                raise ProtocolFailure(wire.PROTOCOL_ERROR, "DATA on an idle stream")
            return
        data = unpad(flags, payload)
        stream.body += data
        if len(stream.body) > self.state.limits.max_message_bytes + 5 or (
            len(stream.body) - len(data) < 5 and self._too_large(stream)
        ):
            self._refuse_body(stream)
            return
        if flags & wire.END_STREAM:
            stream.closed_remote = True
            self._end_of_request(stream)
        elif len(payload):
            stream.recv_unacked += len(payload)
            if stream.recv_unacked >= RECEIVE_WINDOW // 2:
                self._write(wire.window_update(stream_id, stream.recv_unacked))
                stream.recv_unacked = 0

    # ------------------------------------------------------------------ hooks

    def _begin(self, stream: Stream) -> None:
        """A new stream's headers arrived (``stream.headers``)."""
        raise NotImplementedError

    def _too_large(self, stream: Stream) -> bool:
        """Whether the body's first bytes already announce a message over the limit."""
        raise NotImplementedError

    def _refuse_body(self, stream: Stream) -> None:
        """End a stream whose body is over the message limit."""
        raise NotImplementedError

    def _end_of_request(self, stream: Stream) -> None:
        """The client half-closed the stream: its body is complete."""
        raise NotImplementedError

    # ------------------------------------------------------------------ replies

    async def send_data(self, stream: Stream, data: bytes) -> bool:
        """Send ``data`` as the flow-control windows allow; False when the stream went away."""
        view = memoryview(data)
        while view:
            if self.closing or self.streams.get(stream.id) is not stream:
                return False
            room = min(stream.send_window, self.peer_window, self.peer_max_frame, len(view))
            if room <= 0:
                self.window_opened.clear()
                await self.window_opened.wait()
                continue
            await self.writable.wait()
            stream.send_window -= room
            self.peer_window -= room
            self._write(wire.frame(wire.DATA, 0, stream.id, bytes(view[:room])))
            view = view[room:]
        return True

    def finish(
        self, stream: Stream, trailers: bytes, *, headers: bool = False, before: bytes = b""
    ) -> None:
        """End the stream with ``trailers`` (as a trailers-only reply with ``headers``),
        after the frames in ``before``."""
        if self.streams.pop(stream.id, None) is None:
            return
        block = wire.RESPONSE_HEADERS + trailers if headers else trailers
        flags = wire.END_HEADERS | wire.END_STREAM
        out = before + wire.frame(wire.HEADERS, flags, stream.id, block)
        if not stream.closed_remote:
            # The reply came before the request's end: tell the client to stop sending.
            out += wire.rst_stream(stream.id, wire.NO_ERROR)
        self._write(out)
        self._idle_from_now()
        if self.closing and not self.streams:
            self._close()

    # ------------------------------------------------------------------ lifetime

    def _write(self, data: bytes) -> None:
        if self.aborted:
            return
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _busy(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _idle_from_now(self) -> None:
        """With no call open, close the connection after the idle limit."""
        if self.streams or self.timer is not None:
            return
        self.timer = self.loop.call_later(
            self.state.limits.max_connection_idle_s, self.shutdown, wire.NO_ERROR
        )

    def _silent(self) -> None:
        self.timer = None
        if not self.preface_seen:
            self._close()

    def shutdown(self, code: int = wire.NO_ERROR) -> None:
        """Send GOAWAY; close now when no call is open, else when the last one ends."""
        self.timer = None
        self.closing = True
        self._write(wire.goaway(self.last_stream_id, code))
        if not self.streams:
            self._close()

    def cancel_calls(self) -> None:
        """Cancel every call still running and close the connection."""
        for stream in list(self.streams.values()):
            if stream.task is not None:
                stream.task.cancel()
        self._close()

    def _abort(self, code: int, reason: str) -> None:
        log.debug("closing a gRPC connection: %s", reason)
        self._write(wire.goaway(self.last_stream_id, code, reason.encode()[:200]))
        self._linger()

    def _linger(self) -> None:
        """Half-close, then drop what the peer still sends until it closes or time is up.

        Closing a socket whose receive buffer holds unread bytes makes the kernel send a
        TCP reset, and a reset can reach the peer before it has read the GOAWAY, which
        then never arrives: the peer sees "connection reset" instead of the reason.
        """
        self.aborted = self.closing = True
        self.buffer.clear()
        for stream in self.streams.values():
            if stream.task is not None:
                stream.task.cancel()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self.timer = self.loop.call_later(LINGER_S, self._close)

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()
