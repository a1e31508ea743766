"""Ray mode vs single-host mode on one machine: the standard five-model workload.

Run from the repository root (needs the ``ray`` extra)::

    .venv/bin/python bench/bench_ray.py                 # 10 s per phase, 2 rounds
    .venv/bin/python bench/bench_ray.py --quick         # 4 s per phase, 1 round

The five digits classifiers (``build_digits_workload``), batch 1, a uniform mix, closed
loop at concurrency 50 over REST, sent by ``modelyard.bench`` from this process. Two
modes, each on a fresh server, in an order reversed each round:

* **single**: ``modelyard serve`` as usual, one worker process per model (the baseline);
* **ray**: ``modelyard serve --ray ADDRESS`` against a local Ray cluster this script
  starts (a head with no CPUs and one node, loopback only): one Ray actor per model.

CPU per request is the CPU time of every process this script started (server, its
workers, the Ray cluster) over the timed window, divided by the requests answered; the
load generator's own CPU is reported apart. A second part measures the data path: one
actor call with inputs from 16 B to 16 MB, inline in the call vs put in the object
store first, which sets ``ray.inline_max_bytes``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import _server
import numpy as np
import psutil

from modelyard.bench import BenchConfig, BenchResult, run_bench
from modelyard.examples.mlp import build_add_onnx
from modelyard.examples.repository import build_digits_workload

_MIB = 1 << 20


def children_cpu_s() -> float:
    """CPU seconds of every live descendant of this process."""
    total = 0.0
    for proc in psutil.Process().children(recursive=True):
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def start_cluster() -> Any:
    """A head (no CPUs) and one node with the machine's CPUs, on 127.0.0.1."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "object_store_memory": 200 * _MIB,
            "node_ip_address": "127.0.0.1",
        },
    )
    cluster.add_node(
        num_cpus=8,
        resources={"modelyard.node.n1": 1, "modelyard.memory_mb": 2048},
        object_store_memory=200 * _MIB,
        node_ip_address="127.0.0.1",
    )
    cluster.wait_for_nodes()
    return cluster


def phase(
    server: _server.Server, models: list[str], args: argparse.Namespace
) -> tuple[dict[str, Any], float, float]:
    """One closed-loop phase; returns the result, the server tree's CPU seconds (its
    workers included) and the CPU seconds of the other processes this script started
    (the Ray cluster: GCS, raylet, actors)."""
    config = BenchConfig(
        url=server.url,
        models=tuple(models),
        concurrency=(args.concurrency,),
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
    )
    all0, server0 = children_cpu_s(), _server.tree_cpu_s(server.pid)
    results: list[BenchResult] = asyncio.run(run_bench(config))
    all_s = children_cpu_s() - all0
    server_s = _server.tree_cpu_s(server.pid) - server0
    return results[0].to_dict(), server_s, all_s - server_s


def run_mode(
    mode: str,
    config: Path,
    root: Path,
    models: list[str],
    args: argparse.Namespace,
    address: str,
) -> dict[str, Any]:
    extra = ["--ray", address] if mode == "ray" else []
    with _server.Server(config, root / f"server-{mode}.log", extra_args=extra) as server:
        result, server_s, cluster_s = phase(server, models, args)
    # The window includes warm-up; scale CPU to the timed share of it.
    timed = args.duration_s / (args.duration_s + args.warmup_s)
    served = max(1, result["ok"])
    return {
        "mode": mode,
        "qps": result["qps"],
        "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
        "errors": result["errors"],
        "server_cpu_ms_per_request": server_s * timed / served * 1000,
        "cluster_cpu_ms_per_request": cluster_s * timed / served * 1000,
        "cpu_ms_per_request": (server_s + cluster_s) * timed / served * 1000,
        "client_cpu_ms_per_request": result["client_cpu_s"] / served * 1000,
    }


def data_path(root: Path, address: str) -> list[dict[str, Any]]:
    """One actor on the node: a call with inputs inline vs through ``ray.put``."""
    import ray

    from modelyard.runtimes.base import RuntimeSpec
    from modelyard.workers.ray_actor import ModelActor

    folder = root / "add" / "1"
    build_add_onnx(folder / "model.onnx", 1.0)
    ray.init(address=address, log_to_driver=False)
    try:
        actor: Any = ray.remote(ModelActor).options(num_cpus=1).remote()
        spec = RuntimeSpec(kind="onnx", version_dir=str(folder), model_name="add", device="n1/cpu")
        ray.get(actor.load.remote(spec, None, [], False))
        rows = []
        for n in (1, 256, 2048, 8192, 65536, 262144):
            x = {"input": np.ones((n, 4), np.float32)}
            times: dict[str, list[float]] = {"inline": [], "put": []}
            for _ in range(15):
                for how in ("inline", "put"):
                    t0 = time.perf_counter()
                    arg = x if how == "inline" else ray.put(x)
                    ray.get(actor.infer.remote(arg))
                    times[how].append(time.perf_counter() - t0)
            inline = statistics.median(times["inline"]) * 1000
            put = statistics.median(times["put"]) * 1000
            rows.append({"bytes": n * 16, "inline_ms": inline, "put_ms": put})
        ray.kill(actor)
        return rows
    finally:
        ray.shutdown()


def main() -> None:
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--duration", dest="duration_s", type=float, default=10.0)
    parser.add_argument("--warmup", dest="warmup_s", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="4 s phases, one round")
    args = parser.parse_args()
    if args.quick:
        args.duration_s, args.rounds = 4.0, 1
    _server.install_uvloop()
    env = _server.environment()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        root = Path(tmp)
        config = build_digits_workload(root / "repo")
        import yaml

        models = [m["name"] for m in yaml.safe_load(config.read_text())["models"]]
        cluster = start_cluster()
        try:
            for round_ in range(args.rounds):
                order = ["single", "ray"] if round_ % 2 == 0 else ["ray", "single"]
                for mode in order:
                    row = run_mode(mode, config, root, models, args, cluster.address)
                    row["round"] = round_
                    runs.append(row)
                    print(row, file=sys.stderr)
            datapath = data_path(root, cluster.address)
        finally:
            cluster.shutdown()
    summary = []
    for mode in ("single", "ray"):
        rows = [r for r in runs if r["mode"] == mode]
        summary.append(
            {
                "mode": mode,
                **{
                    k: statistics.median(r[k] for r in rows)
                    for k in (
                        "qps",
                        "p50_ms",
                        "p99_ms",
                        "cpu_ms_per_request",
                        "server_cpu_ms_per_request",
                        "cluster_cpu_ms_per_request",
                        "client_cpu_ms_per_request",
                    )
                },
            }
        )
    base = summary[0]
    print(
        _server.markdown_table(
            [
                "mode",
                "QPS",
                "p50 ms",
                "p99 ms",
                "CPU ms/request",
                "of which server",
                "of which Ray cluster",
                "client CPU ms/request",
                "QPS ratio",
                "p99 ratio",
                "CPU ratio",
            ],
            [
                [
                    s["mode"],
                    f"{s['qps']:.0f}",
                    f"{s['p50_ms']:.2f}",
                    f"{s['p99_ms']:.2f}",
                    f"{s['cpu_ms_per_request']:.3f}",
                    f"{s['server_cpu_ms_per_request']:.3f}",
                    f"{s['cluster_cpu_ms_per_request']:.3f}",
                    f"{s['client_cpu_ms_per_request']:.3f}",
                    f"{s['qps'] / base['qps']:.2f}x",
                    f"{s['p99_ms'] / base['p99_ms']:.2f}x",
                    f"{s['cpu_ms_per_request'] / base['cpu_ms_per_request']:.2f}x",
                ]
                for s in summary
            ],
        )
    )
    print()
    print(
        _server.markdown_table(
            ["input bytes", "inline ms", "ray.put ms", "put / inline"],
            [
                [
                    r["bytes"],
                    f"{r['inline_ms']:.2f}",
                    f"{r['put_ms']:.2f}",
                    f"{r['put_ms'] / r['inline_ms']:.2f}x",
                ]
                for r in datapath
            ],
        )
    )
    path = _server.write_results(
        "ray", {"environment": env, "runs": runs, "summary": summary, "data_path": datapath}
    )
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
