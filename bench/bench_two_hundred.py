"""Issue 16's scale run, live: 200 real ONNX models, most of them cold, on a real server.

200 MLPs of 0.5-8 MiB (log-uniform sizes, popularity independent of size) built at run
time; a real server (the CLI's ``App``, real worker processes) with a cpu budget of
about a tenth of their summed footprint; a fixed Zipf 1.1 sequence of requests sent by
8 concurrent users, every answer checked against ONNX Runtime. The same sequence runs
once per policy (default ``gdsf-decay``, then ``lru``). Per policy: failures, loads,
seconds requests waited for loads (``cold_start_s_total`` of ``/v2/stats``), loads of
the hottest model, peak workers' PSS against the budget, moments the reservations
exceeded the budget; then the server's request log is replayed in the simulator with
Belady's MIN (and with the same policy), giving loads / Belady and cold-start seconds /
Belady. The log's load times are the live ones (stretched by the loads running at once
on two cores), so the replay runs loads unqueued (``load_slots=0``) and shares the run's
noise; the same policy is replayed too, to show how far the simulator is from live.

    PYTHONPATH=src:. .venv/bin/python bench/bench_two_hundred.py            # 1,000 requests
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from _live_models import (
    MIB,
    Clients,
    body_of,
    budget_watch,
    build_models,
    footprint_mib,
    fork_server_of,
    machine_load,
    pss_sampler,
    totals,
)

from modelyard.simulation.engine import simulate
from modelyard.simulation.traces import read_request_log
from tests.servers import running_server, write_config

N_MODELS = 200
CONCURRENCY = 8
ZIPF_S = 1.1


async def one_policy(
    root: Path,
    repo: Path,
    names: list[str],
    order: list[str],
    expected: dict[str, list[float]],
    x: np.ndarray,
    sequence: list[str],
    policy: str,
    budget_mb: int,
    keep_logs: Path | None,
) -> dict[str, Any]:
    """Serve ``sequence`` with ``policy``; the live figures and the replay's."""
    run_dir = root / policy
    run_dir.mkdir()
    log_path = run_dir / "requests.jsonl"
    cfg = write_config(
        run_dir,
        [{"name": n, "path": n} for n in names],
        model_repository=str(repo),
        devices=[{"name": "cpu", "memory_budget_mb": budget_mb}],
        eviction_policy=policy,
        request_log={"path": str(log_path)},
    )
    async with running_server(cfg) as (app, client):
        budget = app.manager.budget.device("cpu")
        clients = Clients(client, body_of(x), expected)
        async with pss_sampler() as rows, budget_watch(budget) as violations:
            wall_s = await clients.run([[n] for n in sequence], CONCURRENCY)
        stats = (await client.get("/v2/stats")).json()
        budget_bytes = budget.budget_bytes
        fork_rss = fork_server_of(psutil.Process()).memory_info().rss
    t = totals(stats)
    peak_pss = max((pss for _, pss in rows), default=0)
    if keep_logs is not None:
        keep_logs.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (after the run)
        shutil.copy(log_path, keep_logs / f"two_hundred-{policy}.jsonl")
    trace = read_request_log(log_path)
    # Live loads are not queued for a slot: they run at once and share the cores, and the
    # logged load times are those stretched ones; so the replay runs them unqueued too.
    bel = simulate(trace, "belady", budget_bytes, load_slots=0)
    same = simulate(trace, policy, budget_bytes, load_slots=0)
    same2 = simulate(trace, policy, budget_bytes)
    return {
        "policy": policy,
        "requests": len(sequence),
        "answered": clients.answered,
        "failed": len(clients.failures),
        "failures": clients.failures[:10],
        "loads": t["loads"],
        "evictions": t["evictions"],
        "cold_starts": t["cold_starts"],
        "cold_start_s": round(t["cold_start_s"], 2),
        "hottest": order[0],
        "hottest_loads": t["loads_by_model"].get(order[0], 0),
        "top10_loads": [t["loads_by_model"].get(n, 0) for n in order[:10]],
        "models_asked": len(set(sequence)),
        "prefetches": t["prefetches"],
        "wall_s": round(wall_s, 1),
        "budget_mib": round(budget_bytes / MIB, 1),
        "peak_workers_pss_mib": round(peak_pss / MIB, 1),
        "pss_samples": len(rows),
        "fork_server_rss_mib": round(fork_rss / MIB, 1),
        "budget_exceeded_samples": len(violations),
        "logged_requests": len(trace.requests),
        "belady_loads": bel.loads,
        "belady_cold_start_s": round(bel.cold_start_s, 2),
        "sim_loads": same.loads,
        "sim_cold_start_s": round(same.cold_start_s, 2),
        "sim_cold_start_s_2slots": round(same2.cold_start_s, 2),
        "logged_load_s_mean": round(
            sum(m.load_s for m in trace.models.values()) / max(1, len(trace.models)), 3
        ),
        "loads_per_belady": round(t["loads"] / max(1, bel.loads), 2),
        "cold_s_per_belady": round(t["cold_start_s"] / max(1e-9, bel.cold_start_s), 2),
        "machine": machine_load(),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--policies", default="gdsf-decay,lru")
    parser.add_argument("--budget-share", type=float, default=0.1)
    parser.add_argument("--json", type=Path, default=Path("bench/results/two_hundred.json"))
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.random((1, 64), dtype=np.float32)
    sizes = np.exp(rng.uniform(np.log(0.5), np.log(8.0), N_MODELS))
    rows = []
    print(f"start: {machine_load()}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        names, expected = build_models(root / "repo", list(sizes), x)
        total_mib = sum(footprint_mib(float(mb)) for mb in sizes)
        budget_mb = round(total_mib * args.budget_share)
        print(
            f"{N_MODELS} models, {sizes.sum():.0f} MiB of weights, footprint ~{total_mib:.0f} "
            f"MiB, budget {budget_mb} MiB; {machine_load()}",
            flush=True,
        )
        order = list(names)
        random.Random(7).shuffle(order)
        weights = [1.0 / (i + 1) ** ZIPF_S for i in range(N_MODELS)]
        sequence = random.Random(11).choices(order, weights, k=args.requests)
        for policy in args.policies.split(","):
            row = await one_policy(
                root,
                root / "repo",
                names,
                order,
                expected,
                x,
                sequence,
                policy,
                budget_mb,
                args.json.parent,
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(
        "\n| policy | failed | loads | cold-start s | hottest loads | peak workers PSS / budget "
        "| over budget | Belady loads | loads / Belady | Belady cold s | cold s / Belady | wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['policy']} | {r['failed']} | {r['loads']} | {r['cold_start_s']:.1f} "
            f"| {r['hottest_loads']} | {r['peak_workers_pss_mib']:.0f} / {r['budget_mib']:.0f} MiB "
            f"| {r['budget_exceeded_samples']} | {r['belady_loads']} | {r['loads_per_belady']} "
            f"| {r['belady_cold_start_s']:.1f} | {r['cold_s_per_belady']} | {r['wall_s']} |"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
