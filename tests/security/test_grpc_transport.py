"""The transport attacks of issue 31, over the real gRPC port of a real server process.

Each probe is what an attacker with nothing but a TCP connection and no token would
send (frames built with the ``h2`` state machine, or with ``hyperframe`` where the
frames break RFC 9113 on purpose); each is bounded in time and count, and each is
followed, or accompanied, by a good call over gRPC (``ModelInfer`` with the data token)
and over REST that must succeed. The server runs in its own process so that its memory
(the process tree's RSS, workers included) is measured apart from the client's.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import h2.config
import h2.connection
import h2.exceptions
import httpx
import numpy as np
import psutil
import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from modelyard.examples.mlp import build_add_onnx
from modelyard.frontends.grpc.convert import request_to_proto, response_from_proto
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from modelyard.protocol.types import InferInput, InferRequest
from tests.servers import write_config

TOKEN = "data-token-for-the-transport-tests"
MIB = 1 << 20
GRPC_CONNECTIONS = 64
"""The server's ``limits.grpc_max_connections`` here."""
FILE_LIMIT = 400
"""The server's ``ulimit -n``: fewer descriptors than the connection flood below."""
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
LIVE = "/inference.GRPCInferenceService/ServerLive"
BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
RSS_BOUND = 256 * MIB

pytestmark = pytest.mark.slow  # a server process and floods: about 40 s in all


@dataclass
class Server:
    """A ``modelyard serve`` process: its ports and its process."""

    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int

    def rss(self) -> int:
        """Resident bytes of the server and every process under it (workers)."""
        root = psutil.Process(self.process.pid)
        total = 0
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += proc.memory_info().rss
        return total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("transport")
    build_add_onnx(root / "add" / "1" / "model.onnx", 1.0)
    config = write_config(
        root,
        [{"name": "add", "path": "add", "preload": True}],
        security={"data_token": TOKEN},
        limits={"max_connections": 128, "grpc_max_connections": GRPC_CONNECTIONS},
    )
    http_port, grpc_port = _free_port(), _free_port()
    command = [sys.executable, "-m", "modelyard.cli", "serve", "--config", str(config)]
    command += ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=_file_limit,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, "the server exited"
            with contextlib.suppress(httpx.HTTPError):
                url = f"http://127.0.0.1:{http_port}/v2/health/ready"
                if httpx.get(url, timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.2)
        yield Server(process, http_port, grpc_port)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ---------------------------------------------------------------------- good calls


def good_grpc_call(server: Server) -> None:
    """A valid ``ModelInfer`` with its token, answered correctly."""
    request = InferRequest(
        "add",
        None,
        [InferInput("input", "FP32", (1, 4), np.arange(4, dtype=np.float32).reshape(1, 4))],
    )
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        reply = stub.ModelInfer(
            request_to_proto(request),
            metadata=(("authorization", f"Bearer {TOKEN}"),),
            timeout=10,
        )
    [output] = response_from_proto(reply).outputs
    np.testing.assert_array_equal(output.array, [[1, 2, 3, 4]])


def good_rest_call(server: Server) -> None:
    """A valid REST inference with its token, answered correctly."""
    r = httpx.post(
        f"http://127.0.0.1:{server.http_port}/v2/models/add/infer",
        json=BODY,
        headers={"authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [2, 3, 4, 5]


def good_calls(server: Server) -> None:
    good_grpc_call(server)
    good_rest_call(server)


# ---------------------------------------------------------------------- HTTP/2 helpers


def _connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=5)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    return sock


def _client(sock: socket.socket) -> h2.connection.H2Connection:
    """An HTTP/2 client connection whose preface has been sent on ``sock``."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    return conn


def _headers(path: str) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "127.0.0.1"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server sends GOAWAY or closes ``sock`` within ``seconds`` (frames it
    sent before, e.g. the PING answers of a flood, are read and skipped)."""
    buffer = bytearray()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            return False
        except OSError:
            return True  # reset
        if not data:
            return True
        buffer += data
        while len(buffer) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(buffer)[:9])
            if isinstance(frame, GoAwayFrame):
                return True
            if len(buffer) < 9 + length:
                break
            del buffer[: 9 + length]
    return False


# ---------------------------------------------------------------------- attacks


def test_rapid_resets_leave_no_call_counted(server: Server) -> None:
    # 6 connections x 190 [HEADERS ServerLive + empty DATA END_STREAM + RST_STREAM], each
    # connection's frames in one write: the hand-written engine leaked its concurrent-call
    # counter and answered every later call RESOURCE_EXHAUSTED until restart.
    sockets = []
    for _ in range(6):
        sock = _connect(server)
        conn = _client(sock)
        for _ in range(190):
            stream = conn.get_next_available_stream_id()
            conn.send_headers(stream, _headers(LIVE))
            conn.send_data(stream, b"", end_stream=True)
            conn.reset_stream(stream)
        sock.sendall(conn.data_to_send())
        sockets.append(sock)
    try:
        for _ in range(3):
            good_calls(server)
    finally:
        for sock in sockets:
            sock.close()
    good_calls(server)


def test_unfinished_large_bodies_stay_within_the_memory_bound(server: Server) -> None:
    # 2 connections x 4 streams, each a 50 MiB message on the open ServerLive method,
    # sent as far as the server's flow-control windows allow and never finished.
    before = server.rss()
    body = b"\x00" + (50 * MIB).to_bytes(4, "big") + bytes(50 * MIB)
    conns: list[tuple[socket.socket, h2.connection.H2Connection, dict[int, int]]] = []
    for _ in range(2):
        sock = _connect(server)
        conn = _client(sock)
        sent = {}
        for _ in range(4):
            stream = conn.get_next_available_stream_id()
            conn.send_headers(stream, _headers(LIVE))
            sent[stream] = 0
        sock.sendall(conn.data_to_send())
        conns.append((sock, conn, sent))
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        progress = False
        for sock, conn, sent in conns:
            _pump(sock, conn)
            for stream, offset in sent.items():
                room = min(
                    conn.local_flow_control_window(stream) if _open(conn, stream) else 0,
                    len(body) - offset,
                    conn.max_outbound_frame_size,
                )
                if room > 0:
                    conn.send_data(stream, body[offset : offset + room])
                    sent[stream] = offset + room
                    progress = True
            with contextlib.suppress(OSError):
                sock.sendall(conn.data_to_send())
        if not progress:
            time.sleep(0.05)
    try:
        growth = server.rss() - before
        assert growth < RSS_BOUND, f"the server grew by {growth / MIB:.0f} MiB"
        good_calls(server)  # beside the unfinished bodies
    finally:
        for sock, _, _ in conns:
            sock.close()
    good_calls(server)


def _open(conn: h2.connection.H2Connection, stream: int) -> bool:
    try:
        return bool(conn.streams[stream].open)
    except KeyError:
        return False


def _pump(sock: socket.socket, conn: h2.connection.H2Connection) -> None:
    """Read what the server sent (its window updates, resets) without blocking."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(1 << 16)
            if not data:
                return
            with contextlib.suppress(h2.exceptions.ProtocolError):
                conn.receive_data(data)
    except (BlockingIOError, OSError):
        return
    finally:
        sock.setblocking(True)


def test_a_message_over_the_grpc_limit_is_resource_exhausted_naming_the_limit(
    server: Server,
) -> None:
    big = np.zeros((1, 4), dtype=np.float32)
    request = request_to_proto(
        InferRequest("add", None, [InferInput("input", "FP32", (1, 4), big)])
    )
    request.raw_input_contents.append(bytes(5 * MIB))  # the message is now over 4 MiB
    with grpc.insecure_channel(
        f"127.0.0.1:{server.grpc_port}", options=[("grpc.max_send_message_length", 64 * MIB)]
    ) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=10)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(4 * MIB) in (info.value.details() or "")
    good_calls(server)


def test_a_ping_flood_whose_replies_are_never_read_is_cut_off(server: Server) -> None:
    before = server.rss()
    ping = PingFrame(0)
    ping.opaque_data = bytes(8)
    burst = ping.serialize() * 20_000
    sockets = [_connect(server) for _ in range(4)]
    for sock in sockets:
        _client(sock)
    closed: set[int] = set()
    stalled: set[int] = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(closed | stalled) < len(sockets):
        for i, sock in enumerate(sockets):
            if i in closed | stalled:
                continue
            sock.settimeout(0.5)
            try:
                sock.sendall(burst)
            except TimeoutError:
                stalled.add(i)  # the server stopped reading (its GOAWAY is on the way)
            except OSError:
                closed.add(i)
    try:
        growth = server.rss() - before
        assert growth < RSS_BOUND, f"the server grew by {growth / MIB:.0f} MiB"
        good_calls(server)
        # Every flooding connection is closed (GOAWAY ENHANCE_YOUR_CALM, then the close).
        for i, sock in enumerate(sockets):
            assert i in closed or _closed_within(sock, 5), f"connection {i} still open"
    finally:
        for sock in sockets:
            sock.close()
    good_calls(server)


def _window_update_zero() -> list[Frame]:
    return [WindowUpdateFrame(0, window_increment=0)]


def _window_past_max() -> list[Frame]:
    return [WindowUpdateFrame(0, window_increment=2**31 - 1)] * 2


def _data_on_stream_zero() -> list[Frame]:
    frame = DataFrame(1, data=b"x")
    frame.stream_id = 0  # hyperframe refuses to build it; set after construction
    return [frame]


def _reused_lower_stream_id() -> list[Frame]:
    headers = HeadersFrame(5, flags=["END_HEADERS"])
    headers.data = b"\x83\x86"  # :method POST, :scheme http (indexed)
    lower = HeadersFrame(3, flags=["END_HEADERS"])
    lower.data = b"\x83\x86"
    return [headers, lower]


def _enable_push_two() -> list[Frame]:
    return [SettingsFrame(0, settings={SettingsFrame.ENABLE_PUSH: 2})]


def _empty_continuations() -> list[Frame]:
    headers = HeadersFrame(1)  # no END_HEADERS: CONTINUATION frames must follow
    headers.data = b"\x83"
    return [headers] + [ContinuationFrame(1)] * 10_000


REFUSED: dict[str, Callable[[], list[Frame]]] = {
    "window_update_zero": _window_update_zero,
    "enable_push_2": _enable_push_two,
    "10000_empty_continuations": _empty_continuations,
}
"""RFC 9113 violations grpcio answers with GOAWAY or a close (measured with grpcio 1.85).

grpcio tolerates the others (a window pushed past 2^31-1, DATA on stream 0, a reused
lower stream id): docs/decisions/0031-grpc-on-grpcio.md lists them; the server keeps
serving and its memory stays flat, as ``test_what_grpcio_tolerates_harms_nothing`` checks."""

TOLERATED: dict[str, Callable[[], list[Frame]]] = {
    "window_past_2^31-1": _window_past_max,
    "data_on_stream_0": _data_on_stream_zero,
    "reused_lower_stream_id": _reused_lower_stream_id,
}


def _violate(server: Server, frames: list[Frame]) -> socket.socket:
    sock = _connect(server)
    conn = _client(sock)
    _pump(sock, conn)
    sock.sendall(b"".join(frame.serialize() for frame in frames))
    return sock


@pytest.mark.parametrize("violation", sorted(REFUSED))
def test_rfc_violations_grpcio_refuses_get_goaway_or_close(server: Server, violation: str) -> None:
    sock = _violate(server, REFUSED[violation]())
    try:
        assert _closed_within(sock, 5), f"{violation}: no GOAWAY or close within 5 s"
    finally:
        sock.close()
    good_calls(server)


@pytest.mark.parametrize("violation", sorted(TOLERATED))
def test_what_grpcio_tolerates_harms_nothing(server: Server, violation: str) -> None:
    before = server.rss()
    sock = _violate(server, TOLERATED[violation]())
    try:
        good_calls(server)
        assert server.rss() - before < RSS_BOUND
    finally:
        sock.close()
    good_calls(server)


def test_a_connection_flood_on_the_grpc_port_cannot_starve_rest(server: Server) -> None:
    # More preface-only connections than the server has descriptors: without the gRPC
    # connection cap they took every descriptor and REST could not accept.
    flood = FILE_LIMIT + 50
    sockets: list[socket.socket] = []
    try:
        for _ in range(flood):
            with contextlib.suppress(OSError):
                sock = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=2)
                sock.sendall(PREFACE + SettingsFrame(0).serialize())
                sockets.append(sock)
        time.sleep(0.5)
        for _ in range(20):
            good_rest_call(server)
        open_ = [s for s in sockets if not _closed_within(s, 0.01)]
        assert len(open_) <= GRPC_CONNECTIONS, f"{len(open_)} gRPC connections kept open"
    finally:
        for sock in sockets:
            sock.close()
    time.sleep(0.5)
    good_calls(server)
