"""The byte budget on a real server: eviction, pins, priorities, draining, concurrency.

Models are process-isolated ONNX MLPs; their measured footprint is the worker's USS.
Budgets are chosen with wide margins around those footprints so the tests do not
depend on exact sizes: an "mlp-20" measures about 36 MiB here, an "mlp-5" about 14.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelyard.app import App
from modelyard.examples.mlp import build_mlp_onnx
from tests.fakes.fault_models import SLOW
from tests.integration.conftest import python_model
from tests.polling import wait_until
from tests.servers import running_server, settled, write_config

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def mlp_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("budget-repo")
    for i in range(6):
        build_mlp_onnx(root / f"mlp5-{i}" / "1" / "model.onnx", 5, seed=i)
    for i in range(3):
        build_mlp_onnx(root / f"mlp20-{i}" / "1" / "model.onnx", 20, seed=10 + i)
    return root


def _body(n: int = 64) -> dict[str, Any]:
    return {"inputs": [{"name": "input", "shape": [1, n], "datatype": "FP32", "data": [0.1] * n}]}


async def _infer(client: httpx.AsyncClient, model: str) -> httpx.Response:
    return await client.post(f"/v2/models/{model}/infer", json=_body())


def _states(app: App) -> dict[str, str]:
    return {r.key.name: r.state.value for r in app.manager.records()}


def _check_budget(app: App) -> None:
    for dev in app.manager.budget.devices.values():
        assert dev.reserved_bytes <= dev.budget_bytes, (dev.name, dev.reserved_bytes)


async def test_lru_eviction_makes_room_and_pinned_is_never_evicted(
    mlp_root: Path, tmp_path: Path
) -> None:
    models = [
        {"name": "mlp20-0", "path": "mlp20-0", "pinned": True, "preload": True},
        {"name": "mlp20-1", "path": "mlp20-1"},
        {"name": "mlp20-2", "path": "mlp20-2"},
    ]
    cfg = write_config(
        tmp_path,
        models,
        model_repository=str(mlp_root),
        devices=[{"name": "cpu", "memory_budget_mb": 100}],
    )
    async with running_server(cfg) as (app, client):
        assert (await _infer(client, "mlp20-1")).status_code == 200
        await settled(app)
        assert _states(app)["mlp20-1"] == "READY"
        r = await _infer(client, "mlp20-2")
        assert r.status_code == 200, r.text
        await settled(app)
        states = _states(app)
        assert states["mlp20-0"] == "READY", "the pinned model stays"
        assert states["mlp20-1"] == "UNLOADED", "the least recently used unpinned model left"
        assert states["mlp20-2"] == "READY"
        assert app.manager.resolve("mlp20-1", None).stats.evictions == 1
        _check_budget(app)
        # Pin the other two: now nothing can make room, and the refusal says why.
        for name in ("mlp20-2",):
            assert (await client.post(f"/v2/repository/models/{name}/pin")).status_code == 200
        r = await _infer(client, "mlp20-1")
        assert r.status_code == 503
        assert "retry-after" in r.headers
        msg = r.json()["error"]
        assert "budget 100.0 MiB" in msg
        assert "pinned: mlp20-0:1, mlp20-2:1" in msg
        stats = (await client.get("/v2/stats")).json()
        dev = stats["devices"][0]
        assert dev["budget_bytes"] == 100 * MIB
        assert dev["reserved_bytes"] + dev["free_bytes"] == dev["budget_bytes"]


async def test_low_priority_load_never_evicts_high_priority(mlp_root: Path, tmp_path: Path) -> None:
    models = [
        {"name": "mlp20-0", "path": "mlp20-0", "priority": 1, "preload": True},
        {"name": "mlp20-1", "path": "mlp20-1", "priority": 5},
    ]
    cfg = write_config(
        tmp_path,
        models,
        model_repository=str(mlp_root),
        devices=[{"name": "cpu", "memory_budget_mb": 60}],
    )
    async with running_server(cfg) as (app, client):
        r = await _infer(client, "mlp20-1")
        assert r.status_code == 503, r.text
        assert "higher priority: mlp20-0:1" in r.json()["error"]
        assert _states(app)["mlp20-0"] == "READY"
        assert (await _infer(client, "mlp20-0")).status_code == 200


async def test_a_victim_with_requests_in_flight_drains_first(
    mlp_root: Path, model_root: Path, tmp_path: Path
) -> None:
    faulty = python_model("faulty", "FaultyModel", max_batch_size=1, timeout_ms=5000)
    faulty["path"] = str(model_root / "faulty")
    # faulty measures about 4 MiB; 4 + the declared 45 does not fit in 46.
    models = [faulty, {"name": "mlp20-0", "path": "mlp20-0", "memory_mb": 45}]
    cfg = write_config(
        tmp_path,
        models,
        model_repository=str(mlp_root),
        devices=[{"name": "cpu", "memory_budget_mb": 46}],
    )
    slow = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [SLOW]}]}
    async with running_server(cfg) as (app, client):
        assert (await client.post("/v2/repository/models/faulty/load")).status_code == 200
        in_flight = [
            asyncio.create_task(client.post("/v2/models/faulty/infer", json=slow)) for _ in range(3)
        ]
        slow_scheduler = app.manager.resolve("faulty", None).scheduler
        assert slow_scheduler is not None
        await wait_until(lambda: slow_scheduler.pending == 3, what="the three slow requests are in")
        r = await _infer(client, "mlp20-0")
        assert r.status_code == 200, r.text
        for task in in_flight:
            done = await task
            assert done.status_code == 200, "eviction must not fail a request"
            assert done.json()["outputs"][0]["data"] == [SLOW]
        await settled(app)
        assert _states(app)["faulty"] == "UNLOADED"
        events = [e["kind"] for e in (await client.get("/v2/stats")).json()["events"]]
        assert "evicted" in events
        _check_budget(app)


@pytest.mark.parametrize("policy", ["lru", "cost"])
async def test_concurrent_loads_never_over_commit(
    mlp_root: Path, tmp_path: Path, policy: str
) -> None:
    models = [{"name": f"mlp5-{i}", "path": f"mlp5-{i}"} for i in range(6)]
    cfg = write_config(
        tmp_path,
        models,
        model_repository=str(mlp_root),
        devices=[{"name": "cpu", "memory_budget_mb": 48}],
        eviction_policy=policy,
    )
    async with running_server(cfg) as (app, client):
        stop = asyncio.Event()
        samples = 0

        async def sampler() -> None:
            nonlocal samples
            while not stop.is_set():
                _check_budget(app)
                samples += 1
                await asyncio.sleep(0.001)

        watcher = asyncio.create_task(sampler())
        rounds = [
            await asyncio.gather(*(_infer(client, f"mlp5-{i}") for i in range(6))) for _ in range(3)
        ]
        stop.set()
        await watcher
        codes = [r.status_code for batch in rounds for r in batch]
        assert codes == [200] * len(codes), [
            r.text for b in rounds for r in b if r.status_code != 200
        ]
        assert samples > 50
        await settled(app)
        resident = sum(1 for s in _states(app).values() if s == "READY")
        assert 1 <= resident < 6
        assert sum(r.stats.evictions for r in app.manager.records()) >= 3


async def test_a_model_larger_than_the_budget_is_refused_clearly(
    mlp_root: Path, tmp_path: Path
) -> None:
    models = [{"name": "mlp20-0", "path": "mlp20-0", "memory_mb": 500}]
    cfg = write_config(
        tmp_path,
        models,
        model_repository=str(mlp_root),
        devices=[{"name": "cpu", "memory_budget_mb": 100}],
    )
    async with running_server(cfg) as (_, client):
        r = await _infer(client, "mlp20-0")
        assert r.status_code == 503
        assert "more than the whole 100.0 MiB budget of cpu" in r.json()["error"]
