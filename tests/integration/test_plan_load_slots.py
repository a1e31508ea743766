"""``modelyard plan --load-slots``: a live server with two load slots records its request
log under concurrent users; the plan replays it with two slots and predicts the live
run's loads and cold-start seconds (issue 16: the simulator against a real server)."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelyard.examples.mlp import build_mlp_onnx
from modelyard.simulation.traces import read_request_log
from tests.servers import running_server, write_config

pytestmark = pytest.mark.slow

N_MODELS = 6
USERS = 6
PER_USER = 8
BUDGET_MB = 30  # about three of the six models' footprints
BODY = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


async def _user(client: httpx.AsyncClient, names: list[str]) -> None:
    for name in names:
        # Generous: on 2 busy cores a request may wait for several loads in turn.
        r = await client.post(f"/v2/models/{name}/infer", json=BODY, timeout=120)
        assert r.status_code == 200, r.text


def _plan(log: Path, slots: int) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable, "-m", "modelyard.cli", "plan", "--trace", str(log), "--json",
            "--policies", "gdsf-decay", "--budget-mb", str(BUDGET_MB), "--load-slots", str(slots),
        ],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    row = next(r for r in rows if r["policy"] == "gdsf-decay")
    assert row["load_slots"] == slots
    return row


async def test_a_plan_with_the_servers_load_slots_predicts_its_loads_and_waits(
    tmp_path: Path,
) -> None:
    names = [f"m{i}" for i in range(N_MODELS)]
    for i, name in enumerate(names):
        build_mlp_onnx(tmp_path / "repo" / name / "1" / "model.onnx", 2.0, seed=i)
    log = tmp_path / "requests.jsonl"
    cfg = write_config(
        tmp_path,
        [{"name": n, "path": n} for n in names],
        model_repository=str(tmp_path / "repo"),
        devices=[{"name": "cpu", "memory_budget_mb": BUDGET_MB}],
        load_slots=2,
        spare_workers=0,
        prefetch={"enabled": False},
        request_log={"path": str(log)},
    )
    pick = random.Random(1)
    plans = [[pick.choice(names) for _ in range(PER_USER)] for _ in range(USERS)]
    async with running_server(cfg) as (_, client):
        await asyncio.gather(*(_user(client, p) for p in plans))
        stats = (await client.get("/v2/stats")).json()
    live_loads = sum(m["loads"] for m in stats["models"])
    live_s = sum(m["cold_start_s_total"] for m in stats["models"])
    assert read_request_log(log).load_slots == 2, "the log says how it was recorded"
    two = await asyncio.to_thread(_plan, log, 2)
    unbounded = await asyncio.to_thread(_plan, log, 0)
    # The replay's request times are the live ones, but live each user's next request
    # waits for the last answer, so a different wait shifts what follows: measured on
    # 2 busy cores, loads 1.1-1.4x live and cold-start seconds 0.6-1.7x (an unbounded
    # replay: 0.4-1.05x); at load average 5.7 (CI beside three other jobs) 34 loads
    # against 21 live (1.6x): slow live loads gather more requests each. The bounds say
    # "the same order of magnitude", which a replay ignoring the log's slots can miss.
    assert 0.5 * live_loads <= two["loads"] <= 2 * live_loads, (two, live_loads)
    assert 0.25 * live_s <= two["cold_start_s"] <= 4 * live_s, (two, live_s)
    # An unbounded replay is a different prediction, not a lower bound: which models are
    # still loading (so not evictable) changes which are evicted, and CI saw 1.878 s for
    # two slots against 1.947 s unbounded. The slot queue's own effect is checked on a
    # trace with no eviction: tests/unit/simulation/test_policies.py.
    assert unbounded["load_slots"] == 0, unbounded
    assert unbounded["loads"] > 0, unbounded
    assert default_slots(log) == 2, "without --load-slots, the log's own limit is used"


def default_slots(log: Path) -> int:
    out = subprocess.run(
        [sys.executable, "-m", "modelyard.cli", "plan", "--trace", str(log), "--json",
         "--policies", "lru", "--budget-mb", str(BUDGET_MB)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    slots: int = json.loads(out.stdout)[0]["load_slots"]
    return slots
