"""Eviction policies on request traces: LRU vs cost-aware (Greedy-Dual-Size-Frequency).

A trace-driven simulation of the manager's eviction decisions, using the real policy
objects on model records: models of mixed sizes and reload times, requests drawn from a
Zipf popularity (optionally shifting halfway), a budget of a third of the total size.
It counts misses (cold starts) and the reload seconds they cost. Deterministic.

    .venv/bin/python bench/bench_eviction.py
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from modelyard.config.model_config import ModelConfig
from modelyard.manager.eviction import EvictionPolicy, make_policy, select_victims
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.manager.states import ModelState

MIB = 1024 * 1024


def _models(n: int, rng: random.Random) -> list[tuple[str, int, float]]:
    """(name, bytes, reload seconds): reload time is not proportional to size (some small
    models, such as ones with heavy Python start-up, are slow to bring back)."""
    out = []
    for i in range(n):
        size_mb = rng.choice([5, 10, 20, 50, 100, 200])
        reload_s = 0.02 + size_mb * 0.004 * rng.uniform(0.5, 1.5)
        if rng.random() < 0.2:
            reload_s += rng.uniform(0.5, 2.0)
        out.append((f"m{i:03d}", size_mb * MIB, reload_s))
    return out


def _trace(names: list[str], n: int, s: float, rng: random.Random, shift: bool) -> list[str]:
    order = names[:]
    rng.shuffle(order)
    weights = [1.0 / (i + 1) ** s for i in range(len(order))]
    out = []
    for i in range(n):
        if shift and i == n // 2:
            rng.shuffle(order)  # popularity changes: yesterday's favourites go cold
        out.append(rng.choices(order, weights)[0])
    return out


def simulate(
    policy: EvictionPolicy, models: list[tuple[str, int, float]], trace: list[str], budget: int
) -> dict[str, float]:
    records = {}
    for name, size, reload_s in models:
        r = ModelRecord(
            key=ModelKey(name, "1"), config=ModelConfig(name=name, path=name), path=Path(name)
        )
        records[name] = (r, size, reload_s)
    used = 0
    misses = 0
    reload_total = 0.0
    for t, name in enumerate(trace):
        record, size, reload_s = records[name]
        record.stats.last_used = float(t)
        record.stats.requests += 1
        if record.state is ModelState.READY:
            continue
        misses += 1
        reload_total += reload_s
        resident = [r for r, _, _ in records.values() if r.state is ModelState.READY]
        if used + size > budget:
            victims = select_victims(policy, resident, used + size - budget) or []
            for v in victims:
                policy.on_evict(v)
                v.state = ModelState.UNLOADED
                used -= v.reserved_bytes
                v.reserved_bytes = 0
        record.state = ModelState.READY
        record.reserved_bytes = size
        record.timings.total_s = reload_s
        used += size
    return {"miss_ratio": misses / len(trace), "reload_s": reload_total, "misses": misses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=Path("bench/results/eviction.json"))
    args = parser.parse_args()
    rows = []
    print("| trace | policy | miss ratio | reload seconds | vs LRU (reload s) |")
    print("|---|---|---:|---:|---:|")
    for label, s, shift in [
        ("zipf 1.1", 1.1, False),
        ("zipf 0.8", 0.8, False),
        ("zipf 1.1, shift", 1.1, True),
    ]:
        totals: dict[str, list[float]] = {"lru": [0, 0], "cost": [0, 0]}
        for seed in range(args.seeds):
            rng = random.Random(seed)
            models = _models(args.models, rng)
            trace = _trace([m[0] for m in models], args.requests, s, rng, shift)
            budget = sum(m[1] for m in models) // 3
            for name in ("lru", "cost"):
                res = simulate(make_policy(name), models, trace, budget)
                totals[name][0] += res["miss_ratio"] / args.seeds
                totals[name][1] += res["reload_s"] / args.seeds
        for name in ("lru", "cost"):
            ratio = totals[name][1] / totals["lru"][1]
            miss, reload_s = totals[name]
            print(f"| {label} | {name} | {miss:.4f} | {reload_s:.1f} | {ratio:.2f} |")
            rows.append(
                {
                    "trace": label,
                    "policy": name,
                    "miss_ratio": totals[name][0],
                    "reload_s": totals[name][1],
                    "reload_vs_lru": ratio,
                }
            )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
