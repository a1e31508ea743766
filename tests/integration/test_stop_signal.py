"""SIGTERM always stops a real server process within its ``drain_timeout_s`` (issue 33):
after a churn of loads and unloads, idle, under load, and with a call stuck in an inline
model (which no drain can finish: the stop must still end on time)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.fault_models import HANG
from tests.integration.conftest import python_model
from tests.servers import write_config

DRAIN_S = 4.0
"""The servers' ``drain_timeout_s``."""
EXIT_MARGIN_S = 1.0
"""Slack over the drain timeout for the process to be reaped on a loaded 2-core box."""
CHURN_S = 3.0
MODELS = ("d1", "d2")
BODY = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def server(model_root: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    models = [{"name": name, "path": "digits-logreg", "preload": True} for name in MODELS]
    models.append(python_model("faulty", "FaultyModel", preload=True, isolation="inline"))
    cfg = write_config(tmp_path, models, model_repository=str(model_root), drain_timeout_s=DRAIN_S)
    port = _free_port()
    cmd = [sys.executable, "-m", "modelyard.cli", "serve", "--config", str(cfg)]
    cmd += ["--host", "127.0.0.1", "--http-port", str(port), "--grpc-port", str(_free_port())]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, "the server exited during start-up"
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            pytest.fail("server did not become ready in 120 s")
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def _churn(client: httpx.AsyncClient, until: float) -> int:
    rng = random.Random(7)
    done = 0
    while time.monotonic() < until:
        name = rng.choice(MODELS)
        await client.post(f"/v2/repository/models/{name}/{rng.choice(('load', 'unload'))}")
        done += 1
    return done


async def _load(client: httpx.AsyncClient, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await client.post(f"/v2/models/{random.choice(MODELS)}/infer", json=BODY)
        except httpx.HTTPError:
            await asyncio.sleep(0.01)  # the server is going


def _stop_within_drain(proc: subprocess.Popen[bytes]) -> float:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=DRAIN_S + EXIT_MARGIN_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server still ran {DRAIN_S + EXIT_MARGIN_S} s after SIGTERM")
    return time.monotonic() - t0


@pytest.mark.parametrize("scene", ["idle", "under-load", "stuck-call"])
async def test_sigterm_after_churn_stops_within_the_drain_timeout(
    server: tuple[subprocess.Popen[bytes], str], scene: str
) -> None:
    proc, url = server
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        churned = await _churn(client, time.monotonic() + CHURN_S)
        assert churned > 5
        busy: list[asyncio.Task[object]] = []
        if scene == "under-load":
            busy = [asyncio.create_task(_load(client, stop)) for _ in range(4)]
            await asyncio.sleep(0.5)
        elif scene == "stuck-call":
            # An inline call that never returns: no drain can finish it.
            stuck = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [HANG]}]}
            busy = [asyncio.create_task(client.post("/v2/models/faulty/infer", json=stuck))]
            await asyncio.sleep(0.5)
        took_s = await asyncio.to_thread(_stop_within_drain, proc)
        stop.set()
        await asyncio.gather(*busy, return_exceptions=True)
    assert took_s < DRAIN_S + EXIT_MARGIN_S
    # An orderly stop exits 0; only a stop the watchdog had to end exits 1.
    assert proc.returncode == (1 if scene == "stuck-call" else 0), proc.returncode
