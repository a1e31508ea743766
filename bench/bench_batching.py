"""Dynamic batching: MiniLM throughput and latency with batching off, fixed and adaptive.

Run from the repository root (needs the ``torch`` extra, for the export)::

    .venv/bin/python bench/bench_batching.py            # 6 s per point, 3 repeats
    .venv/bin/python bench/bench_batching.py --quick    # 2 s per point, 1 repeat

The all-MiniLM-L6-v2 encoder is exported to ONNX at run time (inputs ``input_ids`` and
``attention_mask``, INT64 ``[batch, seq]``). Every request carries the same sentence,
tokenised to 16 tokens, batch 1, sent by ``modelyard.bench`` from a payload file over REST,
closed loop. One ``modelyard serve`` subprocess serves the same file as three models
(each its own worker process):

* **(a) off**: ``max_batch_size: 1``;
* **(b) fixed**: ``max_batch_size: 16, max_queue_delay_s: 0.002``;
* **(c) adaptive**: ``max_batch_size: 32, latency_slo_s: 0.1``.

First a short tuning pass compares ``intra_op_threads`` 1 and 2 (all three configurations
at concurrency 1 and 32) and keeps the one with the higher geometric-mean throughput for
the whole run. Then, per repeat and per concurrency, (a), (b) and (c) run back to back, in
an order rotated each repeat. Ratios against (a) are taken within a repeat, then the
median over repeats is reported. The mean batch size comes from the scheduler's counters
in ``/v2/stats`` (requests answered / model calls, warm-up included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _server

from modelyard.bench import BenchConfig, BenchResult, run_bench
from modelyard.examples.minilm import export_minilm_onnx, tokenize

SENTENCE = "A small model server loads many models on demand and evicts the idle ones first."
SEQ_TOKENS = 16

CONFIGS: dict[str, dict[str, Any]] = {
    "a-off": {"max_batch_size": 1},
    "b-fixed": {"max_batch_size": 16, "max_queue_delay_s": 0.002},
    "c-adaptive": {"max_batch_size": 32, "latency_slo_s": 0.1},
}
THREADS = (1, 2)


def write_payload(path: Path) -> Path:
    """The v2 JSON body: one sentence, tokenised and truncated to ``SEQ_TOKENS``."""
    tokens = tokenize([SENTENCE], max_length=SEQ_TOKENS)
    body = {
        "inputs": [
            {
                "name": name,
                "shape": list(tokens[name].shape),
                "datatype": "INT64",
                "data": tokens[name].reshape(-1).tolist(),
            }
            for name in ("input_ids", "attention_mask")
        ]
    }
    path.write_text(json.dumps(body), encoding="utf-8")
    return path


def model_name(config: str, threads: int) -> str:
    return f"minilm-{config}-t{threads}"


def phase(
    server: _server.Server,
    model: str,
    payload: Path,
    concurrency: int,
    duration_s: float,
    warmup_s: float,
) -> dict[str, Any]:
    """One closed-loop phase; the result plus the mean batch size the scheduler formed."""
    before = server.model_stats(model).get("scheduler", {})
    config = BenchConfig(
        url=server.url,
        models=(model,),
        concurrency=(concurrency,),
        duration_s=duration_s,
        warmup_s=warmup_s,
        payload_files={model: payload},
    )
    results: list[BenchResult] = asyncio.run(run_bench(config))
    after = server.model_stats(model).get("scheduler", {})
    calls = int(after.get("model_calls", 0)) - int(before.get("model_calls", 0))
    answered = int(after.get("succeeded", 0)) - int(before.get("succeeded", 0))
    out = results[0].to_dict()
    out["mean_batch"] = answered / calls if calls else None
    out["batch_size_cap_end"] = after.get("batch_size_cap")
    return out


def _geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(max(v, 1e-9)) for v in values))


def run(args: argparse.Namespace) -> dict[str, Any]:
    levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-batching-") as tmp:
        root = Path(tmp)
        print("exporting MiniLM to ONNX ...", file=sys.stderr)
        export_minilm_onnx(root / "minilm" / "1" / "model.onnx")
        payload = write_payload(root / "payload.json")
        entries = [
            {
                "name": model_name(config, threads),
                "path": "minilm",
                "isolation": "process",
                "preload": True,
                "intra_op_threads": threads,
                "max_queue_size": 1024,
                **settings,
            }
            for threads in THREADS
            for config, settings in CONFIGS.items()
        ]
        cfg = _server.write_config(root, entries)
        with _server.Server(cfg, root / "server.log") as server:
            print(f"server pid {server.pid} on {server.url}", file=sys.stderr)
            tuning: dict[int, list[float]] = {t: [] for t in THREADS}
            for concurrency in (1, max(levels)):
                for config in CONFIGS:
                    for threads in THREADS:
                        r = phase(
                            server,
                            model_name(config, threads),
                            payload,
                            concurrency,
                            args.tune_s,
                            1.0,
                        )
                        tuning[threads].append(r["qps"])
            scores = {t: _geomean(q) for t, q in tuning.items()}
            threads = max(scores, key=lambda t: scores[t])
            print(f"tuning qps geomean by intra_op_threads: {scores} -> {threads}", file=sys.stderr)
            runs: dict[str, dict[int, list[dict[str, Any]]]] = {
                c: {level: [] for level in levels} for c in CONFIGS
            }
            names = list(CONFIGS)
            for rep in range(args.repeats):
                for level in levels:
                    shift = rep % len(names)
                    for config in names[shift:] + names[:shift]:
                        r = phase(
                            server,
                            model_name(config, threads),
                            payload,
                            level,
                            args.duration_s,
                            args.warmup_s,
                        )
                        runs[config][level].append(r)
                        print(
                            f"  rep {rep + 1} c={level} {config}: {r['qps']:.1f} rps, "
                            f"p99 {r['p99_ms']} ms, batch {r['mean_batch']}",
                            file=sys.stderr,
                        )
    return {
        "threads": threads,
        "tuning": {str(k): v for k, v in tuning.items()},
        "tuning_geomean_qps": {str(k): v for k, v in scores.items()},
        "runs": runs,
    }


def summarise(runs: dict[str, dict[int, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    rows = []
    for config, by_level in runs.items():
        for level, reps in by_level.items():
            base = runs["a-off"][level]
            qps_ratios = [r["qps"] / b["qps"] for r, b in zip(reps, base, strict=True)]
            p99_ratios = [
                r["p99_ms"] / b["p99_ms"]
                for r, b in zip(reps, base, strict=True)
                if r["p99_ms"] and b["p99_ms"]
            ]
            batches = [r["mean_batch"] for r in reps if r["mean_batch"] is not None]
            rows.append(
                {
                    "config": config,
                    "concurrency": level,
                    "qps": statistics.median(r["qps"] for r in reps),
                    "p50_ms": statistics.median(r["p50_ms"] for r in reps if r["p50_ms"]),
                    "p99_ms": statistics.median(r["p99_ms"] for r in reps if r["p99_ms"]),
                    "errors": sum(sum(r["errors"].values()) for r in reps),
                    "mean_batch": statistics.median(batches) if batches else None,
                    "qps_vs_off": statistics.median(qps_ratios),
                    "p99_vs_off": statistics.median(p99_ratios) if p99_ratios else None,
                    "client_cpu_fraction": statistics.median(
                        r["client_cpu_fraction"] for r in reps
                    ),
                }
            )
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    header = [
        "config",
        "concurrency",
        "req/s",
        "p50 (ms)",
        "p99 (ms)",
        "mean batch",
        "req/s vs (a)",
        "p99 vs (a)",
        "errors",
    ]
    ordered = sorted(rows, key=lambda r: (r["concurrency"], r["config"]))
    return _server.markdown_table(
        header,
        [
            [
                r["config"],
                r["concurrency"],
                f"{r['qps']:.1f}",
                f"{r['p50_ms']:.1f}",
                f"{r['p99_ms']:.1f}",
                "-" if r["mean_batch"] is None else f"{r['mean_batch']:.1f}",
                f"{r['qps_vs_off']:.2f}x",
                "-" if r["p99_vs_off"] is None else f"{r['p99_vs_off']:.2f}x",
                r["errors"],
            ]
            for r in ordered
        ],
    )


def main() -> None:
    parser = _server.arg_parser(__doc__)
    _server.add_load_point_arguments(
        parser, concurrency="1,8,32", duration_s=6.0, warmup_s=2.0, quick=(2.0, 1.0)
    )
    parser.add_argument("--tune-s", type=float, default=3.0, help="s per tuning point")
    args = parser.parse_args()
    _server.quick_load_points(args)
    if args.quick:
        args.tune_s = 1.5
    _server.install_uvloop()
    env = _server.environment()
    started = time.time()
    result = run(args)
    rows = summarise(result["runs"])
    print(
        f"\nintra_op_threads={result['threads']} (tuning geomean req/s: "
        f"{result['tuning_geomean_qps']}); {SEQ_TOKENS} tokens, batch 1 per request; "
        f"medians of {args.repeats} x {args.duration_s:g} s; {env}\n"
    )
    print(report(rows))
    path = _server.write_results(
        "bench_batching",
        {
            "args": vars(args),
            "environment": env,
            "elapsed_s": round(time.time() - started, 1),
            "intra_op_threads": result["threads"],
            "tuning_qps": result["tuning"],
            "tuning_geomean_qps": result["tuning_geomean_qps"],
            "summary": rows,
            "runs": {c: {str(k): v for k, v in lv.items()} for c, lv in result["runs"].items()},
        },
    )
    print(f"\nwrote {path.relative_to(_server.REPO_ROOT)}")


if __name__ == "__main__":
    main()
