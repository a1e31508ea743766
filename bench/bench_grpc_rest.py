"""gRPC vs REST through the same server, and this tree against another (a baseline).

Run from the repository root::

    .venv/bin/python bench/bench_grpc_rest.py                       # this tree only
    .venv/bin/python bench/bench_grpc_rest.py --baseline-src ../main/src --quick

One ``modelyard serve`` subprocess per tree (``--baseline-src``: another checkout's
``src``, run with that ``PYTHONPATH``), both running at once, each with REST and gRPC on
free ports, serving the same digits classifiers built at run time (skl2onnx, FP32
``[1, 64]``) with the default settings (``isolation: process``, ``max_batch_size: 8``).

``modelyard.bench`` sends a random payload built from each model's metadata, closed loop:
REST over raw HTTP/1.1 keep-alive (JSON tensors), gRPC with the stock grpcio client
(``grpc.aio``, ``ModelInfer``), as users run it. Per repeat, model and concurrency, every
variant (transport @ tree) runs back to back in an order rotated each repeat; ratios are
taken within a repeat and their median reported: gRPC's throughput over REST's on the same
tree, and each variant's server CPU per request over the same transport on the baseline.
The load generator shares the machine's cores with the servers; its CPU share is shown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _server

from modelyard.bench import BenchConfig, run_bench
from modelyard.examples.sklearn_models import (
    DIGITS_CLASSIFIERS,
    DIGITS_FEATURES,
    export_sklearn_onnx,
    train_digits_classifier,
)

TREE, BASELINE = "tree", "baseline"
REST, GRPC = "rest", "grpc"


def build_models(root: Path, kinds: list[str]) -> list[str]:
    names = []
    for kind in kinds:
        name = f"digits-{kind}"
        export_sklearn_onnx(
            train_digits_classifier(kind), DIGITS_FEATURES, root / name / "1" / "model.onnx"
        )
        names.append(name)
    return names


def phase(
    server: _server.Server,
    model: str,
    variant: str,
    concurrency: int,
    duration_s: float,
    warmup_s: float,
) -> dict[str, Any]:
    transport = variant.split("@")[0]
    config = BenchConfig(
        url=server.url,
        grpc_target=server.grpc_target if transport == GRPC else None,
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


Runs = dict[str, dict[int, dict[str, list[dict[str, Any]]]]]


def run(args: argparse.Namespace) -> Runs:
    levels = [int(c) for c in args.concurrency.split(",")]
    trees = {TREE: None} | ({BASELINE: args.baseline_src} if args.baseline_src else {})
    variants = [f"{t}@{tree}" for tree in trees for t in (REST, GRPC)]
    with tempfile.TemporaryDirectory(prefix="bench-grpc-rest-") as tmp:
        root = Path(tmp)
        models = build_models(root, args.models.split(","))
        entries = [{"name": m, "path": m, "preload": True} for m in models]
        cfg = _server.write_config(root, entries)
        runs: Runs = {m: {c: {v: [] for v in variants} for c in levels} for m in models}
        with contextlib.ExitStack() as stack:
            servers = {
                tree: stack.enter_context(
                    _server.Server(
                        cfg,
                        root / f"{tree}.log",
                        grpc=True,
                        env=None if src is None else {**os.environ, "PYTHONPATH": str(src)},
                    )
                )
                for tree, src in trees.items()
            }
            for tree, server in servers.items():
                print(f"{tree}: pid {server.pid}, grpc {server.grpc_target}", file=sys.stderr)
            for rep in range(args.repeats):
                for model in models:
                    for level in levels:
                        shift = rep % len(variants)
                        for variant in variants[shift:] + variants[:shift]:
                            server = servers[variant.split("@")[1]]
                            r = phase(server, model, variant, level, args.duration_s, args.warmup_s)
                            runs[model][level][variant].append(r)
                            print(
                                f"  rep {rep + 1} {model} c={level} {variant}: "
                                f"{r['qps']:.0f} rps, p99 {r['p99_ms']} ms, "
                                f"server {r['server_cpu_us_per_request']:.0f} us/req",
                                file=sys.stderr,
                            )
    return runs


def _ratio(reps: list[dict[str, Any]], base: list[dict[str, Any]] | None, key: str) -> Any:
    if base is None:
        return None
    return statistics.median(r[key] / b[key] for r, b in zip(reps, base, strict=True))


def summarise(runs: Runs) -> list[dict[str, Any]]:
    rows = []
    for model, by_level in runs.items():
        for level, by_variant in by_level.items():
            for variant, reps in by_variant.items():
                transport, tree = variant.split("@")
                rest = by_variant[f"{REST}@{tree}"]
                baseline = by_variant.get(f"{transport}@{BASELINE}")
                rows.append(
                    {
                        "model": model,
                        "concurrency": level,
                        "variant": variant,
                        "qps": statistics.median(r["qps"] for r in reps),
                        "qps_over_rest": _ratio(reps, rest, "qps"),
                        "p50_ms": statistics.median(r["p50_ms"] for r in reps),
                        "p99_ms": statistics.median(r["p99_ms"] for r in reps),
                        "client_cpu": statistics.median(r["client_cpu_fraction"] for r in reps),
                        "server_cpu_us": statistics.median(
                            r["server_cpu_us_per_request"] for r in reps
                        ),
                        "server_cpu_over_baseline": _ratio(
                            reps, baseline, "server_cpu_us_per_request"
                        ),
                        "errors": sum(sum(r["errors"].values()) for r in reps),
                    }
                )
    return rows


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def report(rows: list[dict[str, Any]]) -> str:
    header = [
        "model",
        "c",
        "transport@tree",
        "req/s",
        "÷ REST req/s (same tree)",
        "p50 / p99 (ms)",
        "server CPU µs/req",
        "÷ baseline CPU/req",
        "client CPU",
        "errors",
    ]
    return _server.markdown_table(
        header,
        [
            [
                r["model"],
                r["concurrency"],
                r["variant"],
                f"{r['qps']:.0f}",
                _times(r["qps_over_rest"]),
                f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f}",
                f"{r['server_cpu_us']:.0f}",
                _times(r["server_cpu_over_baseline"]),
                f"{r['client_cpu']:.2f}",
                r["errors"],
            ]
            for r in rows
        ],
    )


def main() -> None:
    parser = _server.arg_parser(__doc__)
    _server.add_load_point_arguments(
        parser, concurrency="50", duration_s=5.0, warmup_s=1.0, quick=(2.0, 0.5)
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="another checkout's src folder to serve beside this tree, for CPU ratios",
    )
    parser.add_argument(
        "--models", default="logreg,mlp", help="digits classifiers to serve (%(default)s)"
    )
    args = parser.parse_args()
    _server.quick_load_points(args)
    for kind in args.models.split(","):
        if kind not in DIGITS_CLASSIFIERS:
            parser.error(f"unknown digits classifier {kind!r}; one of {DIGITS_CLASSIFIERS}")
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
            "args": {k: str(v) for k, v in vars(args).items()},
            "environment": env,
            "elapsed_s": round(time.time() - started, 1),
            "summary": rows,
            "runs": {m: {str(c): v for c, v in by_level.items()} for m, by_level in runs.items()},
        },
    )
    print(f"\nwrote {path.relative_to(_server.REPO_ROOT)}")


if __name__ == "__main__":
    main()
