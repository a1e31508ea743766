"""The gRPC server's HTTP/2 layer: flow control, cancellation, deadlines, limits, lifetime.

Driven both by grpcio's own client and by frames written by hand (127.0.0.1:0), against a
small data plane whose ``infer`` can be told to hang.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import hpack
import numpy as np
import pytest

from modelyard.frontends.grpc import wire
from modelyard.frontends.grpc.convert import request_to_proto, response_from_proto
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from modelyard.frontends.grpc.server import start_grpc_server, stop_grpc_server
from modelyard.observability.log_settings import LogSettings
from modelyard.protocol.types import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ServerMetadata,
)

INFER = b"/inference.GRPCInferenceService/ModelInfer"


class Plane:
    """Echoes its input; with ``hang`` set, waits until cancelled (and records that)."""

    max_request_elements = 1 << 22

    def __init__(self) -> None:
        self.hang = False
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return True

    def model_ready(self, name: str, version: str | None) -> bool:
        return True

    log_settings = LogSettings()

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata("modelyard", "0", ())

    async def model_metadata_loaded(
        self, name: str, version: str | None, timeout_s: float | None = None
    ) -> ModelMetadata:
        raise NotImplementedError

    async def infer(self, request: InferRequest) -> InferResponse:
        self.started.set()
        if self.hang:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        x = request.inputs[0]
        output = InferOutput("y", x.datatype, x.shape, x.array)
        return InferResponse(request.model_name, "1", [output])

    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return []

    async def load(self, name: str, config: object = None) -> None:
        pass

    async def unload(self, name: str) -> None:
        pass

    def statistics(self, name: str | None, version: str | None) -> dict[str, object]:
        return {"model_stats": []}

    async def model_config(
        self, name: str, version: str | None, timeout_s: float | None = None
    ) -> dict[str, Any]:
        return {}

    def check_response_bytes(self, size: int) -> None:
        pass


Serve = Callable[..., Awaitable[tuple[Plane, int]]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start a server over a fresh :class:`Plane` with the given limits; stopped after."""
    servers = []

    async def start(**limits: Any) -> tuple[Plane, int]:
        plane = Plane()
        server, port = await start_grpc_server(plane, "127.0.0.1", 0, 1 << 24, **limits)
        servers.append(server)
        return plane, port

    yield start
    for server in servers:
        await stop_grpc_server(server, grace_s=0.5)


def _request(floats: int = 4) -> pb.ModelInferRequest:
    x = np.arange(floats, dtype=np.float32).reshape(1, floats)
    return request_to_proto(InferRequest("echo", None, [InferInput("x", "FP32", x.shape, x)]))


class RawClient:
    """HTTP/2 frames written and read by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = hpack.Decoder()

    @classmethod
    async def open(cls, port: int, settings: dict[int, int] | None = None) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(wire.PREFACE + wire.settings_frame(settings or {}))
        return cls(reader, writer)

    def call(
        self,
        stream_id: int,
        message: bytes,
        headers: tuple[tuple[bytes, bytes], ...] = (),
        compressed: bool = False,
    ) -> None:
        """A ModelInfer call: its headers (and ``headers`` after them), one message."""
        block = (
            b"\x83\x86"  # :method POST, :scheme http
            + wire.literal(b":path", INFER)
            + wire.literal(b":authority", b"test")
            + wire.literal(b"content-type", b"application/grpc")
            + b"".join(wire.literal(name, value) for name, value in headers)
        )
        data = (b"\x01" if compressed else b"\x00") + len(message).to_bytes(4, "big") + message
        self.writer.write(
            wire.frame(wire.HEADERS, wire.END_HEADERS, stream_id, block)
            + wire.frame(wire.DATA, wire.END_STREAM, stream_id, data)
        )

    async def frame(self) -> tuple[int, int, int, bytes]:
        head = await asyncio.wait_for(self.reader.readexactly(9), 5)
        word, flags, stream_id = wire.FRAME_HEADER.unpack(head)
        payload = await self.reader.readexactly(word >> 8)
        return word & 0xFF, flags, stream_id, payload

    async def trailers(self) -> dict[bytes, bytes]:
        """Read frames until a stream's trailers; those."""
        while True:
            kind, flags, _, payload = await self.frame()
            if kind == wire.HEADERS and flags & wire.END_STREAM:
                return dict(self.decoder.decode(payload, raw=True))

    async def goaway(self) -> int | None:
        """Read frames until the server closes the connection; its last GOAWAY's code."""
        code = None
        try:
            while True:
                kind, _, _, payload = await self.frame()
                if kind == wire.GOAWAY:
                    code = wire.u32(payload, 4)
        except asyncio.IncompleteReadError:
            return code

    async def closed(self) -> bool:
        """Read (and drop) frames until the server closes the connection."""
        try:
            while True:
                await self.frame()
        except asyncio.IncompleteReadError:
            return True

    def close(self) -> None:
        self.writer.close()


async def test_a_reply_bigger_than_the_clients_window_waits_for_window_updates(
    serve: Serve,
) -> None:
    _, port = await serve()
    client = await RawClient.open(port, {wire.INITIAL_WINDOW_SIZE: 1000})
    request = _request(50_000)  # a 200 kB reply, far over both of the client's windows
    client.call(1, request.SerializeToString())
    received = bytearray()
    while True:
        kind, flags, _, payload = await client.frame()
        if kind == wire.DATA:
            received += payload
        if kind == wire.HEADERS and flags & wire.END_STREAM:
            pytest.fail("the reply ended without the client opening its window")
        if len(received) >= 1000 or kind == wire.PING:
            break
    await asyncio.sleep(0.1)  # nothing more may come while the window is shut
    assert len(received) == 1000, "the server overran the stream window"
    client.writer.write(wire.window_update(0, 1 << 24) + wire.window_update(1, 1 << 24))
    trailers: list[tuple[bytes, bytes]] = []
    while not trailers:
        kind, flags, _, payload = await client.frame()
        if kind == wire.DATA:
            received += payload
        elif kind == wire.HEADERS:
            headers = client.decoder.decode(payload, raw=True)
            if flags & wire.END_STREAM:
                trailers = list(headers)
    assert (b"grpc-status", b"0") in trailers
    reply = response_from_proto(pb.ModelInferResponse.FromString(bytes(received[5:])))
    assert np.array_equal(reply.outputs[0].array, np.arange(50_000, dtype=np.float32)[None])
    client.close()


async def test_a_cancelled_call_cancels_its_work_and_the_server_serves_on(serve: Serve) -> None:
    plane, port = await serve()
    plane.hang = True
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub: Any = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        call = stub.ModelInfer(_request())
        await asyncio.wait_for(plane.started.wait(), 5)
        call.cancel()
        await asyncio.wait_for(plane.cancelled.wait(), 5)
        plane.hang = False
        reply = await stub.ModelInfer(_request(), timeout=5)
        assert reply.outputs[0].name == "y"


async def test_the_server_ends_a_call_at_its_deadline(serve: Serve) -> None:
    plane, port = await serve()
    plane.hang = True
    client = await RawClient.open(port)
    client.call(1, _request().SerializeToString(), ((b"grpc-timeout", b"200m"),))
    trailers = await client.trailers()
    # The servicer's own timeout or the transport's, whichever fires: DEADLINE_EXCEEDED.
    assert trailers[b"grpc-status"] == b"4"
    assert plane.cancelled.is_set(), "the work went on past the deadline"
    client.close()


async def test_calls_over_the_server_limit_are_resource_exhausted(serve: Serve) -> None:
    plane, port = await serve(max_concurrent_rpcs=1)
    plane.hang = True
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub: Any = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        first = stub.ModelInfer(_request())
        await asyncio.wait_for(plane.started.wait(), 5)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ModelInfer(_request(), timeout=5)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        first.cancel()


async def test_an_unknown_method_is_unimplemented(serve: Serve) -> None:
    _, port = await serve()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelStreamInfer", None, None)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(b"", timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_ping_is_answered(serve: Serve) -> None:
    _, port = await serve()
    client = await RawClient.open(port)
    client.writer.write(wire.frame(wire.PING, 0, 0, b"12345678"))
    while True:
        kind, flags, _, payload = await client.frame()
        if kind == wire.PING:
            assert (flags, payload) == (wire.ACK, b"12345678")
            break
    client.close()


async def test_what_is_not_http2_is_closed(serve: Serve) -> None:
    _, port = await serve()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await asyncio.wait_for(RawClient(reader, writer).closed(), 5)


async def test_a_frame_over_the_size_limit_closes_the_connection(serve: Serve) -> None:
    _, port = await serve()
    client = await RawClient.open(port)
    client.writer.write(wire.FRAME_HEADER.pack(((1 << 24) - 1) << 8 | wire.DATA, 0, 1))
    goaway = await client.goaway()
    assert goaway == wire.FRAME_SIZE_ERROR


async def test_the_goaway_reaches_a_client_whose_bytes_the_server_never_read(
    serve: Serve,
) -> None:
    # Closing a socket with unread input sends a TCP reset, which can destroy the GOAWAY
    # before the client reads it: the server half-closes and drains instead.
    _, port = await serve()
    client = await RawClient.open(port)
    header = wire.FRAME_HEADER.pack(((1 << 24) - 1) << 8 | wire.DATA, 0, 1)
    client.writer.write(header + bytes(4 << 20))
    await asyncio.sleep(0.3)  # the server has read the header and aborted by now
    goaway = await client.goaway()
    assert goaway == wire.FRAME_SIZE_ERROR
    client.close()


async def test_silent_and_idle_connections_are_closed(serve: Serve) -> None:
    _, port = await serve(handshake_timeout_s=0.2, max_connection_idle_s=0.3)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await asyncio.wait_for(RawClient(reader, writer).closed(), 5), "silent client kept"
    idle = await RawClient.open(port)
    assert await asyncio.wait_for(idle.closed(), 5), "idle connection kept"


async def test_gzip_compressed_calls_are_inflated_within_the_limit(serve: Serve) -> None:
    _, port = await serve()
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", compression=grpc.Compression.Gzip
    ) as channel:
        stub: Any = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        reply = response_from_proto(await stub.ModelInfer(_request(1000), timeout=5))
        assert np.array_equal(reply.outputs[0].array, np.arange(1000, dtype=np.float32)[None])
    # 64 MiB of zeros compresses to ~64 kB: refused once it inflates past the 16 MiB limit.
    client = await RawClient.open(port)
    bomb = zlib.compress(bytes(64 << 20))
    client.call(1, bomb, ((b"grpc-encoding", b"deflate"),), compressed=True)
    trailers = await client.trailers()
    assert trailers[b"grpc-status"] == b"8"  # RESOURCE_EXHAUSTED
    client.close()


async def test_a_flood_of_reset_calls_closes_the_connection(serve: Serve) -> None:
    plane, port = await serve()
    plane.hang = True
    client = await RawClient.open(port)
    message = _request().SerializeToString()
    for i in range(300):
        stream_id = 2 * i + 1
        client.call(stream_id, message)
        client.writer.write(wire.rst_stream(stream_id, wire.CANCEL))
    goaway = await client.goaway()
    assert goaway == wire.ENHANCE_YOUR_CALM
    # Other connections are served as before.
    plane.hang = False
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub: Any = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        assert (await stub.ModelInfer(_request(), timeout=5)).outputs[0].name == "y"
