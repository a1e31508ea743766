"""Where one infer request's server CPU goes, without HTTP: cProfile of the hot path.

Run from the repository root::

    .venv/bin/python bench/profile_hot_path.py                  # both isolations
    .venv/bin/python bench/profile_hot_path.py --isolation process --calls 3000
    .venv/bin/python bench/profile_hot_path.py --isolation process --minilm --concurrency 16

``--minilm`` serves MiniLM as ``bench_replicas.py`` does (one replica pinned to ``cpu:0``,
batches of up to 8; ``--concurrency`` clients keep a queue, as under load).

No py-spy or perf needed. The server's ``App`` runs in this process on the identity model
(FP32 [1, 4]); the request body is decoded, run and encoded by the same
:class:`~modelyard.frontends.http.fastpath.InferHandler` the HTTP route calls, one request
at a time, in a loop. Printed per isolation:

* the event-loop thread's CPU and wall time per request without a profiler (HTTP
  parsing and the socket write are not in it: ``bench/bench_overhead.py`` has those),
  and, with process isolation, the worker's CPU per request;
* with cProfile on: the Python function calls per request (a count, so the same on a
  quiet or a busy machine: the A/B figure least disturbed by other load), self time per
  request grouped by module (``--top`` rows), and the functions with the most self time.
  cProfile adds a fixed cost to every Python call: read shares, not absolute times.
  Blocking calls that wake another process (the channel's ``send``) include the time the
  woken process runs on a busy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _server
import psutil
import yaml

from modelyard.app import App
from modelyard.config.settings import load_settings
from modelyard.examples.mlp import build_identity_onnx
from modelyard.frontends.http.fastpath import InferHandler

BODY = json.dumps(
    {
        "inputs": [
            {
                "name": "input",
                "shape": [1, 4],
                "datatype": "FP32",
                "data": [0.1234, 0.5678, 0.9012, 0.3456],
            }
        ]
    }
).encode()


def _group(stats: pstats.Stats, calls: int, top: int) -> None:
    by_module: collections.Counter[str] = collections.Counter()
    by_function: collections.Counter[str] = collections.Counter()
    for (path, _line, name), row in stats.stats.items():  # type: ignore[attr-defined]
        self_s = row[2]
        module = path.split("site-packages/")[-1].split("src/")[-1]
        if "modelyard/" not in module:
            module = module.split("/")[0] if "/" in module else name
        by_module[module] += self_s
        by_function[f"{module}:{name}" if module != name else name] += self_s
    for title, counter in (("module", by_module), ("function", by_function)):
        print(f"\nself time per request by {title} (µs, under cProfile):")
        for key, seconds in counter.most_common(top):
            print(f"  {seconds / calls * 1e6:8.1f}  {key}")


def _model(root: Path, isolation: str, minilm: bool) -> tuple[dict[str, Any], bytes]:
    """The model entry and request body: the identity model, or MiniLM as
    ``bench_replicas`` serves it (one replica on ``cpu:0``, batches of up to 8)."""
    if not minilm:
        build_identity_onnx(root / "identity" / "1" / "model.onnx")
        return {"name": "m", "path": "identity", "isolation": isolation, "preload": True}, BODY
    from bench_batching import write_payload

    from modelyard.examples.minilm import export_minilm_onnx

    print("exporting MiniLM to ONNX ...", file=sys.stderr)
    export_minilm_onnx(root / "minilm" / "1" / "model.onnx")
    entry = {"name": "m", "path": "minilm", "isolation": isolation, "preload": True}
    entry |= {"max_batch_size": 8, "max_queue_size": 1024, "memory_mb": 300}
    entry["devices"] = ["cpu:0"]
    return entry, write_payload(root / "payload.json").read_bytes()


def _config(root: Path, entry: dict[str, Any]) -> Path:
    path = _server.write_config(root, [entry])
    if entry.get("devices") == ["cpu:0"]:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
        config["devices"].append({"name": "cpu:0", "memory_budget_mb": 1024})
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


async def _requests(handler: InferHandler, body: bytes, calls: int, concurrency: int) -> None:
    """``calls`` requests from ``concurrency`` closed-loop clients."""

    async def client(n: int) -> None:
        for _ in range(n):
            await handler.infer_body("m", None, body, None, None, None)

    await asyncio.gather(*(client(calls // concurrency) for _ in range(concurrency)))


async def one(isolation: str, calls: int, top: int, minilm: bool, concurrency: int) -> None:
    calls -= calls % concurrency
    with tempfile.TemporaryDirectory(prefix="profile-hot-path-") as tmp:
        root = Path(tmp)
        entry, body = _model(root, isolation, minilm)
        cfg = _config(root, entry)
        settings = load_settings(cfg, host="127.0.0.1", http_port=0, grpc_port=None)
        app = App(settings)
        await app.start()
        try:
            handler = InferHandler(app.dataplane, 1 << 20)
            await _requests(handler, body, 500 - 500 % concurrency, concurrency)
            workers = psutil.Process().children(recursive=True)
            cpu0 = time.thread_time()
            wall0 = time.perf_counter()
            kids0 = sum(sum(w.cpu_times()[:2]) for w in workers)
            await _requests(handler, body, calls, concurrency)
            cpu = (time.thread_time() - cpu0) / calls * 1e6
            wall = (time.perf_counter() - wall0) / calls * 1e6
            kids = (sum(sum(w.cpu_times()[:2]) for w in workers) - kids0) / calls * 1e6
            model = "MiniLM" if minilm else "identity"
            print(f"\n== {model}, isolation: {isolation}; {calls} requests, {concurrency} at once")
            print(
                f"event-loop thread: {cpu:.0f} µs CPU, {wall:.0f} µs wall per request; "
                f"other processes of the server (workers): {kids:.0f} µs CPU per request"
            )
            profile = cProfile.Profile()
            profile.enable()
            await _requests(handler, body, calls, concurrency)
            profile.disable()
            stats = pstats.Stats(profile)
            # Deterministic, unlike any time on a shared machine: the A/B figure to trust.
            python_calls = sum(row[1] for row in stats.stats.values())  # type: ignore[attr-defined]
            print(f"Python function calls per request: {python_calls / calls:.1f}")
            _group(stats, calls, top)
        finally:
            await app.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--isolation", choices=("process", "inline", "both"), default="both")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--minilm",
        action="store_true",
        help="MiniLM (batches of up to 8 on cpu:0, needs the torch extra) instead of identity",
    )
    parser.add_argument("--concurrency", type=int, default=1, help="requests at once (1)")
    args = parser.parse_args()
    _server.install_uvloop()
    isolations = ("process", "inline") if args.isolation == "both" else (args.isolation,)
    for isolation in isolations:
        asyncio.run(one(isolation, args.calls, args.top, args.minilm, args.concurrency))
    print(f"\nload average {psutil.getloadavg()}", file=sys.stderr)


if __name__ == "__main__":
    main()
