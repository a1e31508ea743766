"""Cold start: how long a model takes from "load it" to "it answered", vs bare ONNX Runtime.

Run from the repository root::

    .venv/bin/python bench/bench_cold_start.py            # 1, 50, 200 MB MLPs, 7 repeats
    .venv/bin/python bench/bench_cold_start.py --quick    # 1 and 50 MB, 3 repeats

For ONNX MLPs of each size (random weights, built into a temporary folder at run time) and
a tiny identity model, two ``modelyard serve`` subprocesses with ``isolation: process``,
one with a spare worker (``spare_workers: 1``: a load claims an idle worker started
ahead; the script waits until one is idle before each of its loads, outside the timed
span) and one without (``spare_workers: 0``: a load forks its worker):

* **load API**: wall time of ``POST /v2/repository/models/{m}/load`` seen by the client
  (the server answers once the worker has loaded and warmed the model: one inference),
  then the split ``/v2/stats`` gives under ``last_load`` (queue wait, process start,
  runtime load, warm-up; what ``total_s`` holds beyond those is shown as "other");
* **first infer**: wall time of the first ``/infer`` to the model while it is unloaded
  (load + warm-up + the request);
* **bare ORT**: a fresh ``python`` subprocess per repeat that imports onnxruntime, then
  times ``InferenceSession(...)`` (the same session options modelyard uses) plus one
  ``run``; interpreter start and imports are outside the timed span (a modelyard worker
  is forked with them already imported).

The model is unloaded between repeats. Every variant runs once unmeasured first so the
page cache is warm for all alike; repeats interleave the variants, so machine noise hits
them alike. Reported: medians over repeats and the ratios spare / bare and fork / bare.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _server
import yaml

from modelyard.examples.mlp import MIB, build_identity_onnx, build_mlp_onnx

TARGET_SMALL_MS = 50.0
"""Target: cold start of a small model, load API, median."""
TARGET_RATIO = 1.2
"""Target: modelyard load / bare ORT session + one inference, median."""
TARGET_TINY_RATIO = 2.0
"""Target (issue 18): the tiny identity model's switch with a spare / bare ORT, median."""

_PARTS = ("queue_wait_s", "process_start_s", "runtime_load_s", "warmup_s")

# Runs in a fresh interpreter per repeat; prints one JSON line of seconds.
_BARE_SCRIPT = """
import json, sys, time
import numpy as np
import onnxruntime as ort
path = sys.argv[1]
t0 = time.perf_counter()
opts = ort.SessionOptions()
opts.intra_op_num_threads = 1
opts.inter_op_num_threads = 1
opts.log_severity_level = 3
session = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
t1 = time.perf_counter()
arg = session.get_inputs()[0]
x = np.zeros([1] + [d if isinstance(d, int) else 1 for d in arg.shape[1:]], dtype=np.float32)
session.run(None, {arg.name: x})
t2 = time.perf_counter()
print(json.dumps({"session_s": t1 - t0, "infer_s": t2 - t1, "total_s": t2 - t0}))
"""


def build_models(root: Path, sizes_mb: list[float]) -> dict[str, Path]:
    """``name -> model.onnx`` for the identity model and one MLP per size."""
    models = {"identity": build_identity_onnx(root / "identity" / "1" / "model.onnx")}
    for size in sizes_mb:
        name = f"mlp-{size:g}mb"
        models[name] = build_mlp_onnx(root / name / "1" / "model.onnx", size)
    return models


def bare_once(path: Path) -> dict[str, float]:
    """One fresh-process bare ORT cold start; adds ``process_s`` (spawn to exit)."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _BARE_SCRIPT, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    process_s = time.perf_counter() - t0
    out: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    out["process_s"] = process_s
    return out


WORKER_DETAILS: dict[str, Any] = {}
"""``server/model`` → the worker details ``/v2/stats`` showed after its last load."""

SERVERS = ["spare", "fork"]
"""``spare``: ``spare_workers: 1`` (a load claims an idle, pre-started worker);
``fork``: ``spare_workers: 0`` (a load forks its worker from the fork server);
with ``--baseline-src DIR``, ``base``: ``spare_workers: 1`` on the sources in ``DIR``."""
SPARED = ("spare", "base")
SPARE_WAIT_S = 10.0


SPARE_SETTLE_S = 0.35
"""A new spare gets its ``Warm`` once no request waits for a first answer (0.25 s after
it was ready until session 7; ``workers/spares.py``): a switch measured with a spare
waits this long after one appears, as a spare that has idled for a while would have."""


def wait_for_spare(server: _server.Server) -> None:
    """Until the server has an idle spare worker that has had time to warm (outside any
    timed span)."""
    give_up = time.monotonic() + SPARE_WAIT_S
    while not server.client.get("/v2/health/details").json().get("spare_workers"):
        if time.monotonic() > give_up:
            raise RuntimeError("no spare worker appeared")
        time.sleep(0.005)
    time.sleep(SPARE_SETTLE_S)


def load_once(server: _server.Server, name: str, label: str) -> dict[str, float]:
    """Load via the repository API, read the split, unload; seconds."""
    t0 = time.perf_counter()
    server.post(f"/v2/repository/models/{name}/load")
    wall_s = time.perf_counter() - t0
    stats = server.model_stats(name)
    last = stats["last_load"]
    worker = stats.get("worker", {})
    WORKER_DETAILS[f"{label}/{name}"] = worker
    t1 = time.perf_counter()
    server.post(f"/v2/repository/models/{name}/unload")
    unload_s = time.perf_counter() - t1
    parts = {key: float(last[key]) for key in _PARTS}
    total = float(last["total_s"])
    return {
        "wall_s": wall_s,
        "server_total_s": total,
        **parts,
        "other_s": total - sum(parts.values()),
        "unload_s": unload_s,
        "from_spare": 1.0 if worker.get("from_spare") else 0.0,
    }


def first_infer_once(server: _server.Server, name: str, body: dict[str, Any]) -> dict[str, float]:
    """The first request to an unloaded model, then unload; seconds."""
    t0 = time.perf_counter()
    response = server.client.post(f"/v2/models/{name}/infer", json=body)
    wall_s = time.perf_counter() - t0
    if response.status_code != 200:
        raise RuntimeError(f"infer {name}: {response.status_code} {response.text[:300]}")
    server.post(f"/v2/repository/models/{name}/unload")
    return {"wall_s": wall_s}


def _infer_body(name: str) -> dict[str, Any]:
    width = 4 if name == "identity" else 64
    return {
        "inputs": [
            {"name": "input", "shape": [1, width], "datatype": "FP32", "data": [0.5] * width}
        ]
    }


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def _sources_first(src: str) -> dict[str, str]:
    """This environment with the modelyard sources in ``src`` first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def _write_config(root: Path, entries: list[dict[str, Any]], label: str, budget_mb: float) -> Path:
    path = _server.write_config(root, entries, name=f"{label}.yaml", budget_mb=budget_mb)
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["spare_workers"] = 1 if label in SPARED else 0
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _variants(
    servers: dict[str, _server.Server], name: str, path: Path
) -> list[tuple[str, Callable[[], dict[str, float]]]]:
    def load(label: str) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            if label in SPARED:
                wait_for_spare(servers[label])
            return load_once(servers[label], name, label)

        return run

    def first(label: str) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            if label in SPARED:
                wait_for_spare(servers[label])
            return first_infer_once(servers[label], name, _infer_body(name))

        return run

    return [
        *[(f"{label}_load", load(label)) for label in SERVERS],
        *[(f"{label}_first_infer", first(label)) for label in SERVERS],
        ("bare", lambda: bare_once(path)),
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [float(s) for s in args.sizes_mb.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-cold-start-") as tmp:
        root = Path(tmp)
        print(f"building models {sizes} MB ...", file=sys.stderr)
        models = build_models(root, sizes)
        file_mib = {name: path.stat().st_size / MIB for name, path in models.items()}
        entries = [
            {"name": name, "path": name, "isolation": "process", "preload": False}
            for name in models
        ]
        raw: dict[str, dict[str, list[dict[str, float]]]] = {name: {} for name in models}
        with contextlib.ExitStack() as stack:
            servers = {
                label: stack.enter_context(
                    _server.Server(
                        _write_config(root, entries, label, args.budget_mb),
                        root / f"{label}.log",
                        env=_sources_first(args.baseline_src) if label == "base" else None,
                    )
                )
                for label in SERVERS
            }
            for label, server in servers.items():
                print(f"{label} server pid {server.pid} on {server.url}", file=sys.stderr)
            # Warm the page cache (and the fork servers) for every variant, unmeasured.
            for name, path in models.items():
                for _, fn in _variants(servers, name, path):
                    fn()
            for rep in range(args.repeats):
                for name, path in models.items():
                    variants = _variants(servers, name, path)
                    # Rotate the order each repeat so no variant always runs right after
                    # another one's page-cache or CPU-frequency effects.
                    shift = rep % len(variants)
                    for label, fn in variants[shift:] + variants[:shift]:
                        raw[name].setdefault(label, []).append(fn())
                print(f"  repeat {rep + 1}/{args.repeats} done", file=sys.stderr)
    summary: dict[str, dict[str, float]] = {}
    for name, by_variant in raw.items():
        bare = by_variant["bare"]
        bare_ms = _median(bare, "total_s") * 1e3
        row: dict[str, float] = {
            "file_mib": round(file_mib[name], 2),
            "bare_ms": bare_ms,
            "bare_session_ms": _median(bare, "session_s") * 1e3,
            "bare_infer_ms": _median(bare, "infer_s") * 1e3,
            "bare_process_ms": _median(bare, "process_s") * 1e3,
        }
        for label in SERVERS:
            load = by_variant[f"{label}_load"]
            load_ms = _median(load, "wall_s") * 1e3
            first_ms = _median(by_variant[f"{label}_first_infer"], "wall_s") * 1e3
            row |= {
                f"{label}_load_ms": load_ms,
                f"{label}_first_infer_ms": first_ms,
                f"{label}_ratio_load": load_ms / bare_ms,
                f"{label}_ratio_first_infer": first_ms / bare_ms,
                f"{label}_unload_ms": _median(load, "unload_s") * 1e3,
                f"{label}_from_spare": statistics.fmean(r["from_spare"] for r in load),
                **{
                    f"{label}_{k[:-2]}_ms": _median(load, k) * 1e3
                    for k in (*_PARTS, "other_s", "server_total_s")
                },
            }
        summary[name] = row
    return {"raw": raw, "summary": summary, "worker_details": WORKER_DETAILS}


def report(summary: dict[str, dict[str, float]]) -> str:
    header = [
        "model",
        "file MiB",
        "bare ORT (ms)",
        "load, spare (ms)",
        "load, fork (ms)",
        "spare / bare",
        "fork / bare",
        "first infer, spare / fork (ms)",
        "first infer spare / bare",
    ]
    rows = [
        [
            name,
            f"{s['file_mib']:.1f}",
            f"{s['bare_ms']:.1f}",
            f"{s['spare_load_ms']:.1f}",
            f"{s['fork_load_ms']:.1f}",
            f"{s['spare_ratio_load']:.2f}x",
            f"{s['fork_ratio_load']:.2f}x",
            f"{s['spare_first_infer_ms']:.1f} / {s['fork_first_infer_ms']:.1f}",
            f"{s['spare_ratio_first_infer']:.2f}x",
        ]
        for name, s in summary.items()
    ]
    split_header = [
        "model",
        "server",
        "queue wait",
        "process start",
        "runtime load",
        "warm-up",
        "other",
        "server total",
        "client wall",
        "bare: session / infer",
        "unload",
    ]
    split_rows = [
        [
            name,
            label,
            f"{s[f'{label}_queue_wait_ms']:.1f}",
            f"{s[f'{label}_process_start_ms']:.1f}",
            f"{s[f'{label}_runtime_load_ms']:.1f}",
            f"{s[f'{label}_warmup_ms']:.1f}",
            f"{s[f'{label}_other_ms']:.1f}",
            f"{s[f'{label}_server_total_ms']:.1f}",
            f"{s[f'{label}_load_ms']:.1f}",
            f"{s['bare_session_ms']:.1f} / {s['bare_infer_ms']:.2f}",
            f"{s[f'{label}_unload_ms']:.1f}",
        ]
        for name, s in summary.items()
        for label in SERVERS
    ]
    return (
        _server.markdown_table(header, rows)
        + "\n\nSplit of the load API's time from `/v2/stats` `last_load` (medians, ms):\n\n"
        + _server.markdown_table(split_header, split_rows)
    )


def main() -> None:
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="1 and 50 MB, 3 repeats")
    parser.add_argument("--sizes-mb", default="1,50,200", help="MLP sizes (%(default)s)")
    parser.add_argument("--repeats", type=int, default=7, help="measured repeats (%(default)s)")
    parser.add_argument("--budget-mb", type=float, default=4096, help="server memory budget")
    parser.add_argument(
        "--baseline-src", default=None, help="modelyard sources of a third server (`base`)"
    )
    args = parser.parse_args()
    if args.baseline_src:
        SERVERS.append("base")
    if args.quick:
        args.sizes_mb, args.repeats = "1,50", 3
    env = _server.environment()
    started = time.time()
    result = run(args)
    table = report(result["summary"])
    small = result["summary"][f"mlp-{float(args.sizes_mb.split(',')[0]):g}mb"]
    tiny = result["summary"]["identity"]
    verdict = (
        f"small-model (first MLP) cold start via load API with a spare: "
        f"{small['spare_load_ms']:.1f} ms (target <= {TARGET_SMALL_MS:.0f} ms); tiny-model "
        f"switch with a spare / bare ORT: {tiny['spare_ratio_load']:.2f}x (target <= "
        f"{TARGET_TINY_RATIO}x; without: {tiny['fork_ratio_load']:.2f}x); worst spare "
        f"load/bare ratio: {max(s['spare_ratio_load'] for s in result['summary'].values()):.2f}x"
        f" (target <= {TARGET_RATIO}x for the MLPs)"
    )
    if "base" in SERVERS:
        verdict += "; baseline sources with a spare: " + ", ".join(
            f"{name} {s['base_ratio_load']:.2f}x (this tree {s['spare_ratio_load']:.2f}x)"
            for name, s in result["summary"].items()
        )
    print(f"\nmedians of {args.repeats} repeats; {env}\n")
    print(table)
    print(f"\n{verdict}")
    path = _server.write_results(
        "bench_cold_start",
        {
            "args": vars(args),
            "environment": env,
            "elapsed_s": round(time.time() - started, 1),
            "summary": result["summary"],
            "worker_details": result["worker_details"],
            "raw": result["raw"],
        },
    )
    print(f"\nwrote {path.relative_to(_server.REPO_ROOT)}")


if __name__ == "__main__":
    main()
