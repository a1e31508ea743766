"""One HTTP/2 connection serving unary gRPC calls on the server's event loop.

When a call's headers arrive its method, content type and token are checked; when the
client half-closes the stream, its one message is decoded (inflated first when gzip or
deflate, never past the message limit) and its handler runs as a task. The reply
(headers, one message, trailers) usually goes out in one write. A reset stream or a
lost connection cancels its handler; a deadline (``grpc-timeout``) ends it with
DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib

import grpc

from modelyard.errors import ServerError
from modelyard.frontends.grpc import wire
from modelyard.frontends.grpc.errors import grpc_status
from modelyard.frontends.grpc.h2_stream import Stream
from modelyard.frontends.grpc.http2 import Http2Connection
from modelyard.frontends.grpc.rpc import Method, RpcContext, RpcError

log = logging.getLogger(__name__)

_ENCODINGS = {b"identity": 0, b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}
"""Accepted ``grpc-encoding`` values and their zlib window bits (replies go uncompressed)."""


class _Oversized(Exception):
    """A compressed message that inflates past the message limit."""


def _decompress(encoding: bytes, body: bytearray, limit: int) -> bytes:
    """The message of a compressed frame, inflated to at most ``limit`` bytes."""
    bits = _ENCODINGS.get(encoding, 0)
    if bits == 0:
        raise ValueError("the message is flagged compressed but grpc-encoding is identity")
    inflater = zlib.decompressobj(bits)
    # Bounded output: a small bomb must not inflate to gigabytes before the check.
    message = inflater.decompress(bytes(body[5:]), limit + 1)
    if len(message) > limit:
        raise _Oversized(f"Received message larger than max (over {limit} once inflated)")
    if not inflater.eof:
        raise ValueError("the compressed message is truncated")
    return message


class GrpcConnection(Http2Connection):
    """Unary gRPC calls over one HTTP/2 connection."""

    def _begin(self, stream: Stream) -> None:
        """Check a new call's headers: its method, content type and token."""
        headers = dict(stream.headers or ())
        method = self.state.methods.get(headers.get(b":path", b""))
        status: tuple[grpc.StatusCode, str] | None = None
        if headers.get(b":method") != b"POST":
            status = (grpc.StatusCode.UNIMPLEMENTED, "gRPC calls are POST requests")
        elif not headers.get(b"content-type", b"").startswith(b"application/grpc"):
            status = (grpc.StatusCode.INVALID_ARGUMENT, "content-type must be application/grpc")
        elif method is None:
            status = (grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        elif headers.get(b"grpc-encoding", b"identity") not in _ENCODINGS:
            status = (
                grpc.StatusCode.UNIMPLEMENTED,
                "grpc-encoding must be identity, gzip or deflate",
            )
        elif self.state.authorizer is not None and self.state.authorizer.tokens_for(method.plane):
            token = headers.get(b"authorization")
            try:
                self.state.authorizer.check(
                    method.plane, token.decode("latin-1") if token is not None else None
                )
            except ServerError as exc:
                status = (grpc_status(exc.code), exc.message)
        if status is not None:
            self.finish(stream, wire.status_trailers(*status), headers=True)

    def _end_of_request(self, stream: Stream) -> None:
        """The client half-closed: decode its one message and start the handler."""
        headers = stream.headers or []
        found = dict(headers)
        method = self.state.methods[found[b":path"]]
        body = stream.body
        problem = None
        message = b""
        if len(body) < 5 or wire.u32(body, 1) != len(body) - 5:
            problem = (grpc.StatusCode.INTERNAL, "a unary call carries exactly one message")
        elif body[0] == 0:
            message = bytes(body[5:])
        else:
            encoding = found.get(b"grpc-encoding", b"identity")
            try:
                message = _decompress(encoding, body, self.state.limits.max_message_bytes)
            except _Oversized as exc:
                problem = (grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            except (ValueError, zlib.error) as exc:
                problem = (grpc.StatusCode.INTERNAL, f"cannot decompress the message: {exc}")
        limit = self.state.limits.max_concurrent_rpcs
        if problem is None and limit is not None and self.state.active_rpcs >= limit:
            problem = (grpc.StatusCode.RESOURCE_EXHAUSTED, "Concurrent RPC limit exceeded!")
        if problem is not None:
            self.finish(stream, wire.status_trailers(*problem), headers=True)
            return
        deadline = None
        timeout = found.get(b"grpc-timeout")
        if timeout is not None:
            seconds = wire.parse_timeout(timeout)
            if seconds is not None:
                deadline = self.loop.time() + seconds
        metadata = tuple(
            (key.decode("latin-1"), value.decode("latin-1"))
            for key, value in headers
            if key[:1] != b":"
        )
        context = RpcContext(metadata, deadline, self.loop.time)
        self.state.active_rpcs += 1
        stream.task = self.loop.create_task(self._call(stream, method, message, context))

    async def _call(
        self, stream: Stream, method: Method, message: bytes, context: RpcContext
    ) -> None:
        status: tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]] | None = None
        try:
            try:
                request = method.deserialize(message)
            except Exception:
                raise RpcError(grpc.StatusCode.INTERNAL, "cannot decode the request") from None
            if context.deadline is None:
                response = await method.handler(request, context)
            else:
                async with asyncio.timeout_at(context.deadline):
                    response = await method.handler(request, context)
            payload: bytes = response.SerializeToString()
        except RpcError as exc:
            status = (exc.code, exc.details, exc.metadata)
        except TimeoutError:
            if context.deadline is None or self.loop.time() < context.deadline:
                log.exception("gRPC call failed with an unexpected timeout")
                status = (grpc.StatusCode.INTERNAL, "internal error: timeout", ())
            else:
                status = (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", ())
        except asyncio.CancelledError:
            return  # the client reset the stream or left; nobody awaits an answer
        except Exception as exc:
            log.exception("gRPC call failed with an unexpected error")
            status = (grpc.StatusCode.INTERNAL, f"internal error: {exc}", ())
        finally:
            self.state.active_rpcs -= 1
        if status is not None:
            self.finish(stream, wire.status_trailers(*status), headers=True)
            return
        limit = self.state.limits.max_message_bytes
        if len(payload) > limit:
            message_ = f"Sent message larger than max ({len(payload)} vs. {limit})"
            trailers = wire.status_trailers(grpc.StatusCode.RESOURCE_EXHAUSTED, message_)
            self.finish(stream, trailers, headers=True)
            return
        data = b"\x00" + len(payload).to_bytes(4, "big") + payload
        size = len(data)
        if size <= stream.send_window and size <= self.peer_window and size <= self.peer_max_frame:
            # The common case: headers, message and trailers in one write.
            stream.send_window -= size
            self.peer_window -= size
            before = wire.frame(
                wire.HEADERS, wire.END_HEADERS, stream.id, wire.RESPONSE_HEADERS
            ) + wire.frame(wire.DATA, 0, stream.id, data)
            self.finish(stream, wire.OK_TRAILERS, before=before)
            return
        self._write(wire.frame(wire.HEADERS, wire.END_HEADERS, stream.id, wire.RESPONSE_HEADERS))
        with contextlib.suppress(asyncio.CancelledError):
            if await self.send_data(stream, data):
                self.finish(stream, wire.OK_TRAILERS)

    def _too_large(self, stream: Stream) -> bool:
        return (
            len(stream.body) >= 5 and wire.u32(stream.body, 1) > self.state.limits.max_message_bytes
        )

    def _refuse_body(self, stream: Stream) -> None:
        size = wire.u32(stream.body, 1) if len(stream.body) >= 5 else len(stream.body)
        limit = self.state.limits.max_message_bytes
        message = f"Received message larger than max ({size} vs. {limit})"
        trailers = wire.status_trailers(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        self.finish(stream, trailers, headers=True)
