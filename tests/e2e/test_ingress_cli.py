"""``modelyard serve --ingress 2`` as a user runs it: its ingress processes never outlive it.

Stopped with SIGTERM, the server stops its ingresses before it exits; killed with
SIGKILL (no chance to clean up), each ingress notices its channel close and exits.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.e2e.test_cli import _free_port

pytestmark = pytest.mark.slow  # a server with two ingress processes starting (5-15 s)

CHILD_MODULE = "modelyard.frontends.ingress.child"


def _ingresses(server: psutil.Process) -> list[psutil.Process]:
    return [p for p in server.children() if CHILD_MODULE in p.cmdline()]


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE  # exited, parent not reaping
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], list[psutil.Process]]]:
    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text("models: []\ngrpc_port: null\n", encoding="utf-8")
    port = _free_port()
    command = [sys.executable, "-m", "modelyard.cli", "serve", "--config", str(cfg)]
    proc = subprocess.Popen(
        [*command, "--http-port", str(port), "--ingress", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, "the server exited during start-up"
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.2)
        ingresses = _ingresses(psutil.Process(proc.pid))
        assert len(ingresses) == 2
        assert int(r.headers["x-modelyard-ingress"]) in {p.pid for p in ingresses}
        yield proc, ingresses
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def _wait_gone(ingresses: list[psutil.Process], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(_gone(p) for p in ingresses):
        assert time.monotonic() < deadline, "an ingress process outlived its server"
        time.sleep(0.05)


def test_sigterm_stops_the_ingresses_first(
    serving: tuple[subprocess.Popen[bytes], list[psutil.Process]],
) -> None:
    proc, ingresses = serving
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    _wait_gone(ingresses, 1.0)


def test_a_killed_server_leaves_no_ingress_behind(
    serving: tuple[subprocess.Popen[bytes], list[psutil.Process]],
) -> None:
    proc, ingresses = serving
    proc.kill()
    proc.wait(timeout=30)
    _wait_gone(ingresses, 20.0)
