"""gRPC vs REST: throughput and latency of small models through the same server.

Run from the repository root::

    .venv/bin/python bench/bench_grpc_rest.py            # 5 s per point, 3 repeats
    .venv/bin/python bench/bench_grpc_rest.py --quick    # 2 s per point, 1 repeat

One ``modelyard serve`` subprocess with REST and gRPC on free ports serves two small
models, built at run time, both with the default settings (``isolation: process``,
``max_batch_size: 8``, ``max_queue_delay_s: 0``):

* ``identity``: ONNX Identity, FP32 ``[1, 4]`` (the server's own cost, nothing else);
* ``digits-logreg``: scikit-learn logistic regression on the digits set, via skl2onnx,
  FP32 ``[1, 64]``.

``modelyard.bench`` sends a random payload built from each model's metadata, closed loop,
over REST (raw HTTP/1.1 keep-alive, JSON tensors) or gRPC (``ModelInfer``, one channel).
Per repeat, model and concurrency, REST and gRPC run back to back in an order that
alternates each repeat; the ratio gRPC / REST is taken within a repeat and its median
reported. The load generator shares the two cores with the server; its CPU share is shown.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _server

from modelyard.bench import BenchConfig, run_bench
from modelyard.examples.mlp import build_identity_onnx
from modelyard.examples.sklearn_models import (
    DIGITS_FEATURES,
    export_sklearn_onnx,
    train_digits_classifier,
)

PROTOCOLS = ("rest", "grpc")


def build_models(root: Path) -> list[str]:
    build_identity_onnx(root / "identity" / "1" / "model.onnx")
    export_sklearn_onnx(
        train_digits_classifier("logreg"),
        DIGITS_FEATURES,
        root / "digits-logreg" / "1" / "model.onnx",
    )
    return ["identity", "digits-logreg"]


def phase(
    server: _server.Server,
    model: str,
    protocol: str,
    concurrency: int,
    duration_s: float,
    warmup_s: float,
) -> dict[str, Any]:
    config = BenchConfig(
        url=server.url,
        grpc_target=server.grpc_target if protocol == "grpc" else None,
        models=(model,),
        concurrency=(concurrency,),
        duration_s=duration_s,
        warmup_s=warmup_s,
    )
    cpu0, t0 = _server.tree_cpu_s(server.pid), time.perf_counter()
    out = asyncio.run(run_bench(config))[0].to_dict()
    cpu_s, span_s = _server.tree_cpu_s(server.pid) - cpu0, time.perf_counter() - t0
    # Server tree (server + worker) CPU per request; the phase's request count, warm-up
    # included, is estimated from its measured rate over the whole span.
    sent = out["qps"] * span_s
    out["server_cpu_us_per_request"] = cpu_s / sent * 1e6 if sent else None
    out["server_cpu_fraction"] = cpu_s / span_s
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-grpc-rest-") as tmp:
        root = Path(tmp)
        models = build_models(root)
        entries = [{"name": m, "path": m, "preload": True} for m in models]
        cfg = _server.write_config(root, entries)
        runs: dict[str, dict[int, dict[str, list[dict[str, Any]]]]] = {
            m: {c: {p: [] for p in PROTOCOLS} for c in levels} for m in models
        }
        with _server.Server(cfg, root / "server.log", grpc=True) as server:
            print(
                f"server pid {server.pid}: {server.url}, grpc {server.grpc_target}", file=sys.stderr
            )
            for rep in range(args.repeats):
                for model in models:
                    for level in levels:
                        order = PROTOCOLS if rep % 2 == 0 else PROTOCOLS[::-1]
                        for protocol in order:
                            r = phase(
                                server, model, protocol, level, args.duration_s, args.warmup_s
                            )
                            runs[model][level][protocol].append(r)
                            print(
                                f"  rep {rep + 1} {model} c={level} {protocol}: "
                                f"{r['qps']:.0f} rps, p99 {r['p99_ms']} ms",
                                file=sys.stderr,
                            )
    return runs


def summarise(runs: dict[str, dict[int, dict[str, list[dict[str, Any]]]]]) -> list[dict[str, Any]]:
    rows = []
    for model, by_level in runs.items():
        for level, by_protocol in by_level.items():
            rest, grpc = by_protocol["rest"], by_protocol["grpc"]
            row: dict[str, Any] = {"model": model, "concurrency": level}
            for name, reps in by_protocol.items():
                row[f"{name}_qps"] = statistics.median(r["qps"] for r in reps)
                row[f"{name}_p50_ms"] = statistics.median(r["p50_ms"] for r in reps)
                row[f"{name}_p99_ms"] = statistics.median(r["p99_ms"] for r in reps)
                row[f"{name}_client_cpu"] = statistics.median(
                    r["client_cpu_fraction"] for r in reps
                )
                row[f"{name}_server_cpu_us"] = statistics.median(
                    r["server_cpu_us_per_request"] for r in reps
                )
                row[f"{name}_errors"] = sum(sum(r["errors"].values()) for r in reps)
            row["qps_grpc_over_rest"] = statistics.median(
                g["qps"] / r["qps"] for g, r in zip(grpc, rest, strict=True)
            )
            row["p99_grpc_over_rest"] = statistics.median(
                g["p99_ms"] / r["p99_ms"] for g, r in zip(grpc, rest, strict=True)
            )
            rows.append(row)
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    header = [
        "model",
        "concurrency",
        "REST req/s",
        "gRPC req/s",
        "gRPC / REST req/s",
        "REST p50 / p99 (ms)",
        "gRPC p50 / p99 (ms)",
        "gRPC / REST p99",
        "client CPU REST / gRPC",
        "server CPU µs/req REST / gRPC",
        "errors",
    ]
    return _server.markdown_table(
        header,
        [
            [
                r["model"],
                r["concurrency"],
                f"{r['rest_qps']:.0f}",
                f"{r['grpc_qps']:.0f}",
                f"{r['qps_grpc_over_rest']:.2f}x",
                f"{r['rest_p50_ms']:.2f} / {r['rest_p99_ms']:.2f}",
                f"{r['grpc_p50_ms']:.2f} / {r['grpc_p99_ms']:.2f}",
                f"{r['p99_grpc_over_rest']:.2f}x",
                f"{r['rest_client_cpu']:.2f} / {r['grpc_client_cpu']:.2f}",
                f"{r['rest_server_cpu_us']:.0f} / {r['grpc_server_cpu_us']:.0f}",
                r["rest_errors"] + r["grpc_errors"],
            ]
            for r in rows
        ],
    )


def main() -> None:
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="2 s per point, 1 repeat")
    parser.add_argument("--concurrency", default="1,32", help="levels (%(default)s)")
    parser.add_argument("--duration-s", type=float, default=5.0, help="measured s per point")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="warm-up s per point")
    parser.add_argument("--repeats", type=int, default=3, help="repeats (%(default)s)")
    args = parser.parse_args()
    if args.quick:
        args.duration_s, args.warmup_s, args.repeats = 2.0, 0.5, 1
    _server.install_uvloop()
    env = _server.environment()
    started = time.time()
    runs = run(args)
    rows = summarise(runs)
    print(f"\nmedians of {args.repeats} x {args.duration_s:g} s per point; {env}\n")
    print(report(rows))
    path = _server.write_results(
        "bench_grpc_rest",
        {
            "args": vars(args),
            "environment": env,
            "elapsed_s": round(time.time() - started, 1),
            "summary": rows,
            "runs": {m: {str(c): v for c, v in by_level.items()} for m, by_level in runs.items()},
        },
    )
    print(f"\nwrote {path.relative_to(_server.REPO_ROOT)}")


if __name__ == "__main__":
    main()
