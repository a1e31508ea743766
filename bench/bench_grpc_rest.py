"""gRPC vs REST, and gRPC engines side by side: throughput and CPU through the same server.

Run from the repository root::

    .venv/bin/python bench/bench_grpc_rest.py            # 5 s per point, 3 repeats
    .venv/bin/python bench/bench_grpc_rest.py --quick    # 2 s per point, 1 repeat

One ``modelyard serve`` subprocess per gRPC engine, all running at once, each with REST
and gRPC on free ports, serves the same small models, built at run time, with the default
settings (``isolation: process``, ``max_batch_size: 8``, ``max_queue_delay_s: 0``):

* ``identity``: ONNX Identity, FP32 ``[1, 4]`` (the server's own cost, nothing else);
* ``digits-logreg``, ``digits-mlp``, ``digits-random-forest``: three of the five
  classifiers of the standard digits workload, via skl2onnx, FP32 ``[1, 64]``.

Engines (``--engines``): ``modelyard`` (the server as shipped: its own asyncio HTTP/2
server) and the alternatives that lost to it, started through ``bench/grpc_engines.py``:
``grpcio-aio``, ``grpcio-sync`` (threads bridged to the event loop), ``grpclib``.

``modelyard.bench`` sends a random payload built from each model's metadata, closed loop:
REST over raw HTTP/1.1 keep-alive (JSON tensors) to the ``modelyard`` server, gRPC
(``ModelInfer``, one connection) to each engine with each client of ``--grpc-clients``:
``raw`` (pre-built calls over one asyncio HTTP/2 connection, the counterpart of the raw
REST client) or ``grpcio`` (``grpc.aio``'s channel). Per repeat, model and concurrency,
every variant runs back to back in an order rotated each repeat; each gRPC variant's
ratio to REST is taken within a repeat and its median reported. The load generator
shares the two cores with the servers; its CPU share is shown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

ENGINES = ("modelyard", "grpcio-aio", "grpcio-sync", "grpclib")
CLIENTS = ("raw", "grpcio")
DIGITS = ("logreg", "mlp", "random-forest")
REST = "rest"


def build_models(root: Path) -> list[str]:
    build_identity_onnx(root / "identity" / "1" / "model.onnx")
    names = ["identity"]
    for kind in DIGITS:
        name = f"digits-{kind}"
        export_sklearn_onnx(
            train_digits_classifier(kind), DIGITS_FEATURES, root / name / "1" / "model.onnx"
        )
        names.append(name)
    return names


def engine_command(engine: str) -> list[str] | None:
    """How to start a server with ``engine`` (None: the ``modelyard`` command as shipped)."""
    if engine == "modelyard":
        return None
    return [sys.executable, str(_server.BENCH_DIR / "grpc_engines.py"), engine]


def phase(
    server: _server.Server,
    model: str,
    variant: str,
    concurrency: int,
    duration_s: float,
    warmup_s: float,
) -> dict[str, Any]:
    client = variant.rsplit("/", 1)[-1]
    config = BenchConfig(
        url=server.url,
        grpc_target=None if variant == REST else server.grpc_target,
        grpc_client="raw" if client == "raw" else "grpcio",
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
    engines = args.engines.split(",")
    variants = [REST] + [f"{e}/{c}" for e in engines for c in args.grpc_clients.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-grpc-rest-") as tmp:
        root = Path(tmp)
        models = build_models(root)[: args.models]
        entries = [{"name": m, "path": m, "preload": True} for m in models]
        cfg = _server.write_config(root, entries)
        runs: Runs = {m: {c: {v: [] for v in variants} for c in levels} for m in models}
        with contextlib.ExitStack() as stack:
            servers = {
                engine: stack.enter_context(
                    _server.Server(
                        cfg, root / f"{engine}.log", grpc=True, command=engine_command(engine)
                    )
                )
                for engine in engines
            }
            for engine, server in servers.items():
                print(f"{engine}: pid {server.pid}, grpc {server.grpc_target}", file=sys.stderr)
            for rep in range(args.repeats):
                for model in models:
                    for level in levels:
                        shift = rep % len(variants)
                        for variant in variants[shift:] + variants[:shift]:
                            engine = "modelyard" if variant == REST else variant.split("/")[0]
                            r = phase(
                                servers[engine],
                                model,
                                variant,
                                level,
                                args.duration_s,
                                args.warmup_s,
                            )
                            runs[model][level][variant].append(r)
                            print(
                                f"  rep {rep + 1} {model} c={level} {variant}: "
                                f"{r['qps']:.0f} rps, p99 {r['p99_ms']} ms, "
                                f"server {r['server_cpu_us_per_request']:.0f} us/req",
                                file=sys.stderr,
                            )
    return runs


def summarise(runs: Runs) -> list[dict[str, Any]]:
    rows = []
    for model, by_level in runs.items():
        for level, by_variant in by_level.items():
            rest = by_variant[REST]
            for variant, reps in by_variant.items():
                rows.append(
                    {
                        "model": model,
                        "concurrency": level,
                        "variant": variant,
                        "qps": statistics.median(r["qps"] for r in reps),
                        "qps_over_rest": statistics.median(
                            r["qps"] / b["qps"] for r, b in zip(reps, rest, strict=True)
                        ),
                        "p50_ms": statistics.median(r["p50_ms"] for r in reps),
                        "p99_ms": statistics.median(r["p99_ms"] for r in reps),
                        "client_cpu": statistics.median(r["client_cpu_fraction"] for r in reps),
                        "server_cpu_us": statistics.median(
                            r["server_cpu_us_per_request"] for r in reps
                        ),
                        "server_cpu_over_rest": statistics.median(
                            r["server_cpu_us_per_request"] / b["server_cpu_us_per_request"]
                            for r, b in zip(reps, rest, strict=True)
                        ),
                        "errors": sum(sum(r["errors"].values()) for r in reps),
                    }
                )
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    header = [
        "model",
        "c",
        "variant (engine / client)",
        "req/s",
        "÷ REST req/s",
        "p50 / p99 (ms)",
        "server CPU µs/req",
        "÷ REST CPU/req",
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
                f"{r['qps_over_rest']:.2f}x",
                f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f}",
                f"{r['server_cpu_us']:.0f}",
                f"{r['server_cpu_over_rest']:.2f}x",
                f"{r['client_cpu']:.2f}",
                r["errors"],
            ]
            for r in rows
        ],
    )


def main() -> None:
    parser = _server.arg_parser(__doc__)
    _server.add_load_point_arguments(
        parser, concurrency="1,50", duration_s=5.0, warmup_s=1.0, quick=(2.0, 0.5)
    )
    parser.add_argument("--engines", default=",".join(ENGINES), help="(%(default)s)")
    parser.add_argument("--grpc-clients", default="raw", help="raw and/or grpcio (%(default)s)")
    parser.add_argument("--models", type=int, default=4, help="how many of the models (4)")
    args = parser.parse_args()
    _server.quick_load_points(args)
    for engine in args.engines.split(","):
        if engine not in ENGINES:
            parser.error(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
    for client in args.grpc_clients.split(","):
        if client not in CLIENTS:
            parser.error(f"unknown gRPC client {client!r}; one of {', '.join(CLIENTS)}")
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
