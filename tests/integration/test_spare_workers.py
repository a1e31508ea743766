"""Spare workers on a real server: a load claims the idle worker started ahead.

``/v2/health/details`` lists the idle spares (``spare_workers``); ``/v2/stats`` says which
worker serves a model and whether it was a spare (``worker.from_spare``). Every server
here is stopped by ``running_server``, which fails the test if any worker process (spares
included) outlives the stop.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.polling import wait_until
from tests.servers import running_server, write_config

SPARE_S = 10.0
"""How long a spare may take to appear on a loaded 2-core box."""
MLP = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


async def _spares(client: httpx.AsyncClient) -> list[int]:
    r = await client.get("/v2/health/details")
    assert r.status_code == 200, r.text
    spares: list[int] = r.json()["spare_workers"]
    return spares


async def _one_spare(client: httpx.AsyncClient) -> int:
    async def one() -> bool:
        return len(await _spares(client)) == 1

    await wait_until(one, SPARE_S, what="one idle spare worker")
    return (await _spares(client))[0]


async def _stats(client: httpx.AsyncClient, name: str) -> dict[str, Any]:
    rows = [m for m in (await client.get("/v2/stats")).json()["models"] if m["name"] == name]
    assert len(rows) == 1, rows
    row: dict[str, Any] = rows[0]
    return row


def _config(tmp_path: Path, model_root: Path, **server: Any) -> Path:
    models = [{"name": "mlp", "path": "mlp"}, {"name": "add", "path": "add"}]
    return write_config(tmp_path, models, model_repository=str(model_root), **server)


async def test_a_load_claims_the_spare_and_another_spare_follows(
    tmp_path: Path, model_root: Path
) -> None:
    async with running_server(_config(tmp_path, model_root)) as (_, client):
        spare = await _one_spare(client)

        r = await client.post("/v2/models/mlp/infer", json=MLP)

        assert r.status_code == 200, r.text
        stats = await _stats(client, "mlp")
        assert stats["pid"] == spare, "the load did not take the idle spare"
        assert stats["worker"]["from_spare"] is True
        follower = await _one_spare(client)
        assert follower != spare
        # The next load takes the new spare: the pool keeps up with switches.
        assert (await client.post("/v2/repository/models/add/load")).status_code == 200
        assert (await _stats(client, "add"))["pid"] == follower


@pytest.mark.slow  # tests/integration/workers/test_spares.py covers it on a factory, fast
async def test_a_killed_spare_is_replaced_and_loads_still_work(
    tmp_path: Path, model_root: Path
) -> None:
    async with running_server(_config(tmp_path, model_root)) as (_, client):
        dead = await _one_spare(client)
        os.kill(dead, signal.SIGKILL)

        async def replaced() -> bool:
            return (await _spares(client)) not in ([], [dead])

        await wait_until(replaced, SPARE_S, what="the killed spare is replaced")
        replacement = (await _spares(client))[0]
        r = await client.post("/v2/models/mlp/infer", json=MLP)

        assert r.status_code == 200, r.text
        assert (await _stats(client, "mlp"))["pid"] == replacement


async def test_spare_workers_zero_keeps_none(tmp_path: Path, model_root: Path) -> None:
    async with running_server(_config(tmp_path, model_root, spare_workers=0)) as (app, client):
        assert (await client.post("/v2/models/mlp/infer", json=MLP)).status_code == 200
        stats = await _stats(client, "mlp")

        assert stats["worker"]["from_spare"] is False
        assert await _spares(client) == []
        assert app.settings.spare_worker_count == 0


@pytest.mark.slow
async def test_by_default_each_device_gets_a_spare(tmp_path: Path, model_root: Path) -> None:
    devices = [
        {"name": "cpu:0", "memory_budget_mb": 256},
        {"name": "cpu:1", "memory_budget_mb": 256},
    ]
    models = [{"name": "mlp", "path": "mlp", "device": "cpu:1"}]
    cfg = write_config(tmp_path, models, model_repository=str(model_root), devices=devices)
    async with running_server(cfg) as (_, client):

        async def two() -> bool:
            return len(await _spares(client)) == 2

        await wait_until(two, SPARE_S, what="a spare per core set")
        spares = await _spares(client)

        assert (await client.post("/v2/models/mlp/infer", json=MLP)).status_code == 200
        stats = await _stats(client, "mlp")
        # A spare belongs to no core set until it loads: it pinned itself to cpu:1.
        assert stats["pid"] in spares
        assert os.sched_getaffinity(stats["pid"]) == {1}
