"""A good client's latency while one client sends big JSON bodies or gzip bombs (issue 33).

Run from the repository root::

    .venv/bin/python bench/bench_hostile_bodies.py                    # 20 s per phase
    .venv/bin/python bench/bench_hostile_bodies.py --duration 5       # shorter
    .venv/bin/python bench/bench_hostile_bodies.py --baseline-src OTHER_TREE/src

One ``modelyard serve`` subprocess serves the five digits classifiers
(``build_digits_workload``, default limits: ``max_request_mb: 64``). A side-channel
client sends one small ``digits-logreg`` infer request at a time (20 ms apart, a fresh
timer per request) on its own connection, through three phases:

* ``quiet``: nothing else;
* ``big_json``: one client sends, back to back, 8 MB JSON bodies of 10^5 one-element
  inputs (refused with 400: no such inputs; the server must parse them to know);
* ``gzip_bombs``: one client sends, back to back, gzip bodies of about 65 KB that
  inflate to 65 MiB (refused with 413 once the output passes 64 MiB).

Per phase: the side channel's requests, errors (any non-200 or transport error), p50,
p99 and max; the attacker's requests and the statuses it got. With ``--baseline-src``
the same phases run against a server on that tree's sources too (one server at a time).
The attacker runs in a thread of this process; the side channel in the main thread.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import _server
import httpx
import yaml

from modelyard.examples.repository import build_digits_workload

HERE = Path(__file__).resolve().parent.parent / "src"
SIDE_GAP_S = 0.02


def big_json(inputs: int = 100_000) -> bytes:
    """About 8 MB: ``inputs`` one-element FP32 inputs, each padded to ~80 bytes."""
    doc = {
        "inputs": [
            {"name": f"in_{i:06d}_pad", "shape": [1], "datatype": "FP32", "data": [0.123456]}
            for i in range(inputs)
        ]
    }
    return json.dumps(doc).encode()


def gzip_bomb(inflated: int = 65 * 1024 * 1024) -> bytes:
    """A gzip body inflating to ``inflated`` bytes of spaces."""
    return gzip.compress(b" " * inflated, compresslevel=9)


def attack(url: str, body: bytes, headers: dict[str, str], stop: threading.Event) -> Counter[str]:
    """Send ``body`` back to back until ``stop``; count the answers' statuses."""
    seen: Counter[str] = Counter()
    with httpx.Client(base_url=url, timeout=120) as client:
        while not stop.is_set():
            try:
                r = client.post("/v2/models/digits-logreg/infer", content=body, headers=headers)
                seen[str(r.status_code)] += 1
            except httpx.HTTPError as exc:
                seen[type(exc).__name__] += 1
    return seen


def _attack_into(
    result: dict[str, Counter[str]],
    url: str,
    body: bytes,
    headers: dict[str, str],
    stop: threading.Event,
) -> None:
    result["attacker"] = attack(url, body, headers, stop)


def side_channel(url: str, payload: dict[str, Any], duration_s: float) -> dict[str, Any]:
    """Small requests one at a time for ``duration_s``: latency percentiles and errors."""
    times: list[float] = []
    errors = 0
    with httpx.Client(base_url=url, timeout=30) as client:
        end = time.monotonic() + duration_s
        while time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                r = client.post("/v2/models/digits-logreg/infer", json=payload)
                errors += r.status_code != 200
            except httpx.HTTPError:
                errors += 1
            times.append(time.perf_counter() - t0)
            time.sleep(SIDE_GAP_S)
    times.sort()
    return {
        "requests": len(times),
        "errors": errors,
        "p50_ms": statistics.median(times) * 1e3,
        "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))] * 1e3,
        "max_ms": times[-1] * 1e3,
    }


def run_tree(cfg: Path, log: Path, src: Path, duration_s: float) -> dict[str, Any]:
    """The three phases against one server on ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    attacks: dict[str, tuple[bytes, dict[str, str]] | None] = {
        "quiet": None,
        "big_json": (big_json(), {"content-type": "application/json"}),
        "gzip_bombs": (gzip_bomb(), {"content-encoding": "gzip"}),
    }
    out: dict[str, Any] = {}
    with _server.Server(cfg, log, env=env) as server:
        meta = server.client.get("/v2/models/digits-logreg").json()
        spec = meta["inputs"][0]
        width = int(spec["shape"][-1])
        good = {"name": spec["name"], "shape": [1, width], "datatype": "FP32"}
        payload = {"inputs": [{**good, "data": [0.5] * width}]}
        for phase, hostile in attacks.items():
            stop = threading.Event()
            result: dict[str, Counter[str]] = {}
            thread = None
            if hostile is not None:
                body, headers = hostile

                thread = threading.Thread(
                    target=_attack_into, args=(result, server.url, body, headers, stop)
                )
                thread.start()
                time.sleep(0.5)
            side = side_channel(server.url, payload, duration_s)
            stop.set()
            if thread is not None:
                thread.join()
            side["attacker"] = dict(result.get("attacker", {}))
            out[phase] = side
            print(f"  {src.parent.name} {phase}: {side}", file=sys.stderr)
    return out


def main() -> None:
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--duration", type=float, default=20.0, help="s per phase (%(default)s)")
    parser.add_argument("--baseline-src", type=Path, help="another tree's src to compare")
    args = parser.parse_args()
    trees = {"this": HERE}
    if args.baseline_src is not None:
        trees["baseline"] = args.baseline_src.resolve()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
        root = Path(tmp)
        cfg = build_digits_workload(root / "repo")
        doc = yaml.safe_load(cfg.read_text(encoding="utf-8"))
        doc.update(grpc_port=None, log_level="warning")
        cfg.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        for name, src in trees.items():
            results[name] = run_tree(cfg, root / f"{name}.log", src, args.duration)
    rows = []
    for name, phases in results.items():
        for phase, r in phases.items():
            attacker = ", ".join(f"{k}: {v}" for k, v in sorted(r["attacker"].items())) or "-"
            rows.append(
                [
                    name,
                    phase,
                    r["requests"],
                    r["errors"],
                    f"{r['p50_ms']:.1f}",
                    f"{r['p99_ms']:.1f}",
                    f"{r['max_ms']:.0f}",
                    attacker,
                ]
            )
    header = ["tree", "phase", "side requests", "side errors", "p50 (ms)", "p99 (ms)", "max (ms)"]
    print(_server.markdown_table([*header, "attacker's answers"], rows))
    print(f"results: {_server.write_results('hostile_bodies', results)}")


if __name__ == "__main__":
    main()
