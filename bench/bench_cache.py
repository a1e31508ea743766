"""Cache policies on the standard traces, in the simulator: cold starts and their seconds.

Runs the manager's own policy objects (``modelyard.simulation``) on the standard
synthetic traces (Zipf 0.8/1.1/1.4, bursty, diurnal, pipeline, Azure-2019-shaped) of
heterogeneous models (5-200 MiB, mixed runtimes), a budget of a fifth of the total,
and reports each policy's cold-start seconds against LRU without the hot-model rule
(the old default) and against Belady's MIN on the same trace, also with the server's
default prefetching (Markov transitions and pre-warm windows). Then prefetch on every
trace (hidden seconds, pre-warms, wasted loads), and 200 models mostly cold.

    PYTHONPATH=src .venv/bin/python bench/bench_cache.py   # 100 models, 20,000 requests, 3 seeds
    PYTHONPATH=src .venv/bin/python bench/bench_cache.py --quick
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

from modelyard.config.settings import PrefetchConfig
from modelyard.simulation.engine import SimResult, simulate
from modelyard.simulation.traces import azure_like, heterogeneous_models, standard_traces, zipf

POLICIES = ["lru", "lfu", "cost", "gdsf-decay", "arrival-cost"]
PREFETCHED = ["gdsf-decay", "arrival-cost"]
"""Also run with the server's default prefetch configuration (Markov transitions and
pre-warm windows): labelled ``POLICY+prefetch``."""
COLUMNS = [*POLICIES, *(f"{p}+prefetch" for p in PREFETCHED)]
DAY_S = 600.0
"""The synthetic traces' day (the diurnal trace's cycle: ten minutes, so that a trace of
about an hour holds several); ``arrival-cost`` is told it, as a server is told 24 h
(``eviction_period_s``). It acts on a cycle only once the days agree, so the traces
without one replay as with no period at all."""


def _policy_table(seeds: int, n_models: int, n_requests: int) -> list[dict[str, object]]:
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    names: list[str] = []
    for seed in range(seeds):
        for trace in standard_traces(seed, n_models, n_requests):
            if trace.name not in names:
                names.append(trace.name)
            budget = trace.total_bytes // 5
            runs: dict[str, SimResult] = {
                "lru (no hot rule)": simulate(trace, "lru", budget, hot_fraction=0.0),
                "belady": simulate(trace, "belady", budget),
            }
            for p in POLICIES:
                runs[p] = simulate(trace, p, budget, period_s=DAY_S)
            for p in PREFETCHED:
                runs[f"{p}+prefetch"] = simulate(
                    trace, p, budget, period_s=DAY_S, prefetch=PrefetchConfig()
                )
            for label, r in runs.items():
                acc = sums[(trace.name, label)]
                acc[0] += r.cold_starts / seeds
                acc[1] += r.cold_start_s / seeds
                acc[2] += r.p99_added_s / seeds
    rows = []
    print("| trace | policy | cold starts | cold-start s | p99 added (ms) | vs LRU | vs Belady |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in names:
        base = sums[(name, "lru (no hot rule)")][1]
        bel = sums[(name, "belady")][1]
        for label in ["lru (no hot rule)", *COLUMNS, "belady"]:
            cold, secs, p99 = sums[(name, label)]
            print(
                f"| {name} | {label} | {cold:.0f} | {secs:.1f} | {p99 * 1000:.0f} "
                f"| {secs / base:.2f} | {secs / bel:.2f} |"
            )
            rows.append(
                {
                    "trace": name,
                    "policy": label,
                    "cold_starts": cold,
                    "cold_start_s": secs,
                    "p99_added_s": p99,
                    "vs_lru": secs / base,
                    "vs_belady": secs / bel,
                }
            )
    _wide_table(names, sums)
    return rows


def _wide_table(names: list[str], sums: dict[tuple[str, str], list[float]]) -> None:
    """Cold-start seconds, one row per trace, one column per policy; ratios against the
    old LRU and Belady of ``arrival-cost`` without and with prefetching."""
    plain, fetched = POLICIES[-1], COLUMNS[-1]
    print(f"\n| trace | LRU (old) | {' | '.join(COLUMNS)} | Belady ", end="")
    print(f"| {plain} vs LRU | vs Belady | {fetched} vs LRU | vs Belady |")
    print("|---|" + "---:|" * (len(COLUMNS) + 6))
    for name in names:
        base = sums[(name, "lru (no hot rule)")][1]
        bel = sums[(name, "belady")][1]
        secs = {p: sums[(name, p)][1] for p in COLUMNS}
        cells = " | ".join(f"{secs[p]:,.0f}" for p in COLUMNS)
        print(
            f"| {name} | {base:,.0f} s | {cells} | {bel:,.0f} "
            f"| {secs[plain] / base:.3f} | {secs[plain] / bel:.3f} "
            f"| {secs[fetched] / base:.3f} | {secs[fetched] / bel:.3f} |"
        )


def _prefetch_table(seeds: int, n_models: int, n_requests: int) -> list[dict[str, object]]:
    rows = []
    print("\n| trace | policy | prefetch | cold starts | cold-start s | prefetches", end="")
    print(" | of them pre-warms | hits | wasted | hidden s |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for seed in range(seeds):
        for trace in standard_traces(seed, n_models, n_requests):
            budget = trace.total_bytes // 5
            for policy in PREFETCHED:
                off = simulate(trace, policy, budget, period_s=DAY_S)
                on = simulate(trace, policy, budget, period_s=DAY_S, prefetch=PrefetchConfig())
                free = simulate(
                    trace, policy, budget, period_s=DAY_S, prefetch=PrefetchConfig(displace=False)
                )
                for label, r in (("off", off), ("free budget only", free), ("displacing", on)):
                    print(
                        f"| {trace.name} (seed {seed}) | {policy} | {label} | {r.cold_starts} "
                        f"| {r.cold_start_s:.1f} | {r.prefetches} | {r.prewarms} "
                        f"| {r.prefetch_hits} | {r.prefetch_wasted} | {r.hidden_s:.1f} |"
                    )
                    rows.append({"seed": seed, "prefetch": label, **r.as_row()})
    return rows


def _scale(n_models: int, n_requests: int) -> list[dict[str, object]]:
    """200 models, most of them cold: Azure-shaped arrivals plus a Zipf 1.1 trace."""
    models = heterogeneous_models(n_models, seed=42)
    traces = [zipf(models, n_requests, 1.1, seed=42), azure_like(models, 900.0, seed=42)]
    rows = []
    print(f"\n{n_models} models, budget a tenth of the total:")
    print(
        "| trace | policy | requests | models asked | cold starts | cold-start s | sim time (s) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for trace in traces:
        budget = trace.total_bytes // 10
        asked = len({r.model for r in trace.requests})
        for label, policy, hot in (
            ("lru (no hot rule)", "lru", 0.0),
            ("lru", "lru", 0.1),
            ("gdsf-decay", "gdsf-decay", 0.1),
            ("arrival-cost", "arrival-cost", 0.1),
            ("arrival-cost+prefetch", "arrival-cost", 0.1),
            ("belady", "belady", 0.0),
        ):
            t0 = time.perf_counter()
            fetch = PrefetchConfig() if label.endswith("+prefetch") else None
            r = simulate(trace, policy, budget, hot_fraction=hot, period_s=DAY_S, prefetch=fetch)
            took = time.perf_counter() - t0
            print(
                f"| {trace.name} | {label} | {r.requests} | {asked} | {r.cold_starts} "
                f"| {r.cold_start_s:.1f} | {took:.1f} |"
            )
            rows.append({"models": n_models, "label": label, "sim_s": took, **r.as_row()})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 seed, 40 models, 4,000 requests")
    parser.add_argument("--json", type=Path, default=Path("bench/results/cache.json"))
    args = parser.parse_args()
    if args.quick:
        args.models, args.requests, args.seeds = 40, 4000, 1
    out = {
        "policies": _policy_table(args.seeds, args.models, args.requests),
        "prefetch": _prefetch_table(1, args.models, args.requests),
        "scale": _scale(200, args.requests),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
