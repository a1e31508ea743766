"""Ingress scaling: REST throughput on 1 and 2 cores with 1 and 2 ingress processes.

Run from the repository root::

    .venv/bin/python bench/bench_ingress.py            # 3 repeats of 5 s per cell
    .venv/bin/python bench/bench_ingress.py --quick    # 1 repeat of 3 s per cell

A phase at concurrency 1 (3 s) comes first in each cell: its median shows what the
extra hop through an ingress adds to one request's latency.

One identity ONNX model (FP32 ``[1, 4]``, ``isolation: process``, built at run time) is
served by a ``modelyard serve`` subprocess started under a CPU affinity mask (what
``taskset -c 0`` or ``taskset -c 0,1`` sets; the worker and ingress processes inherit
it) with ``ingress_processes: 1`` (HTTP in the server's own process) or ``2``. ``wrk``
(one thread, 50 connections, keep-alive, closed loop) is pinned to the last core in
every cell, so on a 2-core machine it shares a core with the server in the 2-core
cells; the ratios understate what a server with cores of its own gains. Each repeat
runs the four cells back to back (order rotated); medians over repeats are reported,
with the ratios of each cell to the 1-core single-process baseline of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _server
import psutil
import yaml

from modelyard.bench import BenchConfig, run_bench
from modelyard.examples.mlp import build_identity_onnx

CONCURRENCY = 50
PAYLOAD = {
    "inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0.1, 0.2, 0.3, 0.4]}]
}


@contextlib.contextmanager
def pinned(cores: set[int]) -> Iterator[None]:
    """Run the block with this process's CPU affinity set to ``cores`` (children inherit)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def own_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` alone (the manager, without its
    worker and ingress processes): one event loop, so what bounds throughput."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def server_cell(
    root: Path, cores: set[int], ingress: int, client_core: int, duration_s: float
) -> dict[str, Any]:
    """Start a server on ``cores`` with ``ingress`` processes; measure wrk at c=50."""
    cfg = _server.write_config(
        root, [{"name": "identity", "path": "identity", "isolation": "process", "preload": True}]
    )
    doc = yaml.safe_load(cfg.read_text(encoding="utf-8"))
    doc["ingress_processes"] = ingress
    cfg.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    payload = root / "payload.json"
    payload.write_text(json.dumps(PAYLOAD), encoding="utf-8")
    # The server and every process it starts later keep the first mask; this script
    # (and so wrk) then moves to the client's core.
    with (
        pinned(cores),
        _server.Server(cfg, root / f"server-{ingress}.log") as server,
        pinned({client_core}),
    ):
        # One request at a time first: the latency the extra hop adds.
        single = BenchConfig(
            url=server.url,
            models=("identity",),
            concurrency=(1,),
            duration_s=min(duration_s, 3.0),
            warmup_s=0.5,
            engine="wrk",
            payload_files={"identity": payload},
        )
        one = asyncio.run(run_bench(single))[0]
        config = single.model_copy(
            update={"concurrency": (CONCURRENCY,), "duration_s": duration_s, "warmup_s": 1.0}
        )
        cpu0, own0 = _server.tree_cpu_s(server.pid), own_cpu_s(server.pid)
        t0 = time.perf_counter()
        r = asyncio.run(run_bench(config))[0]
        cpu_s = _server.tree_cpu_s(server.pid) - cpu0
        own_s = own_cpu_s(server.pid) - own0
        span_s = time.perf_counter() - t0
    sent = r.qps * span_s
    return {
        "c1_p50_ms": one.p50_ms,
        "qps": r.qps,
        "p50_ms": r.p50_ms,
        "p99_ms": r.p99_ms,
        "errors": r.error_count,
        "server_cpu_us_per_request": cpu_s / sent * 1e6 if sent else None,
        "manager_cpu_us_per_request": own_s / sent * 1e6 if sent else None,
        "server_cores_busy": cpu_s / span_s,
    }


def run(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    all_cores = sorted(os.sched_getaffinity(0))
    if len(all_cores) < 2:
        raise SystemExit("needs at least 2 cores")
    one, two = {all_cores[0]}, {all_cores[0], all_cores[1]}
    client_core = all_cores[-1]
    cells = [("1 core", one, 1), ("1 core", one, 2), ("2 cores", two, 1), ("2 cores", two, 2)]
    runs: dict[str, list[dict[str, Any]]] = {f"{c}, ingress {n}": [] for c, _, n in cells}
    with tempfile.TemporaryDirectory(prefix="bench-ingress-") as tmp:
        root = Path(tmp)
        build_identity_onnx(root / "identity" / "1" / "model.onnx")
        for rep in range(args.repeats):
            shift = rep % len(cells)
            for label, cores, ingress in cells[shift:] + cells[:shift]:
                key = f"{label}, ingress {ingress}"
                r = server_cell(root, cores, ingress, client_core, args.duration_s)
                runs[key].append(r)
                print(f"  rep {rep + 1} {key}: {r['qps']:.0f} req/s", file=sys.stderr)
    return runs


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    base_key = "1 core, ingress 1"
    out: dict[str, dict[str, Any]] = {}
    for key, reps in runs.items():
        out[key] = {
            "c1_p50_ms": statistics.median(r["c1_p50_ms"] for r in reps),
            "qps": statistics.median(r["qps"] for r in reps),
            "p50_ms": statistics.median(r["p50_ms"] for r in reps),
            "p99_ms": statistics.median(r["p99_ms"] for r in reps),
            "errors": sum(r["errors"] for r in reps),
            "server_cpu_us_per_request": statistics.median(
                r["server_cpu_us_per_request"] for r in reps
            ),
            "manager_cpu_us_per_request": statistics.median(
                r["manager_cpu_us_per_request"] for r in reps
            ),
            "server_cores_busy": statistics.median(r["server_cores_busy"] for r in reps),
            # Per repeat against the same repeat's baseline, then the median.
            "vs_baseline": statistics.median(
                r["qps"] / b["qps"] for r, b in zip(reps, runs[base_key], strict=True)
            ),
        }
    return out


def report(summary: dict[str, dict[str, Any]]) -> str:
    header = [
        "cell",
        "req/s",
        "vs 1 core, ingress 1",
        "p50 (ms)",
        "p99 (ms)",
        "server CPU / request (µs)",
        "manager process CPU / request (µs)",
        "server cores busy",
        "errors",
        "c=1 p50 (ms)",
    ]
    rows = [
        [
            key,
            f"{s['qps']:.0f}",
            f"{s['vs_baseline']:.2f}",
            f"{s['p50_ms']:.2f}",
            f"{s['p99_ms']:.2f}",
            f"{s['server_cpu_us_per_request']:.0f}",
            f"{s['manager_cpu_us_per_request']:.0f}",
            f"{s['server_cores_busy']:.2f}",
            s["errors"],
            f"{s['c1_p50_ms']:.3f}",
        ]
        for key, s in summary.items()
    ]
    return _server.markdown_table(header, rows)


def main() -> None:
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="1 repeat of 3 s per cell")
    parser.add_argument("--duration-s", type=float, default=5.0, help="measured s per cell")
    parser.add_argument("--repeats", type=int, default=3, help="repeats (%(default)s)")
    args = parser.parse_args()
    if args.quick:
        args.duration_s, args.repeats = 3.0, 1
    runs = run(args)
    summary = summarise(runs)
    table = report(summary)
    print(table)
    path = _server.write_results(
        "ingress",
        {
            "environment": _server.environment(),
            "concurrency": CONCURRENCY,
            "duration_s": args.duration_s,
            "repeats": args.repeats,
            "summary": summary,
            "runs": runs,
        },
    )
    print(f"results: {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
