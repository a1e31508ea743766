"""Issue 16's fifty-model run, live on the manager: loads of the hottest model, totals, Belady.

The run of tests/integration/test_memory_pressure.py's fifty models (Zipf 1.1, 8
concurrent users, a budget of a fifth of the total, four popular models sharing a 64 MiB
file) on the real manager, router, admission and schedulers, with instances that sleep
the ONNX load curve (20 ms + 3 ms/MiB, two loads at a time as on two cores) instead of
starting workers (tests/fakes/cache_run.py). Per configuration: failures, loads of the
hottest model, total loads, seconds requests waited for loads, wall time; and the
recorded trace replayed in the simulator with Belady's MIN and with the same policy.

    PYTHONPATH=src:. .venv/bin/python bench/bench_fifty.py            # 3,000 requests
    PYTHONPATH=src:. .venv/bin/python bench/bench_fifty.py --configs gdsf-decay arrival-cost
    PYTHONPATH=src:. .venv/bin/python bench/bench_fifty.py --configs arrival-cost gdsf-decay \
        --log bench/results/fifty.log      # that order; the manager's log (evictions, why)

Failed requests are printed after the table, each with its error (the log then says
which load evicted the model, and when).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
from pathlib import Path

from modelyard.simulation.engine import simulate
from tests.fakes.cache_run import run

CONFIGS = [
    ("lru, no hot rule (before)", "lru", False),
    ("lru", "lru", True),
    ("cost", "cost", True),
    ("gdsf-decay", "gdsf-decay", True),
    ("arrival-cost", "arrival-cost", True),
]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--scale", type=float, default=1.0, help="load-time multiplier")
    parser.add_argument(
        "--configs", nargs="*", help="run only these configurations (by policy name)"
    )
    parser.add_argument("--json", type=Path, default=Path("bench/results/fifty.json"))
    parser.add_argument("--log", type=Path, help="write the manager's log (INFO) here")
    args = parser.parse_args()
    if args.log is not None:
        args.log.parent.mkdir(parents=True, exist_ok=True)
        logging.basicConfig(
            filename=args.log, level=logging.INFO, format="%(relativeCreated)10.1f %(message)s"
        )
    # In the order given (alternate it between runs: the machine's load drifts).
    configs = [c for p in args.configs for c in CONFIGS if c[1] == p] if args.configs else CONFIGS
    rows = []
    print(
        "| configuration | failed | hottest loads | loads | cold-start s | wall s "
        "| sim loads | Belady loads | loads / Belady |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    failed: list[str] = []
    for label, policy, hot in configs:
        logging.getLogger("modelyard.manager").info("run: %s", label)
        with tempfile.TemporaryDirectory() as d:
            r = await run(
                Path(d), n_requests=args.requests, policy=policy, protect_hot=hot,
                time_scale=args.scale,
            )  # fmt: skip
        trace = r.as_trace()
        sim = simulate(trace, policy, r.budget_bytes, hot_fraction=0.1 if hot else 0.0)
        bel = simulate(trace, "belady", r.budget_bytes)
        top = r.order[0]
        print(
            f"| {label} | {len(r.failures)} | {r.loads[top]} | {r.total_loads} "
            f"| {r.cold_start_s:.1f} | {r.wall_s:.1f} | {sim.loads} | {bel.loads} "
            f"| {r.total_loads / bel.loads:.2f} |",
            flush=True,
        )
        failed += [f"{label}: {f}" for f in r.failures]
        rows.append(
            {
                "config": label,
                "failed": len(r.failures),
                "failures": r.failures[:20],
                "hottest": top,
                "hottest_loads": r.loads[top],
                "loads": r.total_loads,
                "cold_start_s": r.cold_start_s,
                "wall_s": r.wall_s,
                "sim_loads": sim.loads,
                "belady_loads": bel.loads,
            }
        )
    for line in failed:
        print(f"failed: {line}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
