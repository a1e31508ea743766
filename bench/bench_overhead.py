"""Server overhead per request: a tiny identity model over REST vs bare ``session.run``.

Run from the repository root::

    .venv/bin/python bench/bench_overhead.py            # 5 repeats of 4 s per mode
    .venv/bin/python bench/bench_overhead.py --quick    # 2 repeats of 2 s per mode

One ``modelyard serve`` subprocess serves the same identity ONNX model (FP32 ``[1, 4]``,
built at run time) twice: ``isolation: process`` (own worker process, shared memory and a
socket round trip) and ``isolation: inline`` (in the server process). Both keep the
defaults otherwise (``max_batch_size: 8``, ``max_queue_delay_s: 0``). ``modelyard.bench``
sends one request at a time (concurrency 1, closed loop, raw HTTP/1.1 keep-alive, JSON).

The baseline is ONNX Runtime's ``session.run`` on the same file and input in this client
process (same session options as the server: one intra-op and one inter-op thread), timed
call by call. Overhead = end-to-end median (or p99) - bare median (or p99): it covers the
client's own HTTP and JSON work, loopback TCP, the server and the worker hop. A fourth mode,
**floor**, sends the same requests with the same client to a minimal HTTP/1.1 server (an
uvloop ``asyncio.Protocol`` in another process that answers every request with a fixed
v2 response body): what any Python server would cost at the least, so modelyard - floor is
the part modelyard itself adds. The modes run back to back per repeat, order rotated; the
medians over repeats are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _server
import numpy as np
import onnxruntime as ort

from modelyard.bench import BenchConfig, run_bench
from modelyard.examples.mlp import build_identity_onnx

TARGET_OVERHEAD_US = 150.0
MODES = ("bare", "floor", "process", "inline")
PAYLOAD = {
    "inputs": [
        {
            "name": "input",
            "shape": [1, 4],
            "datatype": "FP32",
            "data": [0.1234, 0.5678, 0.9012, 0.3456],
        }
    ]
}

# A minimal keep-alive HTTP/1.1 server: the floor any Python server stands on.
_FLOOR_SERVER = """
import asyncio, sys
import uvloop
BODY = (b'{"model_name":"identity","model_version":"1","outputs":[{"name":"output",'
        b'"datatype":"FP32","shape":[1,4],"data":[0.1234,0.5678,0.9012,0.3456]}]}')
RESPONSE = (b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\ncontent-length: "
            + str(len(BODY)).encode() + b"\\r\\n\\r\\n" + BODY)
class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buf = transport, b""
    def data_received(self, data):
        self.buf += data
        while True:
            end = self.buf.find(b"\\r\\n\\r\\n")
            if end < 0:
                return
            length = 0
            for line in self.buf[:end].split(b"\\r\\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length:]
            self.transport.write(RESPONSE)
async def main():
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", int(sys.argv[1]))
    async with server:
        await server.serve_forever()
uvloop.run(main())
"""


def bare_phase(session: ort.InferenceSession, calls: int) -> dict[str, Any]:
    """``calls`` timed ``session.run`` calls (after 200 untimed); µs."""
    x = {"input": np.random.default_rng(0).random((1, 4), dtype=np.float32)}
    for _ in range(200):
        session.run(None, x)
    samples = np.empty(calls, dtype=np.float64)
    clock = time.perf_counter_ns
    for i in range(calls):
        t0 = clock()
        session.run(None, x)
        samples[i] = clock() - t0
    samples /= 1e3
    p50, p99 = np.percentile(samples, [50, 99]).tolist()
    return {"p50_us": p50, "p99_us": p99, "mean_us": float(samples.mean()), "calls": calls}


def server_phase(
    url: str, pid: int, model: str, payload: Path, duration_s: float
) -> dict[str, Any]:
    """One concurrency-1 phase; adds the server's (tree's) CPU per request, warm-up included."""
    config = BenchConfig(
        url=url,
        models=(model,),
        concurrency=(1,),
        duration_s=duration_s,
        warmup_s=0.5,
        payload_files={model: payload},
    )
    cpu0 = _server.tree_cpu_s(pid)
    done0 = time.perf_counter()
    r = asyncio.run(run_bench(config))[0]
    cpu_s = _server.tree_cpu_s(pid) - cpu0
    # The phase's requests, warm-up included, estimated from its rate over the whole span.
    sent = r.qps * (time.perf_counter() - done0)
    return {
        "server_cpu_us_per_request": cpu_s / sent * 1e6 if sent else None,
        "p50_us": r.p50_ms * 1e3 if r.p50_ms is not None else None,
        "p99_us": r.p99_ms * 1e3 if r.p99_ms is not None else None,
        "mean_us": r.mean_ms * 1e3 if r.mean_ms is not None else None,
        "qps": r.qps,
        "requests": r.requests,
        "errors": r.error_count,
        "client_cpu_us_per_request": (r.client_cpu_ms_per_request or 0.0) * 1e3,
    }


@contextlib.contextmanager
def floor_server() -> Iterator[tuple[str, int]]:
    """Run the minimal HTTP server in a subprocess; yield its URL and pid."""
    port = _server.free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _FLOOR_SERVER, str(port)], stdin=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the floor server did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def run(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        root = Path(tmp)
        path = build_identity_onnx(root / "identity" / "1" / "model.onnx")
        entries = [
            {"name": f"identity-{iso}", "path": "identity", "isolation": iso, "preload": True}
            for iso in ("process", "inline")
        ]
        cfg = _server.write_config(root, entries)
        payload = root / "payload.json"
        payload.write_text(json.dumps(PAYLOAD), encoding="utf-8")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        session = ort.InferenceSession(
            str(path), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        with (
            _server.Server(cfg, root / "server.log") as server,
            floor_server() as (floor_url, floor_pid),
        ):
            print(f"server pid {server.pid} on {server.url}; floor on {floor_url}", file=sys.stderr)
            for rep in range(args.repeats):
                shift = rep % len(MODES)
                for mode in MODES[shift:] + MODES[:shift]:
                    if mode == "bare":
                        r = bare_phase(session, args.bare_calls)
                    elif mode == "floor":
                        r = server_phase(floor_url, floor_pid, "identity", payload, args.duration_s)
                    else:
                        r = server_phase(
                            server.url,
                            server.pid,
                            f"identity-{mode}",
                            payload,
                            args.duration_s,
                        )
                    runs[mode].append(r)
                    print(
                        f"  rep {rep + 1} {mode}: p50 {r['p50_us']:.1f} µs, p99 "
                        f"{r['p99_us']:.1f} µs",
                        file=sys.stderr,
                    )
    return runs


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for mode, reps in runs.items():
        row: dict[str, Any] = {
            "p50_us": statistics.median(r["p50_us"] for r in reps),
            "p99_us": statistics.median(r["p99_us"] for r in reps),
        }
        if mode != "bare":
            row["qps"] = statistics.median(r["qps"] for r in reps)
            row["errors"] = sum(r["errors"] for r in reps)
            row["client_cpu_us_per_request"] = statistics.median(
                r["client_cpu_us_per_request"] for r in reps
            )
            row["server_cpu_us_per_request"] = statistics.median(
                r["server_cpu_us_per_request"] for r in reps
            )
            bare, floor = runs["bare"], runs["floor"]
            if mode != "floor":
                row["above_floor_p50_us"] = statistics.median(
                    r["p50_us"] - f["p50_us"] for r, f in zip(reps, floor, strict=True)
                )
            row["overhead_p50_us"] = statistics.median(
                r["p50_us"] - b["p50_us"] for r, b in zip(reps, bare, strict=True)
            )
            row["overhead_p99_us"] = statistics.median(
                r["p99_us"] - b["p99_us"] for r, b in zip(reps, bare, strict=True)
            )
        out[mode] = row
    return out


def report(summary: dict[str, dict[str, Any]]) -> str:
    header = [
        "mode",
        "median (µs)",
        "p99 (µs)",
        "overhead median (µs)",
        "overhead p99 (µs)",
        "req/s",
        "client CPU / request (µs)",
        "server CPU / request (µs)",
        "median above floor (µs)",
    ]
    rows = []
    for mode, s in summary.items():
        if mode == "bare":
            rows.append(
                [
                    "bare ORT session.run (in client)",
                    f"{s['p50_us']:.1f}",
                    f"{s['p99_us']:.1f}",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                ]
            )
        else:
            rows.append(
                [
                    "minimal HTTP server (floor)"
                    if mode == "floor"
                    else f"modelyard REST, isolation: {mode}",
                    f"{s['p50_us']:.1f}",
                    f"{s['p99_us']:.1f}",
                    f"{s['overhead_p50_us']:.1f}",
                    f"{s['overhead_p99_us']:.1f}",
                    f"{s['qps']:.0f}",
                    f"{s['client_cpu_us_per_request']:.0f}",
                    f"{s['server_cpu_us_per_request']:.0f}",
                    f"{s['above_floor_p50_us']:.1f}" if "above_floor_p50_us" in s else "-",
                ]
            )
    return _server.markdown_table(header, rows)


def main() -> None:
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="2 repeats of 2 s per mode")
    parser.add_argument("--duration-s", type=float, default=4.0, help="measured s per phase")
    parser.add_argument("--bare-calls", type=int, default=5000, help="session.run calls per phase")
    parser.add_argument("--repeats", type=int, default=5, help="repeats (%(default)s)")
    args = parser.parse_args()
    if args.quick:
        args.duration_s, args.repeats, args.bare_calls = 2.0, 2, 2000
    _server.install_uvloop()
    env = _server.environment()
    started = time.time()
    runs = run(args)
    summary = summarise(runs)
    print(f"\nconcurrency 1; medians of {args.repeats} repeats; {env}\n")
    print(report(summary))
    worst = max(summary[m]["overhead_p50_us"] for m in ("process", "inline"))
    print(f"\nworst median overhead {worst:.1f} µs (target <= {TARGET_OVERHEAD_US:.0f} µs)")
    path = _server.write_results(
        "bench_overhead",
        {
            "args": vars(args),
            "environment": env,
            "elapsed_s": round(time.time() - started, 1),
            "summary": summary,
            "runs": runs,
        },
    )
    print(f"\nwrote {path.relative_to(_server.REPO_ROOT)}")


if __name__ == "__main__":
    main()
