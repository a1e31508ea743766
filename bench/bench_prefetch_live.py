"""Issue 16's prefetch target, live: cold starts hidden on pipelines, none added on Zipf.

Real ONNX MLPs (1-4 MiB) on a real server with worker processes and a cpu budget of
about a quarter of their summed footprint. Two traces, each served once with
prefetching on and once off (same request sequence, every answer checked):

* **sequence**: 12 pipelines of three models (A -> B -> C), a pipeline picked at random
  and its three requests sent one after the other, ``--seq-concurrency`` pipelines at
  a time. The fraction of cold starts prefetching hides is ``1 - on / off``.
* **zipf**: the same models asked for independently (Zipf 1.1) by 8 users: prefetching
  should fire rarely and add no cold start.

The predictor needs ``min_observations`` sightings of a transition before it acts (10 by
default); the run sets 3 so that a short run has time to learn 12 pipelines.

    PYTHONPATH=src:. .venv/bin/python bench/bench_prefetch_live.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _live_models import (
    Clients,
    body_of,
    budget_watch,
    build_models,
    footprint_mib,
    machine_load,
    totals,
)

from tests.servers import running_server, write_config

N_PIPELINES = 12
STAGES = 3
MIN_OBSERVATIONS = 3


async def one_run(
    root: Path,
    label: str,
    names: list[str],
    expected: dict[str, list[float]],
    x: np.ndarray,
    units: Sequence[Sequence[str]],
    concurrency: int,
    prefetch: bool,
    budget_mb: int,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """Serve ``units`` with prefetching on or off; the server's counters."""
    run_dir = root / f"{label}-{'on' if prefetch else 'off'}"
    run_dir.mkdir()
    cfg = write_config(
        run_dir,
        [{"name": n, "path": n} for n in names],
        model_repository=str(root / "repo"),
        devices=[{"name": "cpu", "memory_budget_mb": budget_mb}],
        prefetch={"enabled": prefetch, "min_observations": MIN_OBSERVATIONS, **extra},
    )
    async with running_server(cfg) as (app, client):
        budget = app.manager.budget.device("cpu")
        clients = Clients(client, body_of(x), expected)
        async with budget_watch(budget) as violations:
            wall_s = await clients.run(units, concurrency)
        stats = (await client.get("/v2/stats")).json()
    t = totals(stats)
    del t["loads_by_model"]
    return {
        "trace": label,
        "prefetch": prefetch,
        "requests": sum(len(u) for u in units),
        "concurrency": concurrency,
        "failed": len(clients.failures),
        "failures": clients.failures[:10],
        "budget_exceeded_samples": len(violations),
        **{k: round(v, 2) if isinstance(v, float) else v for k, v in t.items()},
        "wall_s": round(wall_s, 1),
        "machine": machine_load(),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pipelines", type=int, default=60, help="pipeline runs per trace")
    parser.add_argument("--zipf-requests", type=int, default=180)
    parser.add_argument("--seq-concurrency", type=int, default=1)
    parser.add_argument("--traces", default="sequence,zipf")
    parser.add_argument(
        "--horizon-s", type=float, default=None, help="prefetch.horizon_s (default: the server's)"
    )
    parser.add_argument("--json", type=Path, default=Path("bench/results/prefetch_live.json"))
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.random((1, 64), dtype=np.float32)
    n = N_PIPELINES * STAGES
    sizes = list(np.linspace(1, 4, n))
    rows = []
    print(f"start: {machine_load()}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        names, expected = build_models(root / "repo", sizes, x)
        budget_mb = round(sum(footprint_mib(float(mb)) for mb in sizes) / 4)
        shuffled = list(names)
        random.Random(3).shuffle(shuffled)
        chains = [shuffled[i * STAGES : (i + 1) * STAGES] for i in range(N_PIPELINES)]
        pick = random.Random(5)
        seq_units = [pick.choice(chains) for _ in range(args.pipelines)]
        weights = [1.0 / (i + 1) ** 1.1 for i in range(n)]
        zipf_units = [
            [m] for m in random.Random(9).choices(shuffled, weights, k=args.zipf_requests)
        ]
        print(f"{n} models, budget {budget_mb} MiB; {machine_load()}", flush=True)
        extra = {} if args.horizon_s is None else {"horizon_s": args.horizon_s}
        runs = {"sequence": (seq_units, args.seq_concurrency), "zipf": (zipf_units, 8)}
        for label in args.traces.split(","):
            units, conc = runs[label]
            for prefetch in (False, True):
                row = await one_run(
                    root, label, names, expected, x, units, conc, prefetch, budget_mb, extra
                )
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(
        "\n| trace | prefetch | failed | cold starts | cold-start s | loads | prefetches "
        "| hits | wasted | hidden s | wall s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['trace']} | {'on' if r['prefetch'] else 'off'} | {r['failed']} "
            f"| {r['cold_starts']} | {r['cold_start_s']:.1f} | {r['loads']} | {r['prefetches']} "
            f"| {r['prefetch_hits']} | {r['prefetch_wasted']} | {r['hidden_s']:.1f} "
            f"| {r['wall_s']} |"
        )
    for label in args.traces.split(","):
        off, on = (r for r in rows if r["trace"] == label)
        hidden = 1 - on["cold_starts"] / max(1, off["cold_starts"])
        print(f"{label}: prefetch hides {hidden:.0%} of the cold starts")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
