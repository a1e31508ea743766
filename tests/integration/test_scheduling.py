"""Scheduling on a real server: batching, priorities, queue bounds, deadlines, breaker."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from modelyard.app import App
from tests.fakes.fault_models import FAIL, SLOW
from tests.integration.conftest import python_model
from tests.polling import wait_until
from tests.servers import running_server, write_config


def _pending(app: App) -> int:
    """Requests of ``faulty`` queued or running (0 before its scheduler exists)."""
    scheduler = app.manager.resolve("faulty", None).scheduler
    return 0 if scheduler is None else scheduler.pending


def _x(value: float, priority: int | None = None, timeout_us: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [value]}]
    }
    params: dict[str, Any] = {}
    if priority is not None:
        params["priority"] = priority
    if timeout_us is not None:
        params["timeout"] = timeout_us
    if params:
        body["parameters"] = params
    return body


@pytest.mark.parametrize("model", ["digits-logreg", "mlp"])
async def test_batched_outputs_equal_unbatched(
    model_root: Path, tmp_path: Path, model: str
) -> None:
    models = [
        {
            "name": model,
            "path": model,
            "isolation": "inline",
            "preload": True,
            "max_batch_size": 8,
            "max_queue_delay_us": 20_000,
        }
    ]
    cfg = write_config(tmp_path, models, model_repository=str(model_root))
    rng = np.random.default_rng(7)
    rows = rng.random((24, 64), dtype=np.float32) * 16
    sess = ort.InferenceSession(str(model_root / model / "1" / "model.onnx"))
    out_name = sess.get_outputs()[-1].name
    expected = [sess.run([out_name], {"input": row[None, :]})[0] for row in rows]
    async with running_server(cfg) as (app, client):
        bodies = [
            {
                "inputs": [
                    {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": r.tolist()}
                ]
            }
            for r in rows
        ]
        results = await asyncio.gather(
            *(client.post(f"/v2/models/{model}/infer", json=b) for b in bodies)
        )
        for r, exp in zip(results, expected, strict=True):
            assert r.status_code == 200, r.text
            out = next(o for o in r.json()["outputs"] if o["name"] == out_name)
            np.testing.assert_allclose(
                np.array(out["data"]).reshape(exp.shape), exp, rtol=1e-5, atol=1e-6
            )
        scheduler = app.manager.resolve(model, None).scheduler
        assert scheduler is not None
        stats = scheduler.counters
        assert stats["model_calls"] < len(rows), f"requests were not batched: {stats}"


@pytest.fixture
def slow_config(model_root: Path, tmp_path: Path) -> Path:
    models = [
        python_model(
            "faulty",
            "FaultyModel",
            isolation="inline",
            preload=True,
            max_batch_size=1,
            max_queue_size=4,
            timeout_ms=5000,
            breaker={"window": 4, "min_calls": 4, "failure_ratio": 0.5, "cooldown_s": 0.5},
        )
    ]
    return write_config(tmp_path, models, model_repository=str(model_root))


async def test_priority_order_under_a_full_queue(slow_config: Path) -> None:
    async with running_server(slow_config) as (app, client):
        order: list[str] = []

        async def send(tag: str, priority: int) -> None:
            r = await client.post("/v2/models/faulty/infer", json=_x(SLOW, priority))
            assert r.status_code == 200, r.text
            order.append(tag)

        blocker = asyncio.create_task(send("blocker", 1))
        await wait_until(lambda: _pending(app) == 1, what="the blocker runs")
        tasks = [asyncio.create_task(send(f"low{i}", 5)) for i in range(2)]
        await wait_until(lambda: _pending(app) == 3, what="both low requests are queued")
        tasks += [asyncio.create_task(send(f"high{i}", 1)) for i in range(2)]
        await asyncio.gather(blocker, *tasks)
        assert order[0] == "blocker"
        assert order[1:3] == ["high0", "high1"]
        assert sorted(order[3:]) == ["low0", "low1"]


async def test_queue_overflow_gives_429_and_server_stays_healthy(slow_config: Path) -> None:
    async with running_server(slow_config) as (app, client):
        first = asyncio.create_task(client.post("/v2/models/faulty/infer", json=_x(SLOW)))
        await wait_until(lambda: _pending(app) == 1, what="the first request runs")
        results = await asyncio.gather(
            *(client.post("/v2/models/faulty/infer", json=_x(SLOW)) for _ in range(8))
        )
        codes = sorted(r.status_code for r in results)
        assert codes.count(429) >= 4, codes
        rejected = next(r for r in results if r.status_code == 429)
        assert "retry-after" in rejected.headers
        assert "queue" in rejected.json()["error"]
        assert (await first).status_code == 200
        ok = await client.post("/v2/models/faulty/infer", json=_x(0.5))
        assert ok.status_code == 200
        assert ok.json()["outputs"][0]["data"] == [0.5]


async def test_deadline_of_queued_and_running_requests(slow_config: Path) -> None:
    async with running_server(slow_config) as (app, client):
        running = asyncio.create_task(
            client.post("/v2/models/faulty/infer", json=_x(SLOW, timeout_us=100_000))
        )
        await wait_until(lambda: _pending(app) == 1, what="the first request runs")
        t0 = time.monotonic()
        queued = await client.post("/v2/models/faulty/infer", json=_x(0.5, timeout_us=50_000))
        assert queued.status_code == 504, queued.text
        assert time.monotonic() - t0 < 0.25
        r = await running
        assert r.status_code == 504, r.text
        assert "deadline" in r.json()["error"]
        header = await client.post(
            "/v2/models/faulty/infer", json=_x(SLOW), headers={"X-Modelyard-Timeout-Ms": "50"}
        )
        assert header.status_code == 504


async def test_circuit_breaker_opens_and_recovers(slow_config: Path) -> None:
    async with running_server(slow_config) as (app, client):
        for _ in range(4):
            r = await client.post("/v2/models/faulty/infer", json=_x(FAIL))
            assert r.status_code == 500
            assert "failing on demand" in r.json()["error"]
        r = await client.post("/v2/models/faulty/infer", json=_x(0.5))
        assert r.status_code == 503
        assert "breaker" in r.json()["error"]
        assert "retry-after" in r.headers
        stats = app.manager.resolve("faulty", None).scheduler.stats()  # type: ignore[union-attr]
        assert stats["breaker_state"] == "open"
        await asyncio.sleep(0.6)
        r = await client.post("/v2/models/faulty/infer", json=_x(0.5))
        assert r.status_code == 200, r.text
        stats = app.manager.resolve("faulty", None).scheduler.stats()  # type: ignore[union-attr]
        assert stats["breaker_state"] == "closed"
        # Bad input is the client's fault and never opens the breaker.
        for _ in range(6):
            bad = await client.post(
                "/v2/models/faulty/infer",
                json={
                    "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]
                },
            )
            assert bad.status_code == 400
        assert (await client.post("/v2/models/faulty/infer", json=_x(0.5))).status_code == 200


async def test_a_client_that_disconnects_has_its_queued_request_removed(slow_config: Path) -> None:
    async with running_server(slow_config) as (app, client):
        blocker = asyncio.create_task(client.post("/v2/models/faulty/infer", json=_x(SLOW)))
        await wait_until(lambda: _pending(app) == 1, what="the blocker runs")
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v2/models/faulty/infer", json=_x(SLOW), timeout=0.1)
        assert (await blocker).status_code == 200
        scheduler = app.manager.resolve("faulty", None).scheduler
        assert scheduler is not None
        await wait_until(lambda: scheduler.counters["cancelled"] == 1, timeout_s=10.0)
        counters = scheduler.counters
        assert counters["cancelled"] == 1
        assert counters["model_calls"] == 1, "only the blocker ran; the cancelled one never did"
