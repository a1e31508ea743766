"""Event-loop CPU per request, this tree against another checkout, interleaved.

Run from the repository root::

    .venv/bin/python bench/bench_learning_ab.py --baseline-src ../base/src
    .venv/bin/python bench/bench_learning_ab.py --baseline-src ../base/src --rounds 6

Each round starts one child process per tree (``PYTHONPATH`` set to that tree's
``src``), in ABBA order across rounds so drift on a loaded machine falls on both. A child
serves the identity model (FP32 [1, 4], ``isolation: process``) as
``bench_feature_cost.py`` does, with every feature on, and hands requests to the HTTP
route's ``InferHandler`` from ``--concurrency`` closed-loop clients (no HTTP), measuring
the event-loop thread's CPU per request over ``--phases`` phases of ``--calls`` requests.
Reported: per tree the median over every phase, and the ratio of this tree's median to
the baseline's, paired by round (median of the per-round ratios).

With ``--digits`` the model is a realistic one instead: the scikit-learn digits
classifiers of the benchmarks' standard workload (``build_digits_workload``, exported to
ONNX, process isolation), the requests one 64-pixel row each, spread over the five.

Written for decision 0034 (cache learning off the request path); it compares any two
trees, the checkout under test being the one holding this script.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
HERE_SRC = BENCH.parent / "src"


async def _digits_requests(
    handler: Any, bodies: dict[str, bytes], calls: int, concurrency: int
) -> None:
    """``calls`` requests from ``concurrency`` closed-loop clients, each client on one of
    the digits models in turn."""
    names = sorted(bodies)

    async def client(k: int, n: int) -> None:
        name = names[k % len(names)]
        for _ in range(n):
            await handler.infer_body(name, None, bodies[name], None, None, None)

    await asyncio.gather(*(client(k, calls // concurrency) for k in range(concurrency)))


async def _digits_bodies(app: Any) -> dict[str, bytes]:
    """One request body per digits model: one row of the first digit image."""
    from sklearn.datasets import load_digits

    row = [float(v) for v in load_digits().data[0]]
    bodies = {}
    for name in app.dataplane.repository_index():
        meta = await app.dataplane.model_metadata_loaded(name["name"], None)
        spec = meta.inputs[0]
        doc = {"inputs": [{"name": spec.name, "shape": [1, 64], "datatype": spec.datatype}]}
        doc["inputs"][0]["data"] = row
        bodies[name["name"]] = json.dumps(doc).encode()
    return bodies


async def _child(calls: int, phases: int, concurrency: int, digits: bool) -> dict[str, object]:
    import _server
    from profile_hot_path import BODY, _config, _model, _requests

    from modelyard.app import App
    from modelyard.config.settings import load_settings
    from modelyard.examples.repository import build_digits_workload
    from modelyard.frontends.http.fastpath import InferHandler

    _ = _server  # the bench's helpers (imported for their side effects on sys.path)
    with tempfile.TemporaryDirectory(prefix="bench-learning-ab-") as tmp:
        root = Path(tmp)
        if digits:
            config = build_digits_workload(root)
        else:
            entry, _body = _model(root, "process", minilm=False)
            config = _config(root, entry)
        settings = load_settings(config, host="127.0.0.1", http_port=0, grpc_port=None)
        app = App(settings)
        await app.start()
        try:
            handler = InferHandler(app.dataplane, 1 << 20)
            n = calls - calls % concurrency
            if digits:
                bodies = await _digits_bodies(app)

                async def run(count: int) -> None:
                    await _digits_requests(handler, bodies, count, concurrency)
            else:

                async def run(count: int) -> None:
                    await _requests(handler, BODY, count, concurrency)

            await run(1000 - 1000 % concurrency)
            learning = getattr(app.manager, "learning", None)
            before = (learning.batches, learning.learnt) if learning is not None else (0, 0)
            samples = []
            for _ in range(phases):
                cpu0 = time.thread_time()
                await run(n)
                samples.append((time.thread_time() - cpu0) / n * 1e6)
            out: dict[str, object] = {"us_per_request": samples}
            if learning is not None:
                batches = learning.batches - before[0]
                out["events_per_batch"] = (learning.learnt - before[1]) / max(batches, 1)
            return out
        finally:
            await app.stop()


def _run_child(src: Path, args: argparse.Namespace) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{BENCH}")
    command = [sys.executable, __file__, "--child", "--calls", str(args.calls)]
    command += ["--phases", str(args.phases), "--concurrency", str(args.concurrency)]
    if args.digits:
        command.append("--digits")
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the child on {src} failed:\n{done.stderr[-3000:]}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-src", type=Path, help="the other checkout's src folder")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--phases", type=int, default=3)
    parser.add_argument("--calls", type=int, default=3000, help="requests per phase")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument(
        "--digits", action="store_true", help="the five digits classifiers, not identity"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        result = asyncio.run(_child(args.calls, args.phases, args.concurrency, args.digits))
        print(json.dumps(result))
        return
    if args.baseline_src is None:
        parser.error("--baseline-src is required")
    trees = {"baseline": args.baseline_src.resolve(), "this tree": HERE_SRC}
    medians: dict[str, list[float]] = {name: [] for name in trees}
    lows: dict[str, list[float]] = {name: [] for name in trees}
    batch_sizes: list[float] = []
    for rnd in range(args.rounds):
        order = list(trees) if rnd % 2 == 0 else list(reversed(trees))
        for name in order:
            result = _run_child(trees[name], args)
            us = result["us_per_request"]
            assert isinstance(us, list)
            medians[name].append(statistics.median(us))
            lows[name].append(min(us))
            if name == "this tree" and isinstance(result.get("events_per_batch"), float):
                batch_sizes.append(float(result["events_per_batch"]))  # type: ignore[arg-type]
        print(
            f"round {rnd + 1}: "
            + ", ".join(f"{n} {medians[n][-1]:.1f} µs" for n in trees)
            + f", ratio {medians['this tree'][-1] / medians['baseline'][-1]:.3f}",
            file=sys.stderr,
            flush=True,
        )
    ratios = [a / b for a, b in zip(medians["this tree"], medians["baseline"], strict=True)]
    model = "digits (5 models)" if args.digits else "identity"
    print(
        f"\n{model}, c={args.concurrency}, {args.rounds} rounds x {args.phases} phases x "
        f"{args.calls}"
    )
    for name in trees:
        median = statistics.median(medians[name])
        print(f"{name}: median event-loop CPU per request {median:.1f} µs")
    print(f"this tree / baseline, paired by round: median {statistics.median(ratios):.3f}")
    # On a loaded machine other processes only add to a phase's CPU time (contended
    # caches and cores): the least phase of each tree is the figure least disturbed.
    low = {name: min(lows[name]) for name in trees}
    print(
        f"least phase: baseline {low['baseline']:.1f} µs, this tree {low['this tree']:.1f} µs, "
        f"ratio {low['this tree'] / low['baseline']:.3f}"
    )
    print(f"  per round: {', '.join(f'{r:.3f}' for r in ratios)}")
    if batch_sizes:
        per_batch = statistics.median(batch_sizes)
        print(f"  request events learnt per batch (this tree): {per_batch:.1f}")


if __name__ == "__main__":
    main()
