"""Replicas on core-set devices: MiniLM with one replica vs two on ``cpu:0`` and ``cpu:1``.

Run from the repository root (needs the ``torch`` extra, for the export)::

    .venv/bin/python bench/bench_replicas.py            # 8 s per point, 3 repeats
    .venv/bin/python bench/bench_replicas.py --quick    # 3 s per point, 1 repeat
    .venv/bin/python bench/bench_replicas.py --engine wrk   # load from wrk, not Python
    .venv/bin/python bench/bench_replicas.py --configs 1r,2r   # without the 1r-2t context

The all-MiniLM-L6-v2 encoder is exported to ONNX at run time; every request carries one
sentence tokenised to 16 tokens (batch 1), sent by ``modelyard.bench`` over REST, closed
loop. One ``modelyard serve`` subprocess has two devices, the core sets ``cpu:0`` and
``cpu:1`` (each worker pinned to its core, one runtime thread), and serves the same file
as:

* **1r**: one replica, ``devices: [cpu:0]`` (the baseline);
* **2r**: ``devices: [cpu:0, cpu:1]``, ``replicas: {min: 2, max: 2}``: its first replica
  on ``cpu:0`` and the second on ``cpu:1``, requests routed by power of two choices;
* **1r-2t** (context): one replica on the unpinned ``cpu`` device with two ONNX Runtime
  threads, the other way to give one model both cores.

All three batch the same way (``max_batch_size: 8``, no added delay). Concurrency 4, 16
and 32 by default: with every worker busy, the rows in a closed loop are the running batch
plus the next one queued on each worker, so 16 clients give one worker batches of 8 but
two workers batches of 4 on average (whatever the routing); 32 fill both. Each point also
records the rows per worker call over all replicas and the server's CPU per request. Per
repeat and per concurrency the three run back to back in an order rotated each repeat;
ratios against 1r are taken within a repeat, then the median over repeats is reported. The load
generator runs on the same two cores as the server (the machine has no others): with
``--engine wrk`` it is ``wrk`` (C, one thread), which takes far less of them than the
Python client.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _server
import psutil
import yaml
from bench_batching import write_payload

from modelyard.bench import BenchConfig, BenchResult, run_bench
from modelyard.examples.minilm import export_minilm_onnx

COMMON: dict[str, Any] = {
    "path": "minilm",
    "preload": True,
    "max_batch_size": 8,
    "max_queue_size": 1024,
    "memory_mb": 300,
}
MODELS: dict[str, dict[str, Any]] = {
    "1r": {"devices": ["cpu:0"]},
    "2r": {"devices": ["cpu:0", "cpu:1"], "replicas": {"min": 2, "max": 2}},
    "1r-2t": {"devices": ["cpu"], "intra_op_threads": 2},
}
READY_TIMEOUT_S = 120.0
BARE: list[dict[str, float]] = []
"""Each repeat's :func:`bare_ceiling`."""


def write_config(root: Path) -> Path:
    config = {
        "model_repository": ".",
        "log_level": "warning",
        "grpc_port": None,
        "prefetch": {"enabled": False},
        "devices": [
            {"name": "cpu", "memory_budget_mb": 2048},
            {"name": "cpu:0", "memory_budget_mb": 1024},
            {"name": "cpu:1", "memory_budget_mb": 1024},
        ],
        "models": [{"name": f"minilm-{k}", **COMMON, **v} for k, v in MODELS.items()],
    }
    path = root / "modelyard.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def wait_for_replicas(server: _server.Server) -> list[str]:
    """Wait until minilm-2r's second replica is ready; the devices of its replicas."""
    give_up = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < give_up:
        row = server.model_stats("minilm-2r")
        ready = [r for r in row.get("replicas", []) if r["state"] == "ready"]
        if row["state"] == "READY" and ready:
            return [row["device"], *(r["device"] for r in ready)]
        time.sleep(0.2)
    raise RuntimeError(f"minilm-2r has no second replica:\n{server.log_tail()}")


def call_counts(server: _server.Server, model: str) -> tuple[int, int]:
    """Requests answered and worker calls made so far, over all of ``model``'s replicas."""
    row = server.model_stats(model)
    scheduler = row.get("scheduler", {})
    answered = int(scheduler.get("succeeded", 0))
    calls = int(scheduler.get("model_calls", 0))
    for replica in row.get("replicas", []):
        answered += int(replica.get("succeeded", 0))
        calls += int(replica.get("model_calls", 0))
    return answered, calls


def phase(
    server: _server.Server, model: str, payload: Path, concurrency: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One closed-loop phase; the result, the rows per worker call its batches carried,
    and the CPU per answered request of the server process and of its whole tree (its
    workers included); warm-up included in those three."""
    answered0, calls0 = call_counts(server, model)
    main = psutil.Process(server.pid)
    main0 = sum(main.cpu_times()[:2])
    cpu0 = _server.tree_cpu_s(server.pid)
    config = BenchConfig(
        url=server.url,
        models=(model,),
        concurrency=(concurrency,),
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
        payload_files={model: payload},
        engine=args.engine,
    )
    results: list[BenchResult] = asyncio.run(run_bench(config))
    cpu_s = _server.tree_cpu_s(server.pid) - cpu0
    main_s = sum(main.cpu_times()[:2]) - main0
    answered, calls = call_counts(server, model)
    out = results[0].to_dict()
    n = answered - answered0
    out["rows_per_call"] = n / (calls - calls0) if calls > calls0 else None
    out["server_cpu_ms_per_request"] = main_s / n * 1e3 if n else None
    out["tree_cpu_ms_per_request"] = cpu_s / n * 1e3 if n else None
    return out


BARE_BATCH = 8
"""Batch of the bare ceiling's loops: the servers' ``max_batch_size``."""


def _bare_loop(path: str, core: int, duration_s: float, out: Any) -> None:
    """One process pinned to ``core``: sentences per second of a bare session."""
    os.sched_setaffinity(0, {core})
    import numpy as np
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.ones((BARE_BATCH, 16), np.int64) for i in session.get_inputs()}
    for _ in range(3):
        session.run(None, feeds)
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < duration_s:
        session.run(None, feeds)
        done += BARE_BATCH
    out.put(done / (time.perf_counter() - t0))


def bare_ceiling(path: Path, duration_s: float) -> dict[str, float]:
    """What the machine gives two pinned processes against one, without any server:
    bare ONNX Runtime loops on ``cpu:0``, then on ``cpu:0`` and ``cpu:1`` at once."""
    ctx = multiprocessing.get_context("fork")
    rates = {}
    for label, cores in (("one", [0]), ("two", [0, 1])):
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_bare_loop, args=(str(path), c, duration_s, out)) for c in cores
        ]
        for proc in procs:
            proc.start()
        rates[label] = sum(out.get() for _ in procs)
        for proc in procs:
            proc.join()
    return {
        "one_per_s": rates["one"],
        "two_per_s": rates["two"],
        "ratio": rates["two"] / rates["one"],
    }


def run(args: argparse.Namespace) -> tuple[list[str], dict[str, dict[int, list[dict[str, Any]]]]]:
    levels = [int(c) for c in args.concurrency.split(",")]
    names = args.configs.split(",")
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {k: {c: [] for c in levels} for k in names}
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
        root = Path(tmp)
        print("exporting MiniLM to ONNX ...", file=sys.stderr)
        model = export_minilm_onnx(root / "minilm" / "1" / "model.onnx")
        payload = write_payload(root / "payload.json")
        with _server.Server(write_config(root), root / "server.log") as server:
            placed = wait_for_replicas(server)
            print(f"server pid {server.pid}; minilm-2r replicas on {placed}", file=sys.stderr)
            for rep in range(args.repeats):
                for level in levels:
                    shift = rep % len(names)
                    for name in names[shift:] + names[:shift]:
                        r = phase(server, f"minilm-{name}", payload, level, args)
                        runs[name][level].append(r)
                        print(
                            f"  rep {rep + 1} c={level} {name}: {r['qps']:.1f} rps, "
                            f"p99 {r['p99_ms']} ms, errors {sum(r['errors'].values())}, "
                            f"rows/call {r['rows_per_call'] or 0:.1f}, server CPU "
                            f"{r['server_cpu_ms_per_request'] or 0:.2f} ms/req, tree "
                            f"{r['tree_cpu_ms_per_request'] or 0:.2f} ms/req",
                            file=sys.stderr,
                        )
                bare = bare_ceiling(model, args.duration_s)
                BARE.append(bare)
                print(f"  rep {rep + 1} bare: two / one = {bare['ratio']:.2f}x", file=sys.stderr)
    return placed, runs


def summarise(runs: dict[str, dict[int, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    rows = []
    for name, by_level in runs.items():
        for level, reps in by_level.items():
            base = runs["1r"][level]
            rows.append(
                {
                    "config": name,
                    "concurrency": level,
                    "qps": statistics.median(r["qps"] for r in reps),
                    "p50_ms": statistics.median(r["p50_ms"] for r in reps if r["p50_ms"]),
                    "p99_ms": statistics.median(r["p99_ms"] for r in reps if r["p99_ms"]),
                    "errors": sum(sum(r["errors"].values()) for r in reps),
                    "rows_per_call": statistics.median(
                        r["rows_per_call"] for r in reps if r["rows_per_call"]
                    ),
                    "server_cpu_ms": statistics.median(
                        r["server_cpu_ms_per_request"]
                        for r in reps
                        if r["server_cpu_ms_per_request"]
                    ),
                    "qps_vs_1r": statistics.median(
                        r["qps"] / b["qps"] for r, b in zip(reps, base, strict=True)
                    ),
                    "p99_vs_1r": statistics.median(
                        r["p99_ms"] / b["p99_ms"]
                        for r, b in zip(reps, base, strict=True)
                        if r["p99_ms"] and b["p99_ms"]
                    ),
                }
            )
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    header = ["config", "concurrency", "req/s", "p50 (ms)", "p99 (ms)", "req/s vs 1r"]
    header += ["p99 vs 1r", "rows per call", "server CPU (ms/req)", "errors"]
    ordered = sorted(rows, key=lambda r: (r["concurrency"], list(MODELS).index(r["config"])))
    return _server.markdown_table(
        header,
        [
            [
                r["config"],
                r["concurrency"],
                f"{r['qps']:.1f}",
                f"{r['p50_ms']:.1f}",
                f"{r['p99_ms']:.1f}",
                f"{r['qps_vs_1r']:.2f}x",
                f"{r['p99_vs_1r']:.2f}x",
                f"{r['rows_per_call']:.1f}",
                f"{r['server_cpu_ms']:.2f}",
                r["errors"],
            ]
            for r in ordered
        ],
    )


def main() -> None:
    parser = _server.arg_parser(__doc__)
    _server.add_load_point_arguments(
        parser, concurrency="4,16,32", duration_s=8.0, warmup_s=2.0, quick=(3.0, 1.0)
    )
    parser.add_argument(
        "--configs",
        default=",".join(MODELS),
        help="the configurations to measure, 1r first (%(default)s)",
    )
    parser.add_argument(
        "--engine",
        choices=("python", "wrk"),
        default="python",
        help="the load generator: modelyard.bench's Python client or wrk (C, lighter)",
    )
    args = parser.parse_args()
    names = args.configs.split(",")
    if names[0] != "1r" or not set(names) <= set(MODELS):
        parser.error(f"--configs: 1r first, then any of {', '.join(MODELS)}")
    _server.quick_load_points(args)
    _server.install_uvloop()
    env = _server.environment()
    load_start = os.getloadavg()
    started = time.time()
    placed, runs = run(args)
    rows = summarise(runs)
    print(
        f"\nminilm-2r replicas on {placed}; 16 tokens, batch 1 per request; "
        f"medians of {args.repeats} x {args.duration_s:g} s; load from {args.engine}; {env}\n"
    )
    print(report(rows))
    print(f"\nload average at the start {load_start}, at the end {os.getloadavg()}")
    ceiling = statistics.median(b["ratio"] for b in BARE)
    print(
        f"\nmachine ceiling (bare ONNX Runtime, batch {BARE_BATCH}, no server): two pinned "
        f"processes = {ceiling:.2f}x one (median of {len(BARE)})"
    )
    path = _server.write_results(
        "bench_replicas",
        {
            "args": vars(args),
            "environment": env,
            "elapsed_s": round(time.time() - started, 1),
            "load_average_end": os.getloadavg(),
            "replica_devices": placed,
            "summary": rows,
            "bare_ceiling": BARE,
            "runs": {c: {str(k): v for k, v in lv.items()} for c, lv in runs.items()},
        },
    )
    print(f"\nwrote {path.relative_to(_server.REPO_ROOT)}")


if __name__ == "__main__":
    main()
