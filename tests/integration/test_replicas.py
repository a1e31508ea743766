"""Replicas with real workers on two core-set devices (``cpu:0`` and ``cpu:1``).

A replica is added under a sustained queue and removed once idle; each worker is pinned
to its device's cores; killing one replica's worker (mid-request) leaves the others
serving with zero failed requests; no device's budget is ever exceeded.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from modelyard.app import App
from modelyard.manager.records import ModelRecord, ReplicaState
from tests.integration.conftest import python_model
from tests.servers import running_server, write_config

SLOW = 4.0  # the faulty model sleeps 0.3 s on this input
DEVICES = [
    {"name": "cpu:0", "memory_budget_mb": 400},
    {"name": "cpu:1", "memory_budget_mb": 400},
]

pytestmark = pytest.mark.skipif(
    not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1 for two core sets"
)


def body(x: float) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [x]}]}


async def until(condition: Callable[[], bool], within_s: float = 20.0) -> None:
    give_up = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < give_up, "condition not met in time"
        await asyncio.sleep(0.02)


def ready_replicas(record: ModelRecord) -> list[Any]:
    return [r for r in record.replicas if r.state is ReplicaState.READY]


def faulty_config(model_root: Path, replicas: dict[str, Any]) -> Path:
    """A config serving the ``faulty`` model (100 MB) with ``replicas`` over both cores."""
    model = python_model(
        "faulty",
        "FaultyModel",
        devices=["cpu:0", "cpu:1"],
        replicas=replicas,
        max_batch_size=0,
        memory_mb=100,
    )
    return write_config(model_root, [model], devices=DEVICES)


def assert_within_budgets(app: App) -> None:
    for dev in app.manager.budget.devices.values():
        assert dev.reserved_bytes <= dev.budget_bytes, dev.name


@pytest.mark.slow
async def test_a_replica_is_added_under_load_and_removed_when_idle(model_root: Path) -> None:
    replicas = {"min": 1, "max": 2, "target_queue_depth": 1, "scale_up_after_s": 0.2}
    replicas["scale_down_idle_s"] = 1.0
    config = faulty_config(model_root, replicas)
    async with running_server(config) as (app, client):
        assert (await client.post("/v2/models/faulty/infer", json=body(0.5))).status_code == 200
        record = app.manager.resolve("faulty", None)
        assert record.device == "cpu:0"
        first_pid = record.info.pid if record.info else None
        assert first_pid is not None
        assert psutil.Process(first_pid).cpu_affinity() == [0], "pinned to its core set"

        statuses: list[int] = []
        stop = asyncio.Event()

        async def client_loop() -> None:
            while not stop.is_set():
                r = await client.post("/v2/models/faulty/infer", json=body(SLOW))
                statuses.append(r.status_code)

        loops = [asyncio.ensure_future(client_loop()) for _ in range(6)]
        await until(lambda: len(ready_replicas(record)) == 1)
        [replica] = record.replicas
        assert replica.device == "cpu:1"
        assert replica.info is not None
        assert replica.info.pid is not None
        assert psutil.Process(replica.info.pid).cpu_affinity() == [1]
        assert_within_budgets(app)
        scheduler = replica.scheduler
        assert scheduler is not None
        stats = (await client.get("/v2/stats")).json()
        [row] = [m for m in stats["models"] if m["name"] == "faulty"]
        assert row["replicas"][0]["device"] == "cpu:1"
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*loops)
        assert set(statuses) == {200}
        assert scheduler.counters["succeeded"] > 0, "the new replica took requests"
        stats = (await client.get("/v2/stats")).json()
        [row] = [m for m in stats["models"] if m["name"] == "faulty"]
        [view] = row["replicas"]
        # Its calls beside its answers: the rows per call its batches carried.
        assert 0 < view["model_calls"] <= view["succeeded"]
        await until(lambda: record.replicas == [], within_s=10.0)
        assert app.manager.budget.device("cpu:1").reserved_bytes == 0
        kinds = [e.kind for e in app.manager.events.recent()]
        assert "replica_added" in kinds
        assert "replica_removed" in kinds
        metrics = (await client.get("/metrics")).text
        assert 'modelyard_model_device_memory_bytes{device="cpu:0",model="faulty"}' in metrics


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["extra", "first"])
async def test_killing_one_replicas_worker_fails_no_request(model_root: Path, victim: str) -> None:
    config = faulty_config(model_root, {"min": 2, "max": 2})
    async with running_server(config) as (app, client):
        assert (await client.post("/v2/models/faulty/infer", json=body(0.5))).status_code == 200
        record = app.manager.resolve("faulty", None)
        await until(lambda: len(ready_replicas(record)) == 1)
        [replica] = record.replicas
        target = replica.info if victim == "extra" else record.info
        assert target is not None
        assert target.pid is not None
        statuses: list[int] = []
        stop = asyncio.Event()

        async def client_loop(client: httpx.AsyncClient) -> None:
            while not stop.is_set():
                r = await client.post("/v2/models/faulty/infer", json=body(SLOW))
                statuses.append(r.status_code)

        loops = [asyncio.ensure_future(client_loop(client)) for _ in range(4)]
        await asyncio.sleep(0.8)  # requests are running on both workers now
        os.kill(target.pid, signal.SIGKILL)
        await asyncio.sleep(1.2)
        stop.set()
        await asyncio.gather(*loops)
        assert len(statuses) >= 8
        assert set(statuses) == {200}, f"failed requests: {statuses}"
        assert_within_budgets(app)
