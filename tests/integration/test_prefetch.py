"""Predictive preloading: after A, the model usually asked for next is loaded ahead."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.servers import running_server, write_config

BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}
MLP_BODY = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}


async def test_the_usual_successor_is_loaded_before_it_is_asked_for(
    model_root: Path, tmp_path: Path
) -> None:
    models = [
        {"name": "first", "path": "add", "isolation": "inline"},
        {"name": "second", "path": "add", "isolation": "inline"},
    ]
    cfg = write_config(tmp_path, models, model_repository=str(model_root))
    async with running_server(cfg) as (app, client):
        for _ in range(11):
            assert (await client.post("/v2/models/first/infer", json=BODY)).status_code == 200
            assert (await client.post("/v2/models/second/infer", json=BODY)).status_code == 200
        assert (await client.post("/v2/repository/models/second/unload")).status_code == 200
        second = app.manager.resolve("second", None)
        cold_before = second.stats.cold_starts
        assert (await client.post("/v2/models/first/infer", json=BODY)).status_code == 200
        for _ in range(100):
            if second.is_ready:
                break
            await asyncio.sleep(0.02)
        assert second.is_ready, "the predicted model was loaded without being asked for"
        assert second.stats.prefetches == 1
        assert second.stats.cold_starts == cold_before
        events = (await client.get("/v2/stats")).json()["events"]
        assert any(e["kind"] == "prefetch" and e["model"] == "second" for e in events)


async def test_a_prefetch_never_evicts(model_root: Path, tmp_path: Path) -> None:
    # A worker serving the 2 MB "mlp" measures about 10 MiB; "second" is declared at 20,
    # so once "first" is resident, 24 MiB has no free room for it.
    models = [
        {"name": "first", "path": "mlp"},
        {"name": "second", "path": "mlp", "memory_mb": 20},
    ]
    cfg = write_config(
        tmp_path,
        models,
        model_repository=str(model_root),
        devices=[{"name": "cpu", "memory_budget_mb": 24}],
        prefetch={"min_observations": 2},
    )
    async with running_server(cfg) as (app, client):
        for _ in range(3):
            assert (await client.post("/v2/models/first/infer", json=MLP_BODY)).status_code == 200
            assert (await client.post("/v2/models/second/infer", json=MLP_BODY)).status_code == 200
        assert app.manager.resolve("second", None).stats.prefetches == 0
        await client.post("/v2/repository/models/second/unload")
        await client.post("/v2/repository/models/first/load")
        # "first" is resident; prefetching "second" would need its room.
        assert (await client.post("/v2/models/first/infer", json=MLP_BODY)).status_code == 200
        await asyncio.sleep(0.2)
        assert app.manager.resolve("first", None).is_ready
        assert app.manager.resolve("second", None).stats.prefetches == 0
