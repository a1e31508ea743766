"""What process isolation costs: per-request overhead, start time, shared-weights memory.

Run from the repository root::

    .venv/bin/python bench/bench_isolation.py            # uvloop, as the server runs
    .venv/bin/python bench/bench_isolation.py --loop asyncio --requests 5000

Three measurements, printed as one markdown table:

1. **Per-request latency** of a tiny identity ONNX model (FP32 [1, 4]) called through
   ``instance.infer`` directly, inline (runtime in this process, one thread hop) and in a
   worker process (shared memory + one socket round trip). Both run in the same
   process, interleaved in rounds so that machine noise hits both alike.
2. **Worker start time**, warm (forked by the fork server) vs cold (a fresh
   ``python -m modelyard.workers.main``): time to the worker's first message, and the
   whole ``start()`` (process + load + warm-up); medians of ``--starts`` starts.
3. **Shared weights**: two replicas of one model whose weights are ONNX external data,
   with and without ``share_weights``; USS and PSS per worker from ``/proc``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from modelyard.runtimes.base import RuntimeSpec
from modelyard.workers.factory import WorkerFactory, WorkerFactoryConfig
from modelyard.workers.handle import StartMethod
from modelyard.workers.inline import InlineInstance
from modelyard.workers.instance import StartRequest
from modelyard.workers.process import ProcessInstance

MIB = 1024 * 1024


def _save(graph: onnx.GraphProto, path: Path, *, external: bool = False) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=external,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=1024,
    )


def build_identity(root: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    _save(graph, root / "identity" / "1" / "model.onnx")
    return root / "identity" / "1"


def build_big_matmul(root: Path, side: int) -> Path:
    """``y = x @ w`` with ``w`` random FP32 [side, side] stored as external data."""
    w = np.random.default_rng(0).standard_normal((side, side)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", side])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    _save(graph, root / "big" / "1" / "model.onnx", external=True)
    return root / "big" / "1"


def _stats_us(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1e6, p99 * 1e6


InferFn = Callable[[dict[str, np.ndarray], float], Coroutine[Any, Any, dict[str, np.ndarray]]]


async def _time_calls(infer: InferFn, n: int, out: list[float]) -> None:
    x = {"x": np.random.default_rng(0).random((1, 4), dtype=np.float32)}
    for _ in range(n):
        t0 = time.perf_counter()
        await infer(x, 5.0)
        out.append(time.perf_counter() - t0)


async def bench_overhead(factory: WorkerFactory, model: Path, requests: int) -> dict[str, Any]:
    request = StartRequest(RuntimeSpec("onnx", str(model), model_name="identity"))
    inline = InlineInstance()
    process = ProcessInstance(factory)
    await inline.start(request)
    await process.start(request)
    try:
        warm: list[float] = []
        await _time_calls(inline.infer, 500, warm)
        await _time_calls(process.infer, 500, warm)
        inline_s: list[float] = []
        process_s: list[float] = []
        rounds = 10
        for _ in range(rounds):
            await _time_calls(inline.infer, requests // rounds, inline_s)
            await _time_calls(process.infer, requests // rounds, process_s)
    finally:
        await process.stop()
        await inline.stop()
    return {"inline": _stats_us(inline_s), "process": _stats_us(process_s)}


async def bench_starts(model: Path, starts: int, method: StartMethod) -> dict[str, float]:
    config = WorkerFactoryConfig(start_method=method)
    request = StartRequest(RuntimeSpec("onnx", str(model), model_name="identity"))
    to_hello: list[float] = []
    full: list[float] = []
    async with WorkerFactory(config) as factory:
        for _ in range(starts):
            instance = ProcessInstance(factory)
            t0 = time.perf_counter()
            info = await instance.start(request)
            full.append(time.perf_counter() - t0)
            to_hello.append(info.process_start_s)
            await instance.stop()
    return {
        "process_ms": statistics.median(to_hello) * 1e3,
        "start_ms": statistics.median(full) * 1e3,
    }


async def bench_shared_weights(
    factory: WorkerFactory, model: Path, baseline: Path
) -> list[dict[str, Any]]:
    """Per-worker USS and PSS of two replicas; "above empty" subtracts a worker serving
    the identity model, sampled at the same moment (so shared libraries divide alike)."""
    rows: list[dict[str, Any]] = []
    empty = ProcessInstance(factory)
    await empty.start(StartRequest(RuntimeSpec("onnx", str(baseline), model_name="identity")))
    for share in (False, True):
        spec = RuntimeSpec("onnx", str(model), model_name="big", share_weights=share)
        replicas = [ProcessInstance(factory) for _ in range(2)]
        for r in replicas:
            await r.start(StartRequest(spec))
        base = await empty.sample_memory()
        samples = [await r.sample_memory() for r in replicas]
        for r in replicas:
            await r.stop()
        rows.append(
            {
                "share": share,
                "uss_mib": statistics.mean(s.uss_bytes for s in samples) / MIB,
                "pss_mib": statistics.mean(s.pss_bytes for s in samples) / MIB,
                "model_pss_mib": statistics.mean(s.pss_bytes - base.pss_bytes for s in samples)
                / MIB,
            }
        )
    await empty.stop()
    return rows


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-isolation-") as tmp:
        root = Path(tmp)
        identity = build_identity(root)
        big = build_big_matmul(root, args.weights_side)
        weights_mib = (big / "weights.bin").stat().st_size / MIB
        async with WorkerFactory() as factory:
            backend = factory.memory_limit_backend
            overhead = await bench_overhead(factory, identity, args.requests)
            shared = await bench_shared_weights(factory, big, identity)
        warm = await bench_starts(identity, args.starts, "fork")
        cold = await bench_starts(identity, args.starts, "spawn")

    inline_med, inline_p99 = overhead["inline"]
    proc_med, proc_p99 = overhead["process"]
    rows = [
        ("inline infer, median / p99 (µs)", f"{inline_med:.1f} / {inline_p99:.1f}"),
        ("process infer, median / p99 (µs)", f"{proc_med:.1f} / {proc_p99:.1f}"),
        ("process minus inline, median (µs)", f"{proc_med - inline_med:+.1f}"),
        (
            "warm start (fork): to first message / whole start() (ms)",
            f"{warm['process_ms']:.1f} / {warm['start_ms']:.1f}",
        ),
        (
            "cold start (spawn): to first message / whole start() (ms)",
            f"{cold['process_ms']:.1f} / {cold['start_ms']:.1f}",
        ),
    ]
    for row in shared:
        label = "shared" if row["share"] else "private"
        rows.append(
            (
                f"2 replicas, {weights_mib:.0f} MiB external weights, {label}: per-worker "
                "USS / PSS / PSS above an empty worker (MiB)",
                f"{row['uss_mib']:.1f} / {row['pss_mib']:.1f} / {row['model_pss_mib']:.1f}",
            )
        )
    print(f"\nloop: {args.loop}; memory-limit backend: {backend}; python {sys.version.split()[0]}")
    print(f"{args.requests} sequential requests per mode; {args.starts} starts per method\n")
    print("| measurement | value |")
    print("| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=5000, help="sequential requests per mode")
    parser.add_argument("--starts", type=int, default=20, help="worker starts per start method")
    parser.add_argument(
        "--weights-side", type=int, default=4096, help="side of the square weight matrix"
    )
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    return parser.parse_args()


if __name__ == "__main__":
    options = _parse()
    if options.loop == "uvloop":
        import uvloop

        uvloop.install()
    asyncio.run(main(options))
