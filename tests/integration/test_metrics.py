"""``GET /metrics`` on a real server: a scripted session moves every metric it should.

Load, infer, errors, a cold start, an eviction under a tiny budget, a failed and a
refused load, and (with process isolation) a worker crash and its restart.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from modelyard.observability.metrics import Metrics
from tests.polling import wait_until
from tests.servers import committed_stats, running_server, write_config

MIB = 1024 * 1024
BUDGET_MB = 48
BALLAST_MB = 24

BALLAST = f'''
"""Echo that holds {BALLAST_MB} MiB once loaded, so two cannot share a {BUDGET_MB} MiB budget."""
import numpy as np
from modelyard.runtimes.base import TensorSpec


class BallastModel:
    inputs = [TensorSpec("x", "FP32", (-1, 1))]
    outputs = [TensorSpec("y", "FP32", (-1, 1))]

    def load(self, version_dir: str) -> None:
        self.ballast = np.ones({BALLAST_MB} * 1024 * 1024, dtype=np.uint8)

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {{"y": inputs["x"].astype(np.float32)}}
'''


# --------------------------------------------------------------------------- helpers

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(client: httpx.AsyncClient) -> Samples:
    r = await client.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def get(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value; 0 when absent (a counter child that never moved)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def x(value: float) -> dict[str, object]:
    return {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}


def fake(root: Path, name: str, cls: str, **fields: object) -> dict[str, object]:
    """A python model from ``model_root`` by absolute path."""
    module = name.replace("-", "_") + "_model"
    path = str(root / name)
    return {"path": path, "runtime": "python", "class": f"{module}:{cls}", **fields}


# --------------------------------------------------------------------------- tests


@pytest.fixture
def session_config(model_root: Path, tmp_path: Path) -> Path:
    for name in ("ballast-a", "ballast-b"):
        folder = tmp_path / "repo" / name / "1"
        folder.mkdir(parents=True)
        (folder / "ballast.py").write_text(BALLAST, encoding="utf-8")
    ballast = {"runtime": "python", "class": "ballast:BallastModel", "isolation": "inline"}
    models: list[dict[str, Any]] = [
        {"name": "echo", **fake(model_root, "echo", "EchoModel"), "isolation": "inline"}
        | {"preload": True, "pinned": True},
        {"name": "faulty", **fake(model_root, "faulty", "FaultyModel"), "isolation": "inline"},
        {"name": "ballast-a", "path": "ballast-a", "memory_mb": BALLAST_MB, **ballast},
        # ballast-a's reservation becomes its measured RSS growth, which is less than
        # BALLAST_MB when the server's heap has free pages to reuse (late in a long test
        # run); ballast-b declares enough that they can never share the budget anyway.
        {"name": "ballast-b", "path": "ballast-b", "memory_mb": BUDGET_MB - 8, **ballast},
        {"name": "broken", **fake(model_root, "failing-load", "FailingLoadModel")}
        | {"isolation": "inline"},
        {"name": "huge", **fake(model_root, "echo", "EchoModel"), "isolation": "inline"}
        | {"memory_mb": BUDGET_MB * 2},
    ]
    return write_config(
        tmp_path,
        models,
        model_repository=str(tmp_path / "repo"),
        devices=[{"name": "cpu", "memory_budget_mb": BUDGET_MB}],
    )


async def test_a_scripted_session_moves_every_metric(session_config: Path) -> None:
    async with running_server(session_config) as (app, client):
        assert isinstance(app.metrics, Metrics)
        m = await scrape(client)
        echo = {"model": "echo", "version": "1"}
        assert get(m, "modelyard_model_state", **echo, state="READY") == 1
        assert get(m, "modelyard_model_state", **echo, state="UNLOADED") == 0
        assert get(m, "modelyard_model_loads_total", **echo) == 1
        assert get(m, "modelyard_model_switch_latency_seconds_count", **echo) == 1
        assert get(m, "modelyard_device_memory_budget_bytes", device="cpu") == BUDGET_MB * MIB
        assert get(m, "modelyard_scheduler_breaker_state", **echo) == 0
        assert get(m, "modelyard_scheduler_queued_requests", **echo) == 0
        assert get(m, "modelyard_process_resident_memory_bytes") > 0

        # Traffic that works.
        for _ in range(3):
            assert (await client.post("/v2/models/echo/infer", json=x(0.5))).status_code == 200
        m = await scrape(client)
        assert get(m, "modelyard_inference_requests_total", **echo, code="ok") == 3
        assert get(m, "modelyard_inference_request_duration_seconds_count", **echo) == 3
        assert get(m, "modelyard_inference_queue_duration_seconds_count", **echo) == 3
        assert get(m, "modelyard_inference_compute_duration_seconds_count", **echo) == 3
        assert get(m, "modelyard_scheduler_batch_size_rows_sum", **echo) == 3
        assert get(m, "modelyard_scheduler_batch_compute_seconds_count", **echo) >= 1

        # Traffic that fails, each with its code.
        faulty = {"model": "faulty", "version": "1"}
        assert (await client.post("/v2/models/faulty/infer", json=x(3.0))).status_code == 500
        bad = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
        assert (await client.post("/v2/models/echo/infer", json=bad)).status_code == 400
        assert (await client.post("/v2/models/nope/infer", json=x(0.5))).status_code == 404
        m = await scrape(client)
        assert get(m, "modelyard_inference_requests_total", **faulty, code="internal") == 1
        assert get(m, "modelyard_inference_requests_total", **echo, code="invalid_input") == 1
        no_model = {"model": "", "version": "", "code": "model_not_found"}
        assert get(m, "modelyard_inference_requests_total", **no_model) == 1
        assert get(m, "modelyard_model_cold_starts_total", **faulty) == 1
        assert get(m, "modelyard_model_cold_start_wait_seconds_count", **faulty) == 1

        # A cold start that fits, then one that evicts it (two ballasts exceed the budget).
        a = {"model": "ballast-a", "version": "1"}
        b = {"model": "ballast-b", "version": "1"}
        assert (await client.post("/v2/models/ballast-a/infer", json=x(0.5))).status_code == 200
        await committed_stats(client, "ballast-a")  # measured just after it turned READY
        m = await scrape(client)
        assert get(m, "modelyard_model_cold_start_wait_seconds_count", **a) == 1
        assert get(m, "modelyard_model_measured_bytes", **a, device="cpu") > BALLAST_MB * MIB / 2
        reserved_a = get(m, "modelyard_model_reserved_bytes", **a, device="cpu")
        assert reserved_a >= BALLAST_MB * MIB / 2
        assert get(m, "modelyard_device_memory_reserved_bytes", device="cpu") >= reserved_a
        assert get(m, "modelyard_device_memory_used_bytes", device="cpu") > BALLAST_MB * MIB / 2
        free = get(m, "modelyard_device_memory_free_bytes", device="cpu")
        assert free == BUDGET_MB * MIB - get(
            m, "modelyard_device_memory_reserved_bytes", device="cpu"
        )

        assert (await client.post("/v2/models/ballast-b/infer", json=x(0.5))).status_code == 200

        async def evicted() -> bool:
            m = await scrape(client)
            return get(m, "modelyard_model_state", **a, state="UNLOADED") == 1

        await wait_until(evicted, 20.0, interval_s=0.05)
        m = await scrape(client)
        assert get(m, "modelyard_model_evictions_total", **a) == 1
        assert get(m, "modelyard_model_unloads_total", **a) == 1
        assert get(m, "modelyard_model_reserved_bytes", **a, device="cpu") == 0
        assert get(m, "modelyard_model_state", **b, state="READY") == 1
        assert get(m, "modelyard_model_state", **echo, state="READY") == 1  # pinned
        assert get(m, "modelyard_model_events_total", **a, kind="evicted") == 1

        # A load that fails and one refused for memory.
        assert (await client.post("/v2/repository/models/broken/load")).status_code >= 400
        assert (await client.post("/v2/repository/models/huge/load")).status_code >= 400
        m = await scrape(client)
        broken = {"model": "broken", "version": "1"}
        huge = {"model": "huge", "version": "1"}
        assert get(m, "modelyard_model_load_failures_total", **broken, reason="failed") == 1
        assert get(m, "modelyard_model_load_failures_total", **huge, reason="refused") == 1
        assert get(m, "modelyard_model_state", **broken, state="FAILED") == 1
        assert get(m, "modelyard_model_loads_total", **broken) == 0


async def test_metrics_negotiates_openmetrics(session_config: Path) -> None:
    async with running_server(session_config) as (_, client):
        r = await client.get("/metrics", headers={"Accept": "application/openmetrics-text"})
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/openmetrics-text")
        assert r.text.rstrip().endswith("# EOF")


@contextlib.asynccontextmanager
async def crash_server(model_root: Path, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    models = [{"name": "faulty", **fake(model_root, "faulty", "FaultyModel"), "preload": True}]
    config = write_config(tmp_path, models, model_repository=str(model_root))
    async with running_server(config) as (app, client):
        record = app.manager.resolve("faulty", None)
        if not record.is_ready:  # this test is about metrics, not about starting workers
            pytest.skip(f"process isolation is not available here: {record.reason}")
        yield client


async def test_a_worker_crash_and_restart_are_counted(model_root: Path, tmp_path: Path) -> None:
    faulty = {"model": "faulty", "version": "1"}
    async with crash_server(model_root, tmp_path) as client:
        m = await scrape(client)
        assert get(m, "modelyard_worker_memory_bytes", **faulty, kind="rss") > 0
        assert get(m, "modelyard_worker_memory_bytes", **faulty, kind="uss") > 0
        assert (await client.post("/v2/models/faulty/infer", json=x(0.5))).status_code == 200
        crashed = await client.post("/v2/models/faulty/infer", json=x(1.0))
        assert crashed.status_code == 503, crashed.text

        async def restarted() -> bool:
            m = await scrape(client)
            return get(m, "modelyard_model_restarts_total", **faulty) == 1

        await wait_until(restarted, 20.0, interval_s=0.05)
        m = await scrape(client)
        assert get(m, "modelyard_model_crashes_total", **faulty) == 1
        assert get(m, "modelyard_inference_requests_total", **faulty, code="worker_crashed") == 1
        assert get(m, "modelyard_inference_requests_total", **faulty, code="ok") == 1
        assert (await client.post("/v2/models/faulty/infer", json=x(0.5))).status_code == 200
