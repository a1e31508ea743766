"""Server overhead per request: a tiny identity model over REST vs bare ``session.run``.

Run from the repository root::

    .venv/bin/python bench/bench_overhead.py            # 5 repeats of 4 s per mode
    .venv/bin/python bench/bench_overhead.py --quick    # 2 repeats of 2 s per mode
    .venv/bin/python bench/bench_overhead.py --baseline-src OTHER_TREE/src   # before/after

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
the part modelyard itself adds. A fifth, **round trip**, times a datagram sent to another
process and echoed back on a SOCK_SEQPACKET pair (what any worker hop costs at the least).
Two more, the **pipeline floors** (``pipe_process``, ``pipe_inline``: see
``bench/pipeline_floor.py``, which serves the HTTP floor too), do the work no server can
skip for this request and nothing else: parse, decode the JSON, run the model (in a worker
process over a SOCK_SEQPACKET pair, or in the server), encode, write. modelyard's overhead
over theirs is what its features cost (routing, checks, queues, deadlines, breakers,
metrics, the cache's bookkeeping); the process floor's own overhead is the least any
Python server with a worker hop can reach on the machine.
The modes run back to back per repeat, order rotated; the medians over repeats are reported.

Then, per server (and each floor), one phase at **concurrency 50** gives the server's CPU
per request under load (the whole process tree, workers included), beside the floor's.

With ``--baseline-src DIR``, a second server runs the modelyard sources in ``DIR`` (put
first on its ``PYTHONPATH``) on the same model, and its modes (``*-base``) take their turn
in every repeat: a before/after comparison measured in one run, on the same machine state.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
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
MODES = ("bare", "floor", "roundtrip", "pipe_process", "pipe_inline", "process", "inline")
FLOORS = ("floor", "pipe_process", "pipe_inline")
"""The modes served by a floor server (the minimal HTTP server, the pipeline floors)."""
_PIPELINE_FLOOR = Path(__file__).with_name("pipeline_floor.py")
SERVER_MODES = ("process", "inline")
LOAD_CONCURRENCY = 50
TARGET_CPU_US_C50 = 120.0
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

# The echo end of the round-trip floor: blocking recv/send on an inherited socket.
_ECHO = """
import socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
buf = bytearray(65536)
while True:
    n = sock.recv_into(buf)
    if n == 0:
        break
    sock.send(memoryview(buf)[:n])
"""
_ROUND_TRIP_BYTES = 41
"""The size of an ``Infer`` message with one input (see BENCHMARKS.md section 12)."""


def roundtrip_phase(calls: int) -> dict[str, Any]:
    """``calls`` timed datagram round trips to an echoing process (after 200 untimed); µs."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen(
        [sys.executable, "-c", _ECHO, str(theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        stdin=subprocess.DEVNULL,
    )
    theirs.close()
    try:
        msg, buf = b"x" * _ROUND_TRIP_BYTES, bytearray(65536)
        for _ in range(200):
            ours.send(msg)
            ours.recv_into(buf)
        samples = np.empty(calls, dtype=np.float64)
        clock = time.perf_counter_ns
        for i in range(calls):
            t0 = clock()
            ours.send(msg)
            ours.recv_into(buf)
            samples[i] = clock() - t0
    finally:
        ours.close()
        proc.wait(timeout=10)
    samples /= 1e3
    p50, p99 = np.percentile(samples, [50, 99]).tolist()
    return {"p50_us": p50, "p99_us": p99, "mean_us": float(samples.mean()), "calls": calls}


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
    url: str, pid: int, model: str, payload: Path, duration_s: float, concurrency: int = 1
) -> dict[str, Any]:
    """One closed-loop phase; adds the server's (tree's) CPU per request, warm-up included."""
    config = BenchConfig(
        url=url,
        models=(model,),
        concurrency=(concurrency,),
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
def floor_server(*args: str) -> Iterator[tuple[str, int]]:
    """Run ``pipeline_floor.py`` with ``args`` after its port (``fixed``: the HTTP floor;
    ``process MODEL`` or ``inline MODEL``: a pipeline floor); yield its URL and pid."""
    port = _server.free_port()
    proc = subprocess.Popen(
        [sys.executable, str(_PIPELINE_FLOOR), str(port), *args], stdin=subprocess.DEVNULL
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


@contextlib.contextmanager
def sources_first(src: str | None) -> Iterator[None]:
    """Children started inside see ``src`` first on their PYTHONPATH (None: unchanged)."""
    if src is None:
        yield
        return
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (src, old) if p)
    try:
        yield
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


def run(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    modes = list(MODES)
    if args.baseline_src:
        modes += [f"{m}-base" for m in SERVER_MODES]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        root = Path(tmp)
        path = build_identity_onnx(root / "identity" / "1" / "model.onnx")
        entries = [
            {"name": f"identity-{iso}", "path": "identity", "isolation": iso, "preload": True}
            for iso in SERVER_MODES
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
        with contextlib.ExitStack() as stack:
            server = stack.enter_context(_server.Server(cfg, root / "server.log"))
            servers = {"": server}
            if args.baseline_src:
                with sources_first(args.baseline_src):
                    servers["-base"] = stack.enter_context(
                        _server.Server(cfg, root / "server-base.log")
                    )
            floors = {"floor": stack.enter_context(floor_server("fixed"))}
            for mode in ("pipe_process", "pipe_inline"):
                floors[mode] = stack.enter_context(floor_server(mode[5:], str(path)))
            print(f"server pid {server.pid} on {server.url}; floors {floors}", file=sys.stderr)
            for rep in range(args.repeats):
                shift = rep % len(modes)
                for mode in modes[shift:] + modes[:shift]:
                    if mode == "bare":
                        r = bare_phase(session, args.bare_calls)
                    elif mode == "roundtrip":
                        r = roundtrip_phase(args.bare_calls)
                    elif mode in floors:
                        url, pid = floors[mode]
                        r = server_phase(url, pid, "identity", payload, args.duration_s)
                    else:
                        iso, _, base = mode.partition("-")
                        srv = servers["-base" if base else ""]
                        r = server_phase(
                            srv.url, srv.pid, f"identity-{iso}", payload, args.duration_s
                        )
                    runs[mode].append(r)
                    print(
                        f"  rep {rep + 1} {mode}: p50 {r['p50_us']:.1f} µs, p99 "
                        f"{r['p99_us']:.1f} µs",
                        file=sys.stderr,
                    )
            # Server CPU per request under load: one phase per server mode, and the floor.
            for mode in [*FLOORS, *(m for m in modes if m not in ("bare", "roundtrip", *FLOORS))]:
                if mode in floors:
                    url, pid = floors[mode]
                    model = "identity"
                else:
                    iso, _, base = mode.partition("-")
                    srv = servers["-base" if base else ""]
                    url, pid, model = srv.url, srv.pid, f"identity-{iso}"
                r = server_phase(url, pid, model, payload, args.duration_s, LOAD_CONCURRENCY)
                runs[f"{mode}@c{LOAD_CONCURRENCY}"] = [r]
                print(
                    f"  c={LOAD_CONCURRENCY} {mode}: {r['qps']:.0f} req/s, server CPU "
                    f"{r['server_cpu_us_per_request']:.0f} µs/request",
                    file=sys.stderr,
                )
    return runs


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Medians over repeats, overheads against the bare call, and the floors' ratios."""
    out: dict[str, dict[str, Any]] = {}
    bare, floor = runs["bare"], runs["floor"]
    for mode, reps in runs.items():
        if "@" in mode:
            continue
        row: dict[str, Any] = {
            "p50_us": statistics.median(r["p50_us"] for r in reps),
            "p99_us": statistics.median(r["p99_us"] for r in reps),
        }
        if mode not in ("bare", "roundtrip"):
            row["qps"] = statistics.median(r["qps"] for r in reps)
            row["errors"] = sum(r["errors"] for r in reps)
            row["client_cpu_us_per_request"] = statistics.median(
                r["client_cpu_us_per_request"] for r in reps
            )
            row["server_cpu_us_per_request"] = statistics.median(
                r["server_cpu_us_per_request"] for r in reps
            )
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
            load = runs.get(f"{mode}@c{LOAD_CONCURRENCY}")
            if load:
                row["qps_c50"] = load[0]["qps"]
                row["server_cpu_us_per_request_c50"] = load[0]["server_cpu_us_per_request"]
        out[mode] = row
    http_floor = out["floor"]["overhead_p50_us"]
    round_trip = out["roundtrip"]["p50_us"]
    floor_cpu = out["floor"].get("server_cpu_us_per_request_c50")
    for mode, row in out.items():
        if mode in ("bare", "roundtrip", "floor"):
            continue
        row["x_http_floor"] = row["overhead_p50_us"] / http_floor
        row["x_both_floors"] = row["overhead_p50_us"] / (http_floor + round_trip)
        if floor_cpu and row.get("server_cpu_us_per_request_c50"):
            row["cpu_c50_x_floor"] = row["server_cpu_us_per_request_c50"] / floor_cpu
        # The pipeline floor of the same isolation: what the features cost above the work.
        pipe = out.get("pipe_" + mode.partition("-")[0])
        if pipe is not None and not mode.startswith("pipe_"):
            row["x_pipeline_floor"] = row["overhead_p50_us"] / pipe["overhead_p50_us"]
            pipe_cpu = pipe.get("server_cpu_us_per_request_c50")
            if pipe_cpu and row.get("server_cpu_us_per_request_c50"):
                row["cpu_c50_x_pipeline_floor"] = row["server_cpu_us_per_request_c50"] / pipe_cpu
    return out


def _label(mode: str) -> str:
    if mode == "bare":
        return "bare ORT session.run (in client)"
    if mode == "roundtrip":
        return "round trip to another process (floor)"
    if mode == "floor":
        return "minimal HTTP server (floor)"
    if mode.startswith("pipe_"):
        return f"pipeline floor, {mode[5:]} (bench/pipeline_floor.py)"
    iso, _, base = mode.partition("-")
    return f"modelyard REST, isolation: {iso}" + (" (baseline sources)" if base else "")


def report(summary: dict[str, dict[str, Any]]) -> str:
    """The markdown table of ``summary``."""
    header = [
        "mode",
        "median (µs)",
        "p99 (µs)",
        "overhead median (µs)",
        "overhead / HTTP floor",
        "overhead / (HTTP + round-trip floors)",
        "server CPU / request, c=1 (µs)",
        f"server CPU / request, c={LOAD_CONCURRENCY} (µs)",
        f"CPU / floor's CPU, c={LOAD_CONCURRENCY}",
        "overhead / pipeline floor's",
        f"CPU / pipeline floor's CPU, c={LOAD_CONCURRENCY}",
        f"req/s, c={LOAD_CONCURRENCY}",
    ]

    def num(row: dict[str, Any], key: str, fmt: str) -> str:
        value = row.get(key)
        return "-" if value is None else format(value, fmt)

    rows = [
        [
            _label(mode),
            num(s, "p50_us", ".1f"),
            num(s, "p99_us", ".1f"),
            num(s, "overhead_p50_us", ".1f"),
            num(s, "x_http_floor", ".2f"),
            num(s, "x_both_floors", ".2f"),
            num(s, "server_cpu_us_per_request", ".0f"),
            num(s, "server_cpu_us_per_request_c50", ".0f"),
            num(s, "cpu_c50_x_floor", ".2f"),
            num(s, "x_pipeline_floor", ".2f"),
            num(s, "cpu_c50_x_pipeline_floor", ".2f"),
            num(s, "qps_c50", ".0f"),
        ]
        for mode, s in summary.items()
    ]
    return _server.markdown_table(header, rows)


def main() -> None:
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="2 repeats of 2 s per mode")
    parser.add_argument("--duration-s", type=float, default=4.0, help="measured s per phase")
    parser.add_argument("--bare-calls", type=int, default=5000, help="session.run calls per phase")
    parser.add_argument("--repeats", type=int, default=5, help="repeats (%(default)s)")
    parser.add_argument(
        "--baseline-src", default=None, help="modelyard sources of a second, baseline server"
    )
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
    worst = max(summary[m]["overhead_p50_us"] for m in SERVER_MODES)
    pipe = summary["pipe_process"]
    print(
        f"\npipeline floor, process: median overhead {pipe['overhead_p50_us']:.1f} µs, "
        f"c={LOAD_CONCURRENCY} server CPU {pipe.get('server_cpu_us_per_request_c50', 0):.0f} "
        "µs per request (the least any Python server with a worker hop does)"
    )
    print(f"\nworst median overhead {worst:.1f} µs (target <= {TARGET_OVERHEAD_US:.0f} µs)")
    cpu = summary["process"].get("server_cpu_us_per_request_c50")
    if cpu is not None:
        print(
            f"process isolation, c={LOAD_CONCURRENCY}: {cpu:.0f} µs of server CPU per request "
            f"(target <= {TARGET_CPU_US_C50:.0f} µs)"
        )
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
