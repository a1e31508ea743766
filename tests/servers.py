"""Start real servers for tests through the same App the CLI uses; build real models."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from modelyard.app import App
from modelyard.config.settings import load_settings


def write_config(root: Path, models: Sequence[Any], **server: Any) -> Path:
    """Write ``root/modelyard.yaml`` with ``models`` and server-level fields."""
    doc: dict[str, Any] = {"model_repository": ".", "models": [dict(m) for m in models]}
    doc.update(server)
    path = root / "modelyard.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@contextlib.asynccontextmanager
async def started_app(config_file: Path, **overrides: Any) -> AsyncIterator[App]:
    """An App on 127.0.0.1 with ephemeral HTTP and gRPC ports, stopped on exit."""
    settings = load_settings(config_file, host="127.0.0.1", http_port=0, grpc_port=0, **overrides)
    app = App(settings)
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


@contextlib.asynccontextmanager
async def running_server(
    config_file: Path, *, grpc: bool = False, **overrides: Any
) -> AsyncIterator[tuple[App, httpx.AsyncClient]]:
    """An App on 127.0.0.1 with ephemeral ports, and an HTTP client pointed at it."""
    settings = load_settings(
        config_file,
        host="127.0.0.1",
        http_port=0,
        grpc_port=0 if grpc else None,
        **overrides,
    )
    # load_settings ignores None overrides; grpc_port=None must really disable gRPC.
    if not grpc and settings.grpc_port is not None:
        settings = settings.model_copy(update={"grpc_port": None})
    app = App(settings)
    tasks_before = asyncio.all_tasks()
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    await app.start()
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{app.http_port}", timeout=30
        ) as client:
            yield app, client
    finally:
        await app.stop()
    await assert_nothing_left(app, tasks_before, children_before)


EXIT_WAIT_S = 3.0
"""How long a stopped server's worker processes get to exit before they count as left."""


async def assert_nothing_left(
    app: App, tasks_before: set[asyncio.Task[Any]], children_before: set[int]
) -> None:
    """After ``app.stop()``: no worker process, no reservation and no task may be left.

    Every background task must have an owner that cancels it before ``stop`` returns,
    and every worker must exit with its model; a leak here would grow with every load
    in a long-lived server.
    """
    reserved = {
        name: dict(dev.reservations)
        for name, dev in app.manager.budget.devices.items()
        if dev.reserved_bytes
    }
    assert not reserved, f"reservations left after stop: {reserved}"
    assert len(app.manager.tasks) == 0, "the manager's background tasks outlived stop()"
    await asyncio.sleep(0)  # a task cancelled by stop() takes its last step
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() - tasks_before if t is not me and not t.done()]
    assert not tasks, f"tasks left after stop: {[t.get_coro() for t in tasks]}"
    give_up = time.monotonic() + EXIT_WAIT_S
    while True:
        # A process started meanwhile by another server still running (a module-scoped
        # one refilling its spare pool) is a child of that server's fork server, which
        # was there before: not this server's.
        children = [
            p
            for p in psutil.Process().children(recursive=True)
            if p.pid not in children_before
            and _parent_pid(p) not in children_before
            and _is_worker(p)
        ]
        if not children or time.monotonic() > give_up:
            break
        await asyncio.sleep(0.02)
    assert not children, f"worker processes left after stop: {children}"


def _parent_pid(process: psutil.Process) -> int | None:
    try:
        return process.ppid()
    except psutil.NoSuchProcess:
        return None


def _is_worker(process: psutil.Process) -> bool:
    """A live process of this interpreter: the fork server or a model's worker.

    Other children (a browser a test drives, the resource tracker that a test's own
    ``multiprocessing`` helpers start and that lives until the test process exits) are
    the test's, not the server's.
    """
    try:
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        if any("multiprocessing" in part for part in process.cmdline()):
            return False
        return os.path.realpath(process.exe()) == _INTERPRETER
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


_INTERPRETER = os.path.realpath(sys.executable)


async def settled(app: App, timeout_s: float = 20.0) -> None:
    """Return once every measured footprint is committed and no model is on its way out.

    A model serves on its reservation before its footprint is measured; committing the
    measurement may then evict colder models (``manager/footprints.py``). So the answer
    to the request that loaded a model can arrive before the eviction it causes ends: a
    test that checks who is resident after a load waits for that here.
    """
    from modelyard.manager.states import ModelState
    from tests.polling import wait_until

    leaving = (ModelState.DRAINING, ModelState.UNLOADING)

    def calm() -> bool:
        return all(
            r.footprint_pending is None and r.state not in leaving for r in app.manager.records()
        )

    await wait_until(calm, timeout_s, what="footprints committed and evictions ended")


async def committed_stats(
    client: httpx.AsyncClient, name: str, version: str | None = None, timeout_s: float = 10.0
) -> dict[str, Any]:
    """``name``'s ``/v2/stats`` row once its measured footprint is committed.

    A worker's footprint is measured just after its model turns READY (the model serves
    on its reservation meanwhile), so a test that reads ``measured_bytes`` right after a
    load waits for that here.
    """
    give_up = time.monotonic() + timeout_s
    while True:
        r = await client.get("/v2/stats")
        assert r.status_code == 200, r.text
        rows = [
            m
            for m in r.json()["models"]
            if m["name"] == name and (version is None or m["version"] == version)
        ]
        assert len(rows) == 1, rows
        row: dict[str, Any] = rows[0]
        if not row["footprint_pending"] or time.monotonic() > give_up:
            return row
        await asyncio.sleep(0.01)
