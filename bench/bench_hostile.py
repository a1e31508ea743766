"""Hostile load beside a good client (issue 33): what a good client sees while one slow
call, too-big requests and an unload storm hit the same server.

Run from the repository root::

    .venv/bin/python bench/bench_hostile.py            # 30 s per scene
    .venv/bin/python bench/bench_hostile.py --quick    # 6 s per scene

One ``modelyard serve`` subprocess serves copies of a Python model that sleeps 0.2 ms
per row (``tests/fakes/fault_models.py:RowsModel``: 4,500 rows take 0.9 s), in worker
processes. A good client sends one-row requests, one at a time, to a calm copy first
(the baseline of the same run), then during each scene:

* **slow-first-call**: a fresh copy with ``timeout_s: 1`` whose first call carries 4,500
  rows; the good client then uses that copy (issue: 40 of 40 refused, forever);
* **shed-after-long-call**: a copy with ``latency_slo_by_priority_s: {1: 3}`` whose first
  call (priority 1) takes 2 s; the good client sends priority 3 (issue: all shed);
* **too-big**: a hostile client sends 10,000-row requests in a loop to a copy with
  ``timeout_s: 1`` and ``max_request_rows: 2000`` while the good client uses it too;
* **unload-storm**: three threads load and unload three copies while four good clients
  infer on them (issue: 45 answers 503 "closed" in 60 s).

Reported per scene: the good clients' requests, share answered 200 (and within the first
10 s), p99 of the 200s against the baseline's (a ratio: the machine is shared and loaded),
the error statuses and their count; for the storm, the "closed" answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import _server
import httpx

from modelyard.bench.openloop import percentile

REPO = Path(__file__).resolve().parent.parent
FAULT_MODELS = REPO / "tests" / "fakes" / "fault_models.py"
ROW_S = 0.0002
CAP_ROWS = 2000
STORM = ("s1", "s2", "s3")


def _model(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "path": "rows",
        "runtime": "python",
        "class": "rows_model:RowsModel",
        "preload": True,
        **fields,
    }


def write_repository(root: Path) -> Path:
    """The model folder and the server YAML; return the YAML's path."""
    folder = root / "rows" / "1"
    folder.mkdir(parents=True)
    shutil.copy(FAULT_MODELS, folder / "rows_model.py")
    models = [
        _model("calm", timeout_s=1.0),
        _model("fresh", timeout_s=1.0),
        _model("ranked", timeout_s=10.0, latency_slo_by_priority_s={1: 3.0}),
        _model("capped", timeout_s=1.0, max_request_rows=CAP_ROWS),
        *(_model(name, timeout_s=2.0) for name in STORM),
    ]
    return _server.write_config(root, models)


def _rows(n: int, priority: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "x", "shape": [n, 1], "datatype": "FP32", "data": [1.0] * n}]
    }
    if priority is not None:
        body["parameters"] = {"priority": priority}
    return body


class Good:
    """What one scene's good clients saw."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.latencies_s: list[float] = []
        self.statuses: Counter[str] = Counter()
        self.ok_first_10_s = 0
        self.sent_first_10_s = 0

    async def run(
        self, client: httpx.AsyncClient, models: tuple[str, ...], until: float, priority: int
    ) -> None:
        rng = random.Random()
        while time.monotonic() < until:
            t0 = time.monotonic()
            try:
                r = await client.post(
                    f"/v2/models/{rng.choice(models)}/infer", json=_rows(1, priority)
                )
                status = r.status_code
                key = "200" if status == 200 else f"{status} {r.text[:80]}"
            except httpx.HTTPError as exc:
                status, key = 0, f"transport: {type(exc).__name__}"
            self.statuses[key] += 1
            early = t0 - self.started < 10.0
            self.sent_first_10_s += early
            if status == 200:
                self.latencies_s.append(time.monotonic() - t0)
                self.ok_first_10_s += early

    def report(self, baseline_p99_s: float | None) -> dict[str, Any]:
        sent = sum(self.statuses.values())
        p99 = percentile(self.latencies_s, 0.99)
        return {
            "sent": sent,
            "ok_share": round(self.statuses["200"] / sent, 3) if sent else None,
            "ok_share_first_10_s": (
                round(self.ok_first_10_s / self.sent_first_10_s, 3)
                if self.sent_first_10_s
                else None
            ),
            "p99_ms": None if p99 is None else round(p99 * 1000, 1),
            "p99_vs_baseline": (
                None if p99 is None or not baseline_p99_s else round(p99 / baseline_p99_s, 2)
            ),
            "errors": sent - self.statuses["200"],
            "error_kinds": {k: v for k, v in self.statuses.items() if k != "200"},
        }


async def _hostile(client: httpx.AsyncClient, until: float, seen: Counter[int]) -> None:
    while time.monotonic() < until:
        r = await client.post("/v2/models/capped/infer", json=_rows(5 * CAP_ROWS))
        seen[r.status_code] += 1


async def _churn(client: httpx.AsyncClient, until: float, seed: int, seen: Counter[int]) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        verb = rng.choice(("load", "unload", "unload"))
        r = await client.post(f"/v2/repository/models/{rng.choice(STORM)}/{verb}")
        seen[r.status_code] += 1
        await asyncio.sleep(rng.uniform(0.0, 0.05))


async def scenes(url: str, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        base = Good()
        await base.run(client, ("calm",), time.monotonic() + min(seconds, 10.0), 3)
        base_p99 = percentile(base.latencies_s, 0.99)
        out["baseline"] = base.report(base_p99)

        first = await client.post("/v2/models/fresh/infer", json=_rows(4500))
        good = Good()
        await good.run(client, ("fresh",), time.monotonic() + seconds, 3)
        out["slow-first-call"] = {"first_call": first.status_code, **good.report(base_p99)}

        first = await client.post("/v2/models/ranked/infer", json=_rows(round(2 / ROW_S), 1))
        good = Good()
        await good.run(client, ("ranked",), time.monotonic() + seconds, 3)
        out["shed-after-long-call"] = {"first_call": first.status_code, **good.report(base_p99)}

        hostile: Counter[int] = Counter()
        until = time.monotonic() + seconds
        good = Good()
        await asyncio.gather(
            _hostile(client, until, hostile), good.run(client, ("capped",), until, 3)
        )
        out["too-big"] = {"hostile": dict(hostile), **good.report(base_p99)}

        churn: Counter[int] = Counter()
        until = time.monotonic() + seconds
        goods = [Good() for _ in range(4)]
        await asyncio.gather(
            *(_churn(client, until, seed, churn) for seed in range(3)),
            *(g.run(client, STORM, until, 3) for g in goods),
        )
        merged = Good()
        for g in goods:
            merged.latencies_s += g.latencies_s
            merged.statuses.update(g.statuses)
            merged.ok_first_10_s += g.ok_first_10_s
            merged.sent_first_10_s += g.sent_first_10_s
        closed = sum(v for k, v in merged.statuses.items() if "closed" in k)
        out["unload-storm"] = {
            "churn": dict(churn),
            "closed_503": closed,
            **merged.report(base_p99),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each scene")
    parser.add_argument("--quick", action="store_true", help="6 s per scene")
    args = parser.parse_args()
    seconds = 6.0 if args.quick else args.seconds
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = write_repository(root)
        with _server.Server(config, root / "server.log") as server:
            results = asyncio.run(scenes(server.url, seconds))
    print(json.dumps({"seconds_per_scene": seconds, **results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
