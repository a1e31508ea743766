"""The REST port under hostile load, over the real port of a ``modelyard serve`` process.

A server in its own process (so that this test's clients do not share its event loop):
compressed bodies are inflated with their output bounded (a gzip bomb gets 413 and the
server's memory does not follow it), a request whose body stops arriving is closed after
the body idle deadline, a flood of REST connections leaves REST and gRPC serving within
a low file limit, and big JSON bodies and gzip bombs sent side by side leave a good
client's requests answered, each bad body with its 4xx.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import psutil
import pytest

from modelyard.examples.mlp import build_add_onnx
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from tests.servers import write_config

pytestmark = pytest.mark.integration

MAX_REQUEST_MB = 4
LIMIT = MAX_REQUEST_MB * 1024 * 1024
GOOD = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0.0] * 4}]}
FILE_LIMIT = 600
"""The server's ``ulimit -n`` (soft and hard): its default connection cap follows it."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Served:
    """A ``modelyard serve`` process: its REST URL and port, gRPC target, and pid."""

    def __init__(self, proc: subprocess.Popen[bytes], http_port: int, grpc_port: int) -> None:
        self.proc = proc
        self.http_port = http_port
        self.url = f"http://127.0.0.1:{http_port}"
        self.grpc_target = f"127.0.0.1:{grpc_port}"

    def rss(self) -> int:
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def descriptors(self) -> int:
        return int(psutil.Process(self.proc.pid).num_fds())


def _low_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("hostile")
    build_add_onnx(root / "add" / "1" / "model.onnx", 1.0)
    models = [{"name": "add", "path": "add", "isolation": "inline", "preload": True}]
    limits = {"header_timeout_s": 60, "body_idle_timeout_s": 1.0}
    cfg = write_config(
        root, models, max_request_mb=MAX_REQUEST_MB, limits=limits, log_level="warning"
    )
    http_port, grpc_port = _free_port(), _free_port()
    command = [sys.executable, "-m", "modelyard.cli", "serve", "--config", str(cfg)]
    command += ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_low_file_limit
    )
    served = Served(proc, http_port, grpc_port)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()
            try:
                if httpx.get(f"{served.url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server not ready in 120 s"
            time.sleep(0.2)
        yield served
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _good(client: httpx.Client) -> None:
    r = client.post("/v2/models/add/infer", json=GOOD)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [1.0] * 4


def bomb(size: int) -> bytes:
    """A gzip body that inflates to ``size`` bytes of spaces (about 1,000 : 1)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b" " * (1024 * 1024)
    parts = [packer.compress(block) for _ in range(size // len(block))]
    return b"".join(parts) + packer.flush()


def test_compressed_bodies_are_inflated_and_bombs_refused_within_the_limit(
    served: Served,
) -> None:
    body = json.dumps(GOOD).encode()
    with httpx.Client(base_url=served.url, timeout=30) as client:
        for encoding, packed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
            r = client.post(
                "/v2/models/add/infer", content=packed, headers={"content-encoding": encoding}
            )
            assert r.status_code == 200, (encoding, r.text)
            assert r.json()["outputs"][0]["data"] == [1.0] * 4
        # 256 MiB once inflated, from about 256 KB: refused as soon as the output passes
        # the 4 MiB limit, so the server never holds the rest.
        payload = bomb(256 * 1024 * 1024)
        before = served.rss()
        peak = [before]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], served.rss())
                time.sleep(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            for _ in range(10):
                r = client.post(
                    "/v2/models/add/infer", content=payload, headers={"content-encoding": "gzip"}
                )
                assert r.status_code == 413, r.text
                assert "inflates past" in r.json()["error"]
        finally:
            stop.set()
            sampler.join()
        # Well under one bomb inflated (the pool's threads keep some memory in their
        # allocator arenas after the first bombs: that is bounded, not per bomb).
        assert peak[0] - before < 128 * 1024 * 1024, "a bomb was inflated past the limit"
        # Broken and unsupported codings are the client's error, answered 400.
        cases = [
            ("gzip", gzip.compress(body)[:-8], "/v2/models/add/infer"),
            ("br", body, "/v2/models/add/infer"),
            ("gzip, gzip", gzip.compress(gzip.compress(body)), "/v2/models/add/infer"),
            ("gzip", gzip.compress(b"{}"), "/v2/repository/models/add/aliases/blue"),
        ]
        for encoding, packed, path in cases:
            r = client.post(path, content=packed, headers={"content-encoding": encoding})
            assert r.status_code == 400, (encoding, path, r.text)
        _good(client)


async def _closed_within(reader: asyncio.StreamReader, timeout_s: float) -> float:
    started = time.monotonic()
    while await asyncio.wait_for(reader.read(65536), timeout_s):
        pass
    return time.monotonic() - started


async def test_an_infer_request_whose_body_stops_is_closed_after_the_idle_deadline(
    served: Served,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.http_port)
    # A complete head and half the body of an infer request, then nothing.
    writer.write(
        b"POST /v2/models/add/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 200\r\n\r\n{"inputs": [{"name": "input",'
    )
    await writer.drain()
    elapsed = await _closed_within(reader, 10.0)
    writer.close()
    assert 0.5 < elapsed < 5.0  # body_idle_timeout_s: 1 (the head deadline is 60 s)
    with httpx.Client(base_url=served.url, timeout=30) as client:
        _good(client)


async def test_a_rest_connection_flood_leaves_rest_and_grpc_serving(served: Served) -> None:
    # More silent connections than the server has descriptors: the REST port's cap (from
    # its file limit of 600) closes the oldest, so REST keeps answering, gRPC's share of
    # descriptors stays free, and the server never runs out.
    flood: list[asyncio.StreamWriter] = []
    try:
        for _ in range(FILE_LIMIT):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", served.http_port)
            except OSError:
                continue  # the backlog was full for a moment: the flood goes on
            flood.append(writer)
        # Until the server has accepted the whole flood (the kernel completed the
        # handshakes before the server took them): while connections still arrive,
        # each one displaces another, and a request meanwhile may get 503.
        counts = [-1, served.descriptors()]
        while counts[-1] != counts[-2]:
            await asyncio.sleep(0.2)
            counts.append(served.descriptors())
        assert counts[-1] < FILE_LIMIT - 100
        async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
            for _ in range(5):
                r = await client.post("/v2/models/add/infer", json=GOOD)
                assert r.status_code == 200, r.text
        async with grpc.aio.insecure_channel(served.grpc_target) as channel:
            stub: Any = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            live = await stub.ServerLive(pb.ServerLiveRequest(), timeout=10)
            assert live.live
    finally:
        for writer in flood:
            writer.close()


def _big_json(inputs: int) -> bytes:
    """A body of ``inputs`` one-element inputs (none of them the model's): a 400."""
    doc = {
        "inputs": [
            {"name": f"in{i}", "shape": [1], "datatype": "FP32", "data": [0.5]}
            for i in range(inputs)
        ]
    }
    return json.dumps(doc).encode()


async def test_big_bodies_and_gzip_bombs_leave_a_good_client_served(served: Served) -> None:
    big = _big_json(25_000)  # about 2 MB
    payload = bomb(64 * 1024 * 1024)
    stop = asyncio.Event()
    bad_answers: list[int] = []
    side: list[float] = []
    side_errors: list[str] = []

    async def attacker(content: bytes, headers: dict[str, str]) -> None:
        async with httpx.AsyncClient(base_url=served.url, timeout=60) as client:
            while not stop.is_set():
                r = await client.post("/v2/models/add/infer", content=content, headers=headers)
                bad_answers.append(r.status_code)

    async def good_client() -> None:
        async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    r = await client.post("/v2/models/add/infer", json=GOOD)
                    if r.status_code != 200:
                        side_errors.append(f"{r.status_code} {r.text}")
                except httpx.HTTPError as exc:
                    side_errors.append(repr(exc))
                side.append(time.monotonic() - started)
                await asyncio.sleep(0.02)

    tasks = [
        asyncio.create_task(attacker(big, {"content-type": "application/json"})),
        asyncio.create_task(attacker(payload, {"content-encoding": "gzip"})),
        asyncio.create_task(good_client()),
    ]
    await asyncio.sleep(4.0)
    stop.set()
    await asyncio.gather(*tasks)
    assert not side_errors
    assert bad_answers
    assert all(400 <= s < 500 for s in bad_answers), set(bad_answers)
    assert {400, 413} <= set(bad_answers)
    side.sort()
    assert len(side) >= 20
    assert side[int(len(side) * 0.99)] < 3.0  # generous: the machine is shared
