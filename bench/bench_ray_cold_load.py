"""Ray mode's cold load with and without spare actors, against a single host's.

Run from the repository root (needs the ``ray`` extra)::

    .venv/bin/python bench/bench_ray_cold_load.py            # 6 cold loads per mode, 2 rounds
    .venv/bin/python bench/bench_ray_cold_load.py --loads 3 --rounds 1

Six small ONNX models (``output = input + k``), none preloaded. Each mode is a fresh
server; its first request to each model is a cold load (the time of that request is
what a client waits), one model after the other with a pause of ``--gap`` seconds
between them (what a spare pool needs to start the next spare). Modes, in an order
reversed each round:

* **single**: ``modelyard serve`` (fork server and a spare worker process);
* **ray-spares**: ``--ray`` with ``ray.spare_actors: 1`` (the default);
* **ray-no-spares**: ``--ray`` with ``ray.spare_actors: 0`` (each load creates its actor).

Against a local Ray cluster this script starts (a head with no CPUs and one node,
loopback only). Reported: the median cold-load request time per mode and its ratio to
single's, same run.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import _server
import yaml
from bench_ray import start_cluster

from modelyard.examples.mlp import build_add_onnx

BODY = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [0, 1, 2, 3]}]}


def write_repository(root: Path, n: int) -> None:
    for k in range(1, n + 1):
        build_add_onnx(root / f"add-{k}" / "1" / "model.onnx", float(k))


def write_config(root: Path, n: int, ray: dict[str, Any] | None) -> Path:
    doc: dict[str, Any] = {
        "model_repository": ".",
        "models": [
            {"name": f"add-{k}", "path": f"add-{k}", "memory_mb": 40, "timeout_s": 60}
            for k in range(1, n + 1)
        ],
    }
    if ray is not None:
        doc["ray"] = ray
    path = root / f"modelyard-{'single' if ray is None else ray['spare_actors']}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def cold_loads(server: _server.Server, n: int, gap_s: float) -> list[float]:
    """The time of the first request to each of the ``n`` models, in seconds."""
    times = []
    time.sleep(gap_s)  # the server's spares start after it is ready
    for k in range(1, n + 1):
        t0 = time.perf_counter()
        r = server.client.post(f"/v2/models/add-{k}/infer", json=BODY)
        times.append(time.perf_counter() - t0)
        if r.status_code != 200:
            raise RuntimeError(f"add-{k}: HTTP {r.status_code}: {r.text}")
        time.sleep(gap_s)
    return times


def main() -> None:
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--loads", type=int, default=6, help="cold loads per mode")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--gap", type=float, default=2.0, help="seconds between loads")
    args = parser.parse_args()
    modes = ["single", "ray-spares", "ray-no-spares"]
    samples: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="bench-ray-cold-") as tmp:
        root = Path(tmp)
        write_repository(root, args.loads)
        configs = {
            "single": write_config(root, args.loads, None),
            "ray-spares": write_config(root, args.loads, {"spare_actors": 1}),
            "ray-no-spares": write_config(root, args.loads, {"spare_actors": 0}),
        }
        cluster = start_cluster()
        try:
            for round_ in range(args.rounds):
                for mode in modes if round_ % 2 == 0 else modes[::-1]:
                    extra = [] if mode == "single" else ["--ray", cluster.address]
                    log = root / f"server-{mode}-{round_}.log"
                    with _server.Server(configs[mode], log, extra_args=extra) as server:
                        got = cold_loads(server, args.loads, args.gap)
                    samples[mode] += got
                    print(mode, [f"{t * 1000:.0f} ms" for t in got], file=sys.stderr)
        finally:
            cluster.shutdown()
    single = statistics.median(samples["single"])
    print(f"{'mode':16} {'median cold load':>18} {'vs single':>10}")
    for mode in modes:
        median = statistics.median(samples[mode])
        print(f"{mode:16} {median * 1000:15.0f} ms {median / single:9.2f}x")


if __name__ == "__main__":
    main()
