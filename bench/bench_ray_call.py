"""Where a Ray-mode batch's time goes: one model actor call, plain vs compiled graph.

Run from the repository root (needs the ``ray`` extra)::

    .venv/bin/python bench/bench_ray_call.py            # 300 calls per cell
    .venv/bin/python bench/bench_ray_call.py --calls 100

A local cluster on 127.0.0.1: a head ``n0`` (this script's driver joins it, as the
server would) and a second node ``n1``. On each node one
:class:`~modelyard.workers.ray_actor.ModelActor` per model: ``add`` (an ONNX identity
plus one, the call's floor) and two digits classifiers (scikit-learn exported to ONNX,
the benchmarks' workload), batch 1. For each: the runtime's own ``infer`` in this
process (the compute), then the round trip of a plain actor call (``infer.remote``) and
of a Ray Compiled Graph execution (``ray.dag``; decision 0043 says why the server does
not use them), one caller at a time
(c=1, median latency) and eight callers on the one actor (c=8, calls per second), in
interleaved rounds. Ratios within one run are the result; the machine is shared.
"""

from __future__ import annotations

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

from modelyard.examples.mlp import build_add_onnx
from modelyard.examples.sklearn_models import (
    DIGITS_FEATURES,
    export_sklearn_onnx,
    train_digits_classifier,
)
from modelyard.runtimes import create_runtime
from modelyard.runtimes.base import RuntimeSpec

_MIB = 1 << 20


def build_models(root: Path) -> dict[str, tuple[Path, dict[str, np.ndarray]]]:
    """``add`` and two digits classifiers: folder and a batch-1 input of each."""
    build_add_onnx(root / "add" / "1" / "model.onnx", 1.0)
    models = {"add": (root / "add" / "1", {"input": np.ones((1, 4), np.float32)})}
    for kind in ("logreg", "random-forest"):
        folder = root / f"digits-{kind}" / "1"
        export_sklearn_onnx(train_digits_classifier(kind), DIGITS_FEATURES, folder / "model.onnx")
        runtime = create_runtime("onnx")
        runtime.load(
            RuntimeSpec(
                kind="onnx", version_dir=str(folder), model_name=f"digits-{kind}", device="cpu"
            )
        )
        name = runtime.inputs[0].name
        runtime.close()
        models[f"digits-{kind}"] = (folder, {name: np.ones((1, DIGITS_FEATURES), np.float32)})
    return models


def start_cluster() -> Any:
    """Head ``n0`` and node ``n1``, two CPUs each, loopback only."""
    from ray.cluster_utils import Cluster

    def node(name: str) -> dict[str, Any]:
        return {
            "num_cpus": 2,
            "resources": {f"modelyard.node.{name}": 1},
            "object_store_memory": 100 * _MIB,
            "node_ip_address": "127.0.0.1",
        }

    cluster = Cluster(
        initialize_head=True, head_node_args={**node("n0"), "include_dashboard": False}
    )
    cluster.add_node(**node("n1"))
    cluster.wait_for_nodes()
    return cluster


def compute_ms(folder: Path, x: dict[str, np.ndarray], calls: int) -> float:
    """Median ms of the runtime's own ``infer`` in this process."""
    runtime = create_runtime("onnx")
    runtime.load(
        RuntimeSpec(
            kind="onnx", version_dir=str(folder), model_name=folder.parent.name, device="cpu"
        )
    )
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        runtime.infer(x)
        times.append(time.perf_counter() - t0)
    runtime.close()
    return statistics.median(times) * 1000


async def round_trips(
    actor: Any, graph: Any, x: dict[str, np.ndarray], calls: int
) -> dict[str, float]:
    """c=1 median ms and c=8 calls/s, plain and compiled, interleaved."""

    async def plain() -> None:
        await asyncio.wrap_future(actor.infer.remote(x).future())

    async def compiled() -> None:
        await (await graph.execute_async(x))

    out: dict[str, float] = {}
    for name, call in (("plain", plain), ("graph", compiled)) * 2:
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await call()
            times.append(time.perf_counter() - t0)
        out[f"{name}_c1_ms"] = min(out.get(f"{name}_c1_ms", 1e9), statistics.median(times) * 1000)

        async def caller(n: int, call: Any = call) -> None:
            for _ in range(n):
                await call()

        t0 = time.perf_counter()
        await asyncio.gather(*(caller(calls // 8) for _ in range(8)))
        rate = 8 * (calls // 8) / (time.perf_counter() - t0)
        out[f"{name}_c8_per_s"] = max(out.get(f"{name}_c8_per_s", 0.0), rate)
    return out


async def measure(
    models: dict[str, tuple[Path, dict[str, np.ndarray]]], calls: int
) -> list[dict[str, Any]]:
    import ray
    from ray.dag import InputNode
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from modelyard.workers.ray_actor import ModelActor

    ids = {
        next(k for k in n["Resources"] if k.startswith("modelyard.node."))[15:]: n["NodeID"]
        for n in ray.nodes()  # type: ignore[no-untyped-call,unused-ignore]
        if n["Alive"]
    }
    remote: Any = ray.remote(ModelActor)
    rows = []
    for node in ("n0", "n1"):
        where = (
            "server's node"
            if ids[node] == ray.get_runtime_context().get_node_id()
            else "other node"
        )
        for name, (folder, x) in models.items():
            actor = remote.options(
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(ids[node], soft=False),
            ).remote()
            spec = RuntimeSpec(
                kind="onnx", version_dir=str(folder), model_name=name, device=f"{node}/cpu"
            )
            loaded, error = await asyncio.wrap_future(
                actor.load.remote(spec, None, [], False).future()
            )
            assert loaded is not None, error
            with InputNode() as inp:
                dag = actor.infer.bind(inp)
            graph = dag.experimental_compile(enable_asyncio=True)
            row = {"node": where, "model": name, "compute_ms": compute_ms(folder, x, calls)}
            row.update(await round_trips(actor, graph, x, calls))
            graph.teardown()
            ray.kill(actor)
            print(row, file=sys.stderr)
            rows.append(row)
    return rows


def main() -> None:
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    import ray

    env = _server.environment()
    with tempfile.TemporaryDirectory(prefix="bench-ray-call-") as tmp:
        models = build_models(Path(tmp))
        cluster = start_cluster()
        try:
            ray.init(address=cluster.address, log_to_driver=False)
            rows = asyncio.run(measure(models, args.calls))
        finally:
            ray.shutdown()
            cluster.shutdown()
    print(
        _server.markdown_table(
            [
                "actor on",
                "model",
                "compute ms",
                "plain c=1 ms",
                "graph c=1 ms",
                "plain c=8 calls/s",
                "graph c=8 calls/s",
                "graph/plain c=8",
            ],
            [
                [
                    r["node"],
                    r["model"],
                    f"{r['compute_ms']:.3f}",
                    f"{r['plain_c1_ms']:.2f}",
                    f"{r['graph_c1_ms']:.2f}",
                    f"{r['plain_c8_per_s']:.0f}",
                    f"{r['graph_c8_per_s']:.0f}",
                    f"{r['graph_c8_per_s'] / r['plain_c8_per_s']:.2f}x",
                ]
                for r in rows
            ],
        )
    )
    path = _server.write_results("ray_call", {"environment": env, "rows": rows})
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
