"""REST throughput and server CPU per request at c=50 on the five digits models, this
tree against another (the REST front end on public ASGI against the tree before it).

Run from the repository root::

    .venv/bin/python bench/bench_rest_engine.py --baseline-src OTHER_TREE/src
    .venv/bin/python bench/bench_rest_engine.py --baseline-src OTHER_TREE/src --quick

Two ``modelyard serve`` subprocesses serve the same five digits classifiers
(``build_digits_workload``: scikit-learn → ONNX, preloaded, process isolation), one
running this tree's sources, the other ``--baseline-src`` (put first on its
``PYTHONPATH``); only one runs at a time. ``wrk`` (50 connections, keep-alive, closed
loop, a uniform mix over the five models) loads each in turn; rounds alternate which
goes first. Reported per tree: the median over rounds of requests per second, p99, and
the server's CPU per request (the whole process tree, workers included), with the
ratios this tree / baseline of the same run.
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

import _server
import yaml

from modelyard.bench import BenchConfig, run_bench
from modelyard.examples.repository import build_digits_workload

CONCURRENCY = 50
HERE = Path(__file__).resolve().parent.parent / "src"


def serve_cell(cfg: Path, log: Path, src: Path, duration_s: float) -> dict[str, Any]:
    """One server on ``src``'s modelyard, loaded by wrk at c=50 for ``duration_s``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    with _server.Server(cfg, log, env=env) as server:
        config = BenchConfig(
            url=server.url,
            concurrency=(CONCURRENCY,),
            duration_s=duration_s,
            warmup_s=1.0,
            engine="wrk",
        )
        cpu0 = _server.tree_cpu_s(server.pid)
        t0 = time.perf_counter()
        r = asyncio.run(run_bench(config))[0]
        cpu_s = _server.tree_cpu_s(server.pid) - cpu0
        span_s = time.perf_counter() - t0
    sent = r.qps * span_s
    return {
        "qps": r.qps,
        "p99_ms": r.p99_ms,
        "errors": r.error_count,
        "cpu_us_per_request": cpu_s / sent * 1e6 if sent else float("nan"),
    }


def main() -> None:
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--baseline-src", type=Path, required=True, help="the other tree's src")
    parser.add_argument("--duration", type=float, default=8.0, help="s per cell (%(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="%(default)s")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 5 s")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration = 2, 5.0
    trees = {"this": HERE, "baseline": args.baseline_src.resolve()}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="bench-rest-engine-") as tmp:
        root = Path(tmp)
        cfg = build_digits_workload(root / "repo")
        doc = yaml.safe_load(cfg.read_text(encoding="utf-8"))
        doc.update(grpc_port=None, log_level="warning")
        cfg.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        for rnd in range(args.rounds):
            order = list(trees) if rnd % 2 == 0 else list(reversed(trees))
            for name in order:
                cell = serve_cell(cfg, root / f"{name}.log", trees[name], args.duration)
                runs[name].append(cell)
                print(f"  round {rnd + 1} {name}: {cell}", file=sys.stderr)
    med = {
        name: {key: statistics.median(c[key] for c in cells) for key in cells[0]}
        for name, cells in runs.items()
    }
    this, base = med["this"], med["baseline"]
    rows = [
        [name, f"{m['qps']:.0f}", f"{m['p99_ms']:.1f}", f"{m['cpu_us_per_request']:.0f}"]
        for name, m in med.items()
    ]
    rows.append(
        [
            "this / baseline",
            f"{this['qps'] / base['qps']:.2f}",
            f"{this['p99_ms'] / base['p99_ms']:.2f}",
            f"{this['cpu_us_per_request'] / base['cpu_us_per_request']:.2f}",
        ]
    )
    print(_server.markdown_table(["tree", "req/s", "p99 (ms)", "CPU µs / request"], rows))
    path = _server.write_results("rest_engine", {"runs": runs, "medians": med})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
