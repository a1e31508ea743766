"""Explicit unload drains (issue 33): during a storm of loads and unloads of a few models
while clients infer, every answer is a 200 or the answer a model that is not loaded gets;
none is a 503 "not accepting requests (closed)"."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.servers import running_server, write_config

MODELS = ("d1", "d2", "d3")
STORM_S = 4.0
"""How long the storm lasts (short in CI; ``bench/bench_hostile.py`` runs it longer)."""
BODY = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}


@pytest.fixture
def config_file(model_root: Path, tmp_path: Path) -> Path:
    models = [
        {"name": name, "path": "digits-logreg", "preload": True, "isolation": isolation}
        for name, isolation in zip(MODELS, ("process", "process", "inline"), strict=True)
    ]
    return write_config(tmp_path, models, model_repository=str(model_root))


async def _client(client: httpx.AsyncClient, stop: asyncio.Event, seen: Counter[str]) -> None:
    rng = random.Random()
    while not stop.is_set():
        name = rng.choice(MODELS)
        r = await client.post(f"/v2/models/{name}/infer", json=BODY)
        seen[str(r.status_code) if r.status_code == 200 else f"{r.status_code}: {r.text}"] += 1


async def _churn(client: httpx.AsyncClient, stop: asyncio.Event, seed: int) -> int:
    rng = random.Random(seed)
    done = 0
    while not stop.is_set():
        name = rng.choice(MODELS)
        verb = rng.choice(("load", "unload", "unload"))
        r = await client.post(f"/v2/repository/models/{name}/{verb}")
        # A load in progress refuses an unload with 409; everything else succeeds.
        assert r.status_code in (200, 409), (verb, r.status_code, r.text)
        done += 1
        await asyncio.sleep(rng.uniform(0.0, 0.05))
    return done


async def test_unload_storm_never_answers_closed(config_file: Path) -> None:
    async with running_server(config_file) as (_, client):
        stop = asyncio.Event()
        seen: Counter[str] = Counter()
        clients = [asyncio.create_task(_client(client, stop, seen)) for _ in range(4)]
        churners = [asyncio.create_task(_churn(client, stop, seed)) for seed in range(3)]
        await asyncio.sleep(STORM_S)
        stop.set()
        churned = await asyncio.gather(*churners)
        await asyncio.gather(*clients)
        assert sum(churned) > 20, "the storm barely ran"
        assert seen["200"] > 20, seen
        assert set(seen) == {"200"}, seen
