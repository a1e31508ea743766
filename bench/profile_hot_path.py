"""Where one infer request's server CPU goes, without HTTP: cProfile of the hot path.

Run from the repository root::

    .venv/bin/python bench/profile_hot_path.py                  # both isolations
    .venv/bin/python bench/profile_hot_path.py --isolation process --calls 3000

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

import _server
import psutil

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


async def one(isolation: str, calls: int, top: int) -> None:
    with tempfile.TemporaryDirectory(prefix="profile-hot-path-") as tmp:
        root = Path(tmp)
        build_identity_onnx(root / "identity" / "1" / "model.onnx")
        entry = {"name": "m", "path": "identity", "isolation": isolation, "preload": True}
        cfg = _server.write_config(root, [entry])
        settings = load_settings(cfg, host="127.0.0.1", http_port=0, grpc_port=None)
        app = App(settings)
        await app.start()
        try:
            handler = InferHandler(app.dataplane, 1 << 20)
            for _ in range(500):
                await handler.infer_body("m", None, BODY, None, None, None)
            workers = psutil.Process().children(recursive=True)
            cpu0 = time.thread_time()
            wall0 = time.perf_counter()
            kids0 = sum(sum(w.cpu_times()[:2]) for w in workers)
            for _ in range(calls):
                await handler.infer_body("m", None, BODY, None, None, None)
            cpu = (time.thread_time() - cpu0) / calls * 1e6
            wall = (time.perf_counter() - wall0) / calls * 1e6
            kids = (sum(sum(w.cpu_times()[:2]) for w in workers) - kids0) / calls * 1e6
            print(f"\n== isolation: {isolation}; {calls} requests")
            print(
                f"event-loop thread: {cpu:.0f} µs CPU, {wall:.0f} µs wall per request; "
                f"other processes of the server (workers): {kids:.0f} µs CPU per request"
            )
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(calls):
                await handler.infer_body("m", None, BODY, None, None, None)
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
    args = parser.parse_args()
    _server.install_uvloop()
    isolations = ("process", "inline") if args.isolation == "both" else (args.isolation,)
    for isolation in isolations:
        asyncio.run(one(isolation, args.calls, args.top))
    print(f"\nload average {psutil.getloadavg()}", file=sys.stderr)


if __name__ == "__main__":
    main()
