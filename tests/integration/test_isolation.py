"""Process isolation on a real server: each replica in its own worker process.

Workers are killed from outside, kill themselves, run out of memory, hang, fail to
load and get unloaded; the server answers every request, says truthfully whether the
model is ready, restarts the worker, and the other models never notice.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from modelyard.examples.mlp import build_mlp_onnx
from tests.fakes.fault_models import CRASH, HANG, SLOW
from tests.fakes.slow_load_model import LOAD_S
from tests.integration.conftest import python_model
from tests.servers import committed_stats, running_server, write_config

FAKES = Path(__file__).resolve().parents[1] / "fakes"

RECOVERY_S = 2.0
"""A dead worker's model must serve again within this long."""
NOTICE_S = 1.0
"""The server must notice a worker's death within this long (slack for a loaded box)."""
FAULTY_TIMEOUT_MS = 2000
HANG_TIMEOUT_MS = 500
HANG_MARGIN_S = 1.0
OVERRUN_GRACE_S = 0.2
"""How long the hung call may run on after its 504 before its worker is stopped."""
"""Slack over the deadline for the 504 of a hung request on a loaded 2-core box."""
LEAK_LIMIT_MB = 64
MIB = 1024 * 1024
LEAK_MB = 200.0
IN_FLIGHT = 4
"""Slow requests inside the worker when it is SIGKILLed."""
STREAMS = 3
"""Concurrent clients streaming requests to the bystander model."""
UNLOAD_SIZES = [
    pytest.param(32, id="32MiB"),
    pytest.param(200, id="200MiB", marks=pytest.mark.slow),
]
"""ONNX model sizes (MiB of weights) for the unload test; building 200 MiB takes ~3.5 s."""
RETURNED_FRACTION = 0.8
"""Share of the unloaded model's measured footprint that must leave the process tree."""

DIGITS = {
    "inputs": [
        {
            "name": "input",
            "shape": [1, 64],
            "datatype": "FP32",
            "data": [float(i % 16) for i in range(64)],
        }
    ]
}
"""One request for ``digits-logreg`` (and ``mlp``): 64 pixel values."""


def _x(value: float) -> dict[str, Any]:
    """One request for the fault models: ``x`` = [[value]]."""
    return {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}


def _error(response: httpx.Response) -> str:
    body = response.json()
    assert isinstance(body, dict), body
    message = body["error"]
    assert isinstance(message, str), body
    return message


async def _stats(client: httpx.AsyncClient, name: str) -> dict[str, Any]:
    """The ``/v2/stats`` row of ``name`` (its only version)."""
    r = await client.get("/v2/stats")
    assert r.status_code == 200, r.text
    rows = [m for m in r.json()["models"] if m["name"] == name]
    assert len(rows) == 1, rows
    row: dict[str, Any] = rows[0]
    return row


async def _index_row(client: httpx.AsyncClient, name: str) -> dict[str, Any]:
    """The repository index row of ``name``."""
    r = await client.post("/v2/repository/index", json={})
    assert r.status_code == 200, r.text
    rows = [m for m in r.json() if m["name"] == name]
    assert len(rows) == 1, rows
    row: dict[str, Any] = rows[0]
    return row


async def _watch_restart(
    client: httpx.AsyncClient, name: str, since: float, within: float = RECOVERY_S
) -> tuple[list[int], float]:
    """Poll ``/ready`` until it has said not-ready and then ready again.

    Returns the statuses seen and the time the model was back. Fails if that takes
    longer than ``within`` seconds after ``since``.
    """
    seen: list[int] = []
    while True:
        r = await client.get(f"/v2/models/{name}/ready")
        now = time.monotonic()
        seen.append(r.status_code)
        if r.status_code == 200 and any(s != 200 for s in seen):
            return seen, now
        assert now - since < within, f"{name} not back within {within} s; /ready said {seen}"


async def _await_replacement(
    client: httpx.AsyncClient, name: str, old_pid: int, since: float
) -> dict[str, Any]:
    """Poll ``/v2/stats`` until a new worker serves ``name``; its stats row.

    Fails unless that happens within :data:`RECOVERY_S` of ``since``.
    """
    while True:
        stats = await _stats(client, name)
        if stats["restarts"] >= 1 and stats["ready"] and stats["pid"] != old_pid:
            return stats
        assert time.monotonic() - since < RECOVERY_S, f"{name} not back in time: {stats}"
        await asyncio.sleep(0.005)


async def _until(condition: Callable[[], bool], within: float, what: str) -> None:
    """Wait (polling) until ``condition()`` holds; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def _gone(pid: int) -> bool:
    """The process no longer runs (a zombie awaiting its reaper counts as gone)."""
    try:
        # Dead (X): its parent is reaping it right now.
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True


def _live_descendants() -> set[int]:
    """Pids of this process's running descendants: the fork server and the workers."""
    return {p.pid for p in psutil.Process().children(recursive=True) if not _gone(p.pid)}


async def _live_model_processes(client: httpx.AsyncClient) -> set[int]:
    """:func:`_live_descendants` but the idle spare workers (a claimed one is replaced)."""
    spares = (await client.get("/v2/health/details")).json()["spare_workers"]
    return _live_descendants() - set(spares)


def _tree_rss() -> int:
    """RSS of this process (the server) plus every descendant: fork server, workers."""
    me = psutil.Process()
    total = 0
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """At teardown the server has stopped every worker and its fork server."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    deadline = time.monotonic() + 5.0
    while True:
        left = [
            p.pid
            for p in psutil.Process().children(recursive=True)
            if p.pid not in before and not _gone(p.pid)
        ]
        if not left:
            return
        assert time.monotonic() < deadline, f"processes left after the server stopped: {left}"
        time.sleep(0.02)


# ------------------------------------------------------------------ external SIGKILL


async def test_sigkill_with_requests_in_flight(model_root: Path, tmp_path: Path) -> None:
    models = [
        python_model(
            "faulty",
            "FaultyModel",
            preload=True,
            timeout_ms=FAULTY_TIMEOUT_MS,
            max_queue_delay_us=50_000,  # the slow requests go into the worker as one batch
        ),
        {"name": "digits-logreg", "path": "digits-logreg", "preload": True},
    ]
    cfg = write_config(tmp_path, models, model_repository=str(model_root))
    async with running_server(cfg) as (app, client):
        record = app.manager.resolve("faulty", None)
        assert record.info is not None
        old_pid = record.info.pid
        assert old_pid is not None
        assert (await _stats(client, "faulty"))["pid"] == old_pid
        assert old_pid != (await _stats(client, "digits-logreg"))["pid"]

        stop = asyncio.Event()
        bystander: list[tuple[float, int, str]] = []

        async def stream() -> None:
            while not stop.is_set():
                r = await client.post("/v2/models/digits-logreg/infer", json=DIGITS)
                bystander.append((time.monotonic(), r.status_code, r.text))

        async def slow() -> tuple[float, httpx.Response]:
            t0 = time.monotonic()
            r = await client.post("/v2/models/faulty/infer", json=_x(SLOW))
            return time.monotonic() - t0, r

        streams = [asyncio.create_task(stream()) for _ in range(STREAMS)]
        slow_tasks = [asyncio.create_task(slow()) for _ in range(IN_FLIGHT)]
        scheduler = record.scheduler
        assert scheduler is not None
        await _until(
            lambda: record.in_flight > 0 and scheduler.stats()["running_requests"] == IN_FLIGHT,
            2.0,
            "the slow requests to reach the worker",
        )
        killed_at = time.monotonic()
        os.kill(old_pid, signal.SIGKILL)
        seen, back_at = await _watch_restart(client, "faulty", killed_at)
        answers = await asyncio.gather(*slow_tasks)
        after = await client.post("/v2/models/faulty/infer", json=_x(0.5))
        await _until(
            lambda: sum(t > back_at for t, _, _ in bystander) >= STREAMS, 2.0, "traffic after"
        )
        stop.set()
        await asyncio.gather(*streams)
        stats = await _stats(client, "faulty")

    for elapsed, r in answers:
        assert elapsed < FAULTY_TIMEOUT_MS / 1000, f"answered after {elapsed:.3f} s"
        assert r.status_code == 503, r.text
        message = _error(r)
        assert "died" in message, message
        assert "SIGKILL" in message, message
    assert 400 in seen, seen
    assert back_at - killed_at < RECOVERY_S
    assert after.status_code == 200, after.text
    assert after.json()["outputs"][0]["data"] == [0.5]
    assert stats["restarts"] >= 1, stats
    assert stats["pid"] != old_pid, stats
    assert _gone(old_pid)
    failures = [(status, text) for _, status, text in bystander if status != 200]
    assert not failures, failures
    assert any(t < killed_at for t, _, _ in bystander), "no bystander traffic before the kill"


# ------------------------------------------------------------------ faults from inside


@pytest.fixture
def faulty_config(model_root: Path, tmp_path: Path) -> Path:
    models = [
        # A short overrun grace: the hung call is stopped soon after its 504 (issue 33).
        python_model(
            "faulty",
            "FaultyModel",
            preload=True,
            timeout_ms=HANG_TIMEOUT_MS,
            overrun_grace_s=OVERRUN_GRACE_S,
        ),
        {"name": "mlp", "path": "mlp", "preload": True},
    ]
    return write_config(tmp_path, models, model_repository=str(model_root))


async def test_model_that_kills_itself(faulty_config: Path) -> None:
    async with running_server(faulty_config) as (_, client):
        old_pid = (await _stats(client, "faulty"))["pid"]
        t0 = time.monotonic()
        r = await client.post("/v2/models/faulty/infer", json=_x(CRASH))
        answered_s = time.monotonic() - t0
        assert r.status_code == 503, r.text
        message = _error(r)
        assert f"worker (pid {old_pid})" in message, message
        assert "died" in message, message
        assert "SIGKILL" in message, message
        assert answered_s < HANG_TIMEOUT_MS / 1000, "the crash was not noticed at once"

        await _await_replacement(client, "faulty", old_pid, t0)
        assert (await client.get("/v2/models/faulty/ready")).status_code == 200
        assert _gone(old_pid)
        ok = await client.post("/v2/models/faulty/infer", json=_x(0.5))
        assert ok.status_code == 200, ok.text
        stats = await _stats(client, "faulty")
        assert stats["restarts"] == 1, stats
        assert stats["pid"] != old_pid, stats
        assert (await client.post("/v2/models/mlp/infer", json=DIGITS)).status_code == 200


async def test_hung_worker_is_killed_and_replaced(faulty_config: Path) -> None:
    async with running_server(faulty_config) as (_, client):
        old_pid = (await _stats(client, "faulty"))["pid"]
        bystander = asyncio.create_task(client.post("/v2/models/mlp/infer", json=DIGITS))
        t0 = time.monotonic()
        r = await client.post("/v2/models/faulty/infer", json=_x(HANG))
        answered_s = time.monotonic() - t0
        assert r.status_code == 504, r.text
        assert "deadline" in _error(r)
        assert answered_s < HANG_TIMEOUT_MS / 1000 + HANG_MARGIN_S, answered_s
        assert (await bystander).status_code == 200

        await _await_replacement(client, "faulty", old_pid, t0)
        assert _gone(old_pid), "the hung worker still runs"
        for value in (0.25, 0.5):
            ok = await client.post("/v2/models/faulty/infer", json=_x(value))
            assert ok.status_code == 200, ok.text
            assert ok.json()["outputs"][0]["data"] == [value]
        stats = await _stats(client, "faulty")
        assert stats["pid"] != old_pid, stats
        assert stats["restarts"] == 1, stats
        events = (await client.get("/v2/stats")).json()["events"]
        crashes = [e["message"] for e in events if e["kind"] == "crashed"]
        assert len(crashes) == 1, events
        assert "killed after overrunning its deadline" in crashes[0], crashes


async def test_model_past_its_memory_limit_is_oom_killed(model_root: Path, tmp_path: Path) -> None:
    models = [
        python_model("leaky", "LeakyModel", preload=True, memory_limit_mb=LEAK_LIMIT_MB),
        {"name": "mlp", "path": "mlp", "preload": True},
    ]
    cfg = write_config(tmp_path, models, model_repository=str(model_root))
    async with running_server(cfg) as (_, client):
        stats = await _stats(client, "leaky")
        if not str(stats["worker"]["memory_limit_backend"]).startswith("cgroup"):
            pytest.skip("a kernel OOM kill needs the cgroup memory-limit backend")
        assert stats["worker"]["memory_limit_bytes"] == LEAK_LIMIT_MB * 1024 * 1024
        old_pid = stats["pid"]
        t0 = time.monotonic()
        r, bystander = await asyncio.gather(
            client.post("/v2/models/leaky/infer", json=_x(LEAK_MB)),
            client.post("/v2/models/mlp/infer", json=DIGITS),
        )
        assert r.status_code == 503, r.text
        message = _error(r)
        assert f"killed by OOM (memory limit {LEAK_LIMIT_MB} MiB)" in message, message
        assert bystander.status_code == 200, bystander.text

        await _await_replacement(client, "leaky", old_pid, t0)
        assert _gone(old_pid)
        small = await client.post("/v2/models/leaky/infer", json=_x(1.0))
        assert small.status_code == 200, small.text
        stats = await _stats(client, "leaky")
        assert stats["restarts"] == 1, stats
        assert stats["pid"] != old_pid, stats
        assert (await client.post("/v2/models/mlp/infer", json=DIGITS)).status_code == 200


async def test_model_whose_load_raises(model_root: Path, tmp_path: Path) -> None:
    models = [
        python_model("failing-load", "FailingLoadModel"),
        {"name": "mlp", "path": "mlp", "preload": True},
    ]
    cfg = write_config(tmp_path, models, model_repository=str(model_root))
    async with running_server(cfg) as (_, client):
        r = await client.post("/v2/models/failing-load/infer", json=_x(0.5))
        assert r.status_code == 503, r.text
        assert "refuses to load" in _error(r)
        row = await _index_row(client, "failing-load")
        assert row["state"] == "FAILED", row
        assert "refuses to load" in row["reason"], row
        ready = await client.get("/v2/models/failing-load/ready")
        assert ready.status_code == 400, ready.text

        explicit = await client.post("/v2/repository/models/failing-load/load")
        assert explicit.status_code == 503, explicit.text
        assert "refuses to load" in _error(explicit)
        assert (await _index_row(client, "failing-load"))["state"] == "FAILED"

        assert (await _index_row(client, "mlp"))["state"] == "READY"
        assert (await client.post("/v2/models/mlp/infer", json=DIGITS)).status_code == 200


# ------------------------------------------------------------------ memory and readiness


@pytest.mark.parametrize("size_mb", UNLOAD_SIZES)
async def test_unload_gives_memory_back(tmp_path: Path, size_mb: int) -> None:
    repo = tmp_path / "repo"
    build_mlp_onnx(repo / "big" / "1" / "model.onnx", size_mb)
    cfg = write_config(tmp_path, [{"name": "big", "path": "big"}], model_repository=str(repo))
    async with running_server(cfg) as (_, client):
        r = await client.post("/v2/repository/models/big/load")
        assert r.status_code == 200, r.text
        assert (await client.get("/v2/models/big/ready")).status_code == 200
        stats = await committed_stats(client, "big")
        pid, footprint = stats["pid"], stats["measured_bytes"]
        assert footprint >= size_mb * 1024 * 1024, stats
        assert pid in {p.pid for p in psutil.Process().children(recursive=True)}
        loaded_rss = _tree_rss()

        r = await client.post("/v2/repository/models/big/unload")
        assert r.status_code == 200, r.text
        assert _gone(pid), "the unloaded model's worker still runs"
        returned = loaded_rss - _tree_rss()
        assert returned >= RETURNED_FRACTION * footprint, (
            f"unload returned {returned / 2**20:.1f} MiB of a {footprint / 2**20:.1f} MiB footprint"
        )
        assert (await _index_row(client, "big"))["state"] == "UNLOADED"
        assert (await client.get("/v2/models/big/ready")).status_code == 400


@pytest.fixture
def slow_load_config(model_root: Path, tmp_path: Path) -> Path:
    """``slow-load``: every start of its worker takes LOAD_S, so a restart is watchable."""
    version_dir = tmp_path / "slow-load" / "1"
    version_dir.mkdir(parents=True)
    shutil.copy(FAKES / "slow_load_model.py", version_dir / "slow_load_model.py")
    model = {
        "name": "slow-load",
        "path": str(tmp_path / "slow-load"),
        "runtime": "python",
        "class": "slow_load_model:SlowLoadModel",
        "preload": True,
    }
    return write_config(tmp_path, [model], model_repository=str(model_root))


async def test_readiness_tells_the_truth_while_restarting(slow_load_config: Path) -> None:
    async with running_server(slow_load_config) as (_, client):
        old_pid = (await _stats(client, "slow-load"))["pid"]
        assert (await client.get("/v2/models/slow-load/ready")).status_code == 200
        assert (await _index_row(client, "slow-load"))["state"] == "READY"

        killed_at = time.monotonic()
        os.kill(old_pid, signal.SIGKILL)
        # (seconds after the kill, /ready status, index row, listed by the ready-only index)
        samples: list[tuple[float, int, dict[str, Any], bool]] = []
        while True:
            ready = await client.get("/v2/models/slow-load/ready")
            row = await _index_row(client, "slow-load")
            only_ready = await client.post("/v2/repository/index", json={"ready": True})
            listed = any(m["name"] == "slow-load" for m in only_ready.json())
            now = time.monotonic() - killed_at
            samples.append((now, ready.status_code, row, listed))
            if ready.status_code == 200 and any(s[1] != 200 for s in samples):
                break
            assert now < RECOVERY_S, f"not back within {RECOVERY_S} s: {samples[-3:]}"
        new_pid = (await _stats(client, "slow-load"))["pid"]
        ok = await client.post("/v2/models/slow-load/infer", json=_x(0.5))
        assert ok.status_code == 200, ok.text

    # Until the server notices the death (its exit report), it may still say ready.
    first_down = next(i for i, s in enumerate(samples) if s[1] != 200)
    assert samples[first_down][0] < NOTICE_S, "the death was noticed late"
    down = samples[first_down:]
    not_ready = [s for s in down if s[1] != 200]
    # A new worker spends LOAD_S loading: many samples must fall into that window.
    assert len(not_ready) >= 3, down
    for _, status, row, listed in down:
        # Each sample reads /ready, then the index, then the ready-only index; the model
        # only goes from not ready to ready, so a ready answer must be confirmed after it.
        if status == 200:
            assert row["state"] == "READY", down
        if row["state"] == "READY":
            assert listed, down
        else:
            assert status == 400, down
            assert row["state"] in ("LOADING", "WARMING"), row
            assert "worker died" in row["reason"], row
            assert "SIGKILL" in row["reason"], row
    assert new_pid != old_pid
    assert _gone(old_pid)


async def test_request_during_restart_is_served_by_the_one_new_worker(
    slow_load_config: Path,
) -> None:
    async with running_server(slow_load_config) as (_, client):
        old_pid = (await _stats(client, "slow-load"))["pid"]
        before = await _live_model_processes(client)
        assert old_pid in before
        killed_at = time.monotonic()
        os.kill(old_pid, signal.SIGKILL)
        while (await client.get("/v2/models/slow-load/ready")).status_code == 200:
            assert time.monotonic() - killed_at < NOTICE_S, "the death was noticed late"
        r = await client.post("/v2/models/slow-load/infer", json=_x(0.5))
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [0.5]
        # The restart already under way must not start a second worker once that
        # request's load is done; give it time to (wrongly) finish one.
        await asyncio.sleep(2 * LOAD_S)
        stats = await _stats(client, "slow-load")
        assert stats["ready"], stats
        assert stats["restarts"] == 1, stats
        assert await _live_model_processes(client) == (before - {old_pid}) | {stats["pid"]}


async def test_live_worker_memory_is_sampled_for_stats(model_root: Path, tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path, [python_model("leaky", "LeakyModel")], model_repository=str(model_root)
    )
    async with running_server(cfg, memory_sample_interval_s=0.05) as (app, client):
        assert (await client.post("/v2/repository/models/leaky/load")).status_code == 200

        async def uss() -> int:
            stats = (await client.get("/v2/stats")).json()
            row = next(m for m in stats["models"] if m["name"] == "leaky")
            return int(row["worker"]["uss_bytes"])

        await asyncio.sleep(0.2)
        before = await uss()
        body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [64.0]}]}
        assert (await client.post("/v2/models/leaky/infer", json=body)).status_code == 200
        for _ in range(50):
            await asyncio.sleep(0.05)
            if await uss() - before >= 60 * MIB:
                break
        assert await uss() - before >= 60 * MIB, "a worker that grew by 64 MiB shows it"
        assert app.manager.resolve("leaky", None).measured_bytes is not None
