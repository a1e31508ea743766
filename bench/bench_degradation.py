"""Graceful degradation under bursts: goodput and p99 per priority, degradation on vs off.

Run from the repository root::

    .venv/bin/python bench/bench_degradation.py            # 10 s per point
    .venv/bin/python bench/bench_degradation.py --quick    # 4 s per point

One ``modelyard serve`` subprocess serves a model of fixed capacity (a Python model that
sleeps 40 ms per call, no batching: CPU contention does not move its capacity) twice:

* **off**: ``early_rejection: false``, no objectives, no fallback: requests wait in the
  queue until answered, refused when it is full (429) or timed out at their deadline (504);
* **on**: ``early_rejection: true``, ``latency_slo_by_priority_s: {1: 0.5, 5: 1.0}`` and
  ``fallback: [doubling]`` (a cheap model of the same tensors).

Both have ``timeout_s: 2`` (each request's deadline). The capacity of one model is measured
first (sequential calls to *off*); then, for 1x, 2x and 4x that rate, an open-loop
generator (:mod:`modelyard.bench.openloop`) sends requests on a fixed schedule, a tenth
of them priority 1 and the rest priority 5, to *off* and to *on* back to back (order
rotated per load). Reported per point: **goodput** (answers with 200 within their deadline,
per second), the share of requests answered with 200, p99 latency of the 200 answers
per priority, how many came from the fallback, and the failures that took longer than
their deadline.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import _server
import aiohttp

from modelyard.bench.openloop import Answer, Post, Shot, open_loop, percentile

PACE_S = 0.04
DEADLINE_S = 2.0
HIGH, LOW = 1, 5
LOADS = (1.0, 2.0, 4.0)

MODELS_PY = f'''
"""Bench models: a paced one of fixed capacity and a cheap fallback of the same tensors."""
import time

import numpy as np

from modelyard.runtimes.base import TensorSpec


class PacedModel:
    inputs = [TensorSpec("x", "FP32", (-1, 1))]
    outputs = [TensorSpec("y", "FP32", (-1, 1))]

    def load(self, version_dir):
        pass

    def predict(self, inputs):
        time.sleep({PACE_S})
        return {{"y": (inputs["x"] + 1).astype(np.float32)}}


class DoublingModel(PacedModel):
    def predict(self, inputs):
        return {{"y": (inputs["x"] * 2).astype(np.float32)}}
'''


def write_repository(root: Path) -> Path:
    """The two model folders and the server YAML; return the YAML's path."""
    for name in ("paced", "doubling"):
        folder = root / name / "1"
        folder.mkdir(parents=True)
        (folder / f"{name}_bench_model.py").write_text(MODELS_PY, encoding="utf-8")

    def model(name: str, folder: str, cls: str, **fields: Any) -> dict[str, Any]:
        return {
            "name": name,
            "path": folder,
            "runtime": "python",
            "class": f"{folder}_bench_model:{cls}",
            "preload": True,
            "timeout_s": DEADLINE_S,
            **fields,
        }

    models = [
        model("off", "paced", "PacedModel", max_batch_size=0, early_rejection=False),
        model(
            "on",
            "paced",
            "PacedModel",
            max_batch_size=0,
            early_rejection=True,
            latency_slo_by_priority_s={HIGH: 0.5, LOW: 1.0},
            fallback=["doubling"],
        ),
        model("doubling", "doubling", "DoublingModel"),
    ]
    return _server.write_config(root, models)


def requests_for(model: str) -> Any:
    def request(i: int) -> tuple[str, dict[str, Any], int, float]:
        priority = HIGH if i % 10 == 0 else LOW
        body = {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [float(i)]}],
            "parameters": {"priority": priority},
        }
        return f"/v2/models/{model}/infer", body, priority, DEADLINE_S

    return request


def summarise(shots: list[Shot], duration_s: float) -> dict[str, Any]:
    """The figures of one point."""

    def p99(priority: int) -> float | None:
        return percentile([s.latency_s for s in shots if s.priority == priority and s.is_ok], 0.99)

    failed = [s for s in shots if not s.is_ok]
    return {
        "sent": len(shots),
        "goodput_per_s": sum(1 for s in shots if s.is_good) / duration_s,
        "ok_share": sum(1 for s in shots if s.is_ok) / len(shots),
        "p99_high_s": p99(HIGH),
        "p99_low_s": p99(LOW),
        "fallbacks": sum(1 for s in shots if s.is_ok and s.served_by is not None),
        "failed": len(failed),
        "failed_past_deadline": sum(1 for s in failed if s.latency_s > s.deadline_s),
        "statuses": sorted({s.status for s in shots}),
    }


def poster(session: aiohttp.ClientSession, url: str) -> Post:
    """An open-loop ``post`` over one aiohttp session (faster than httpx at this rate)."""

    async def post(path: str, body: dict[str, Any]) -> Answer:
        try:
            async with session.post(url + path, json=body) as response:
                doc = await response.json(content_type=None)
                served_by = response.headers.get("x-modelyard-served-by")
                return response.status, doc if isinstance(doc, dict) else None, served_by
        except aiohttp.ClientError:
            return 0, None, None

    return post


async def measure_capacity(post: Post) -> float:
    """Requests per second of one model called one at a time (closed loop)."""
    request = requests_for("off")
    times = []
    for i in range(30):
        path, body, _, _ = request(i + 1)
        sent = time.perf_counter()
        status, _, _ = await post(path, body)
        if status != 200:
            raise SystemExit(f"warm-up request answered {status}")
        times.append(time.perf_counter() - sent)
    return 1.0 / statistics.median(times[5:])


async def run(url: str, duration_s: float) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        post = poster(session, url)
        capacity = await measure_capacity(post)
        points: list[dict[str, Any]] = []
        for n, load in enumerate(LOADS):
            order = ("off", "on") if n % 2 == 0 else ("on", "off")
            for variant in order:
                shots = await open_loop(
                    post, requests_for(variant), rate_per_s=load * capacity, duration_s=duration_s
                )
                points.append({"load": load, "variant": variant, **summarise(shots, duration_s)})
                await asyncio.sleep(DEADLINE_S)  # let the queue drain between points
    return {"capacity_per_s": capacity, "points": points}


def table(result: dict[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f}"

    lines = [
        f"capacity of one model (sequential): {result['capacity_per_s']:.1f} req/s",
        "",
        "| load | degradation | sent | goodput /s | answered 200 | p99 prio 1 (ms) "
        "| p99 prio 5 (ms) | by fallback | failed | failed past deadline |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in sorted(result["points"], key=lambda p: (p["load"], p["variant"] == "on")):
        lines.append(
            f"| {p['load']:.0f}x | {p['variant']} | {p['sent']} | {p['goodput_per_s']:.1f} "
            f"| {p['ok_share']:.1%} | {ms(p['p99_high_s'])} | {ms(p['p99_low_s'])} "
            f"| {p['fallbacks']} | {p['failed']} | {p['failed_past_deadline']} |"
        )
    return "\n".join(lines)


def main() -> None:
    args = _server.arg_parser(__doc__)
    args.add_argument("--quick", action="store_true", help="4 s per point instead of 10")
    opts = args.parse_args()
    duration_s = 4.0 if opts.quick else 10.0
    _server.install_uvloop()
    with tempfile.TemporaryDirectory(prefix="modelyard-degrade-") as tmp:
        root = Path(tmp)
        config = write_repository(root)
        with _server.Server(config, root / "server.log") as server:
            result = asyncio.run(run(server.url, duration_s))
    result["duration_s"] = duration_s
    result["environment"] = _server.environment()
    path = _server.write_results("degradation", result)
    print(table(result))
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
