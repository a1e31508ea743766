"""Issue 16's pre-warm windows, live: an Azure-shaped trace, time-compressed, replayed
open-loop against a real server with ``prefetch.prewarm`` off and on.

Real ONNX MLPs (1-4 MiB) on a real server with worker processes, a cpu budget of a
fifth of their summed footprint and ``eviction_policy: arrival-cost`` (the pre-warm
windows' keep-alive ordering needs it). The trace follows the shape of
:func:`modelyard.simulation.traces.azure_like` (Serverless in the Wild, ATC '20):
per-model mean rates log-uniform over a range, a share of the models timer-driven
(period with 2 % jitter), the rest with log-normal gaps (sigma 1.5, coefficient of
variation above 1); but compressed so that a run of a few minutes holds enough timer
periods for windows to be learnt (a window needs five agreeing gaps): rates from one
call in 100 s to one in 2 s, a quarter of the models timers.

Every request is sent at its trace time (open loop: a slow answer does not delay the
next request) and every answer is checked. Both runs replay the same trace on fresh
servers, in the order given (``--order``); the server's counters give cold starts,
their seconds, prefetches, hits and wasted loads, and an event listener counts the
pre-warms (prefetches whose reason is a pre-warm window) among the prefetches.

    PYTHONPATH=src:. .venv/bin/python bench/bench_prewarm_live.py          # 30 models, 240 s
    PYTHONPATH=src:. .venv/bin/python bench/bench_prewarm_live.py --order on,off
    PYTHONPATH=src:. .venv/bin/python bench/bench_prewarm_live.py --simulate   # no server

``--simulate`` replays the same trace in the simulator instead (pre-warm off and on, the
ONNX load curve at 1x and 3x): what the live run should show, without its timing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from _live_models import body_of, budget_watch, build_models, footprint_mib, machine_load, totals

from modelyard.config.settings import PrefetchConfig
from modelyard.manager.events import Event
from modelyard.simulation.engine import simulate
from modelyard.simulation.traces import LOAD_CURVES, MIB, ModelSpec, Request, Trace
from tests.servers import running_server, write_config


def compressed_azure(
    names: list[str],
    duration_s: float,
    *,
    log_rate: tuple[float, float] = (-2.0, -0.3),
    timers: float = 0.25,
    seed: int = 0,
) -> list[tuple[float, str]]:
    """``(t, model)`` sorted by time: the shape of ``azure_like`` at compressed rates."""
    rng = random.Random(seed)
    out: list[tuple[float, str]] = []
    sigma = 1.5
    for name in names:
        rate = 10 ** rng.uniform(*log_rate)
        timer = rng.random() < timers
        t = rng.uniform(0, 1 / rate) if timer else 0.0
        mu = math.log(1 / rate) - sigma * sigma / 2
        while True:
            t += (1 / rate) * rng.uniform(0.98, 1.02) if timer else rng.lognormvariate(mu, sigma)
            if t >= duration_s:
                break
            out.append((t, name))
    out.sort()
    return out


async def replay(
    client: httpx.AsyncClient,
    trace: list[tuple[float, str]],
    body: dict[str, Any],
    expected: dict[str, list[float]],
) -> tuple[list[str], float]:
    """Send every request at its time; the failures and the wall seconds."""
    failures: list[str] = []

    async def one(name: str) -> None:
        try:
            r = await client.post(f"/v2/models/{name}/infer", json=body, timeout=60.0)
        except httpx.HTTPError as e:
            failures.append(f"{name}: {type(e).__name__} {e}")
            return
        if r.status_code != 200:
            failures.append(f"{name}: {r.status_code} {r.text[:200]}")
        elif not np.allclose(r.json()["outputs"][0]["data"], expected[name], 1e-4, 1e-5):
            failures.append(f"{name}: wrong answer")

    t0 = time.perf_counter()
    tasks = []
    for t, name in trace:
        delay = t - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(name)))
    await asyncio.gather(*tasks)
    return failures, time.perf_counter() - t0


async def one_run(
    root: Path,
    names: list[str],
    expected: dict[str, list[float]],
    body: dict[str, Any],
    trace: list[tuple[float, str]],
    *,
    prewarm: bool,
    budget_mb: int,
    policy: str,
    index: int,
) -> dict[str, Any]:
    """Replay ``trace`` on a fresh server with pre-warming on or off; its counters."""
    run_dir = root / f"run{index}-prewarm-{'on' if prewarm else 'off'}"
    run_dir.mkdir()
    cfg = write_config(
        run_dir,
        [{"name": n, "path": n} for n in names],
        model_repository=str(root / "repo"),
        devices=[{"name": "cpu", "memory_budget_mb": budget_mb}],
        eviction_policy=policy,
        prefetch={"enabled": True, "prewarm": prewarm},
    )
    prewarms: list[str] = []

    def listen(event: Event) -> None:
        if event.kind == "prefetch" and event.message.startswith("pre-warm"):
            prewarms.append(event.model)

    async with running_server(cfg) as (app, client):
        app.manager.events.listeners.append(listen)
        budget = app.manager.budget.device("cpu")
        async with budget_watch(budget) as violations:
            failures, wall_s = await replay(client, trace, body, expected)
        stats = (await client.get("/v2/stats")).json()
    t = totals(stats)
    del t["loads_by_model"]
    return {
        "prewarm": prewarm,
        "policy": policy,
        "requests": len(trace),
        "failed": len(failures),
        "failures": failures[:10],
        "budget_exceeded_samples": len(violations),
        "prewarms": len(prewarms),
        **{k: round(v, 2) if isinstance(v, float) else v for k, v in t.items()},
        "wall_s": round(wall_s, 1),
        "machine": machine_load(),
    }


def simulated(
    names: list[str], sizes: list[float], trace: list[tuple[float, str]], budget_mb: int
) -> None:
    """Replay ``trace`` in the simulator with pre-warming off and on (no server)."""
    curve = LOAD_CURVES["onnx"]
    for scale in (1.0, 3.0):
        specs = {
            n: ModelSpec(
                n, int(footprint_mib(mb) * MIB), scale * curve.load_s(int(footprint_mib(mb) * MIB))
            )
            for n, mb in zip(names, sizes, strict=True)
        }
        replay_trace = Trace("compressed-azure", [Request(t, m) for t, m in trace], specs)
        for prewarm in (False, True):
            r = simulate(
                replay_trace,
                "arrival-cost",
                budget_mb * MIB,
                prefetch=PrefetchConfig(prewarm=prewarm),
            )
            print(
                f"simulated, load times x{scale:g}, pre-warm {'on' if prewarm else 'off'}: "
                f"cold starts {r.cold_starts}, {r.cold_start_s:.1f} s, loads {r.loads}, "
                f"pre-warms {r.prewarms}, hits {r.prefetch_hits}, wasted {r.prefetch_wasted}"
            )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", type=int, default=30)
    parser.add_argument("--duration-s", type=float, default=240.0)
    parser.add_argument("--order", default="off,on", help="pre-warm off/on, in this order")
    parser.add_argument("--policy", default="arrival-cost")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=Path("bench/results/prewarm_live.json"))
    parser.add_argument("--simulate", action="store_true", help="the simulator, not a server")
    args = parser.parse_args()
    x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
    sizes = [float(mb) for mb in np.linspace(1, 4, args.models)]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        names, expected = build_models(root / "repo", sizes, x)
        budget_mb = round(sum(footprint_mib(mb) for mb in sizes) / 5)
        shuffled = list(names)
        random.Random(args.seed).shuffle(shuffled)
        trace = compressed_azure(shuffled, args.duration_s, seed=args.seed)
        print(
            f"{args.models} models, budget {budget_mb} MiB, {len(trace)} requests over "
            f"{args.duration_s:.0f} s; {machine_load()}",
            flush=True,
        )
        if args.simulate:
            simulated(names, sizes, trace, budget_mb)
            return
        for i, label in enumerate(args.order.split(",")):
            row = await one_run(
                root, names, expected, body_of(x), trace,
                prewarm=label == "on", budget_mb=budget_mb, policy=args.policy, index=i,
            )  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(
        "\n| pre-warm | failed | cold starts | cold-start s | loads | prefetches | of them "
        "pre-warms | hits | wasted | hidden s | wall s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {'on' if r['prewarm'] else 'off'} | {r['failed']} | {r['cold_starts']} "
            f"| {r['cold_start_s']:.1f} | {r['loads']} | {r['prefetches']} | {r['prewarms']} "
            f"| {r['prefetch_hits']} | {r['prefetch_wasted']} | {r['hidden_s']:.1f} "
            f"| {r['wall_s']} |"
        )
    by = {r["prewarm"]: r for r in rows}
    if len(by) == 2:
        on, off = by[True], by[False]
        print(
            f"cold starts on / off {on['cold_starts'] / max(1, off['cold_starts']):.2f}, "
            f"cold-start seconds {on['cold_start_s'] / max(1e-9, off['cold_start_s']):.2f}"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
