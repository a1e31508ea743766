"""A burst at three times one model's measured capacity, open loop, two priority classes
and a fallback model: what degradation promises, end to end on a real server."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelyard.bench.openloop import Answer, Post, Shot, open_loop, percentile
from tests.servers import running_server, write_config

from .conftest import python_model

HIGH, LOW = 1, 5
HIGH_SLO_S = 0.5
DEADLINE_S = 2.0
BURST_S = 10.0
OVERLOAD = 3.0
TRANSPORT_SLACK_S = 0.25
"""What the client may see beyond the server's deadline (HTTP, a busy shared loop)."""


def _request(i: int) -> tuple[str, dict[str, Any], int, float]:
    priority = HIGH if i % 10 == 0 else LOW  # a tenth of the traffic is important
    body = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [float(i)]}],
        "parameters": {"priority": priority},
    }
    return "/v2/models/paced/infer", body, priority, DEADLINE_S


def _poster(client: httpx.AsyncClient) -> Post:
    async def post(path: str, body: dict[str, Any]) -> Answer:
        try:
            response = await client.post(path, json=body)
        except httpx.HTTPError:
            return 0, None, None
        doc = response.json()
        served_by = response.headers.get("x-modelyard-served-by")
        return response.status_code, doc if isinstance(doc, dict) else None, served_by

    return post


def _y(shot: Shot) -> float:
    assert shot.doc is not None
    return float(shot.doc["outputs"][0]["data"][0])


@pytest.mark.slow
async def test_burst_at_three_times_capacity(model_root: Path, tmp_path: Path) -> None:
    models = [
        python_model(
            "paced",
            "PacedModel",
            preload=True,
            max_batch_size=0,
            timeout_s=DEADLINE_S,
            latency_slo_by_priority_s={HIGH: HIGH_SLO_S, LOW: 1.0},
            fallback=["doubling"],
        ),
        python_model("doubling", "DoublingModel", preload=True, timeout_s=DEADLINE_S),
    ]
    cfg = write_config(tmp_path, models, model_repository=str(model_root))
    async with (
        running_server(cfg) as (_, plain),
        httpx.AsyncClient(
            base_url=str(plain.base_url), timeout=30, limits=httpx.Limits(max_connections=400)
        ) as client,
    ):
        # The capacity of one model: sequential calls, one at a time.
        times = []
        for i in range(10):
            path, body, _, _ = _request(i)
            sent = time.perf_counter()
            r = await client.post(path, json=body)
            times.append(time.perf_counter() - sent)
            assert r.status_code == 200, r.text
        capacity = 1.0 / statistics.median(times)
        shots = await open_loop(
            _poster(client), _request, rate_per_s=OVERLOAD * capacity, duration_s=BURST_S
        )
        metrics = (await client.get("/metrics")).text

    unanswered = [s for s in shots if s.status == 0]
    assert not unanswered, f"{len(unanswered)} of {len(shots)} requests got no answer"
    failed = [s for s in shots if not s.is_ok]
    # Every request is answered, a few with a typed refusal (the fallback too may find
    # too little time left); none of those after its deadline.
    assert len(failed) <= len(shots) // 20, {s.status for s in failed}
    late_failures = [s for s in failed if s.latency_s > s.deadline_s + TRANSPORT_SLACK_S]
    assert not late_failures, [(s.status, round(s.latency_s, 3)) for s in late_failures]

    high = [s.latency_s for s in shots if s.priority == HIGH and s.is_ok]
    p99_high = percentile(high, 0.99)
    assert p99_high is not None
    assert p99_high <= HIGH_SLO_S, f"high-priority p99 {p99_high:.3f} s"

    by_fallback = [s for s in shots if s.is_ok and s.served_by is not None]
    by_model = [s for s in shots if s.is_ok and s.served_by is None]
    assert by_fallback, "the burst never reached the fallback"
    assert len(by_model) >= 0.5 * BURST_S * capacity, "the model itself answered too little"
    for shot in by_fallback:
        assert shot.served_by == "doubling"
        assert shot.doc is not None
        assert shot.doc["parameters"]["served_by"] == "doubling"
        assert _y(shot) == 2 * shot.index  # the fallback's own output
    for shot in by_model:
        assert _y(shot) == shot.index + 1
    assert 'modelyard_inference_fallbacks_total{fallback="doubling",model="paced"' in metrics
