"""The worker hop taken apart: one ``ProcessInstance.infer`` against its floors.

Run from the repository root (``PYTHONPATH`` picks the tree under test)::

    PYTHONPATH=src .venv/bin/python bench/bench_hop.py
    PYTHONPATH=OTHER/src .venv/bin/python bench/bench_hop.py --json   # the same for another tree

One process calls a worker serving the identity ONNX model (FP32 [1, 4]) through
``ProcessInstance.infer`` on a uvloop loop, as the server does, with no HTTP and no
scheduler. Beside it, in the same run and rounds interleaved, the floors:

* ``echo``: a 41-byte datagram echoed by another process over a SOCK_SEQPACKET pair,
  the server side waiting in uvloop's ``add_reader`` (what any worker hop costs);
* ``ort``: the model's ``session.run`` in this process (what the worker's work costs).

Per mode: the wall median per call, and the CPU and minor page faults per call of this
process (the server's side: region write, message, wake-up, reply, copy-out) and of the
worker (from ``/proc/PID/stat``: receive, decode, region views, the runtime, encode,
send). The worker's CPU is counted in clock ticks: a round of 2,000 calls resolves it to
5 µs. BENCHMARKS.md section 5, "Session 9", has the figures and the timeline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import uvloop
from bench_isolation import build_identity

from modelyard.runtimes.base import RuntimeSpec
from modelyard.workers.factory import WorkerFactory
from modelyard.workers.instance import StartRequest
from modelyard.workers.process import ProcessInstance

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> tuple[float, int]:
    """CPU seconds and minor page faults of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S, int(fields[7])


def _own_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _echo_child(sock: socket.socket) -> None:
    buf = bytearray(65536)
    while True:
        n = sock.recv_into(buf)
        if n == 0:
            os._exit(0)
        sock.send(buf[:n])


class _Echo:
    """The round-trip floor: another process echoes each datagram."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            ours.close()
            _echo_child(theirs)
        theirs.close()
        ours.setblocking(False)
        self.pid = pid
        self._sock = ours
        self._buf = bytearray(65536)
        self._fut: asyncio.Future[int] | None = None
        self._msg = b"x" * 41

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_reader(self._sock.fileno(), self._readable)
        self._loop = loop

    def _readable(self) -> None:
        n = self._sock.recv_into(self._buf)
        fut = self._fut
        if fut is not None:
            self._fut = None
            fut.set_result(n)

    async def call(self) -> None:
        fut = self._fut = self._loop.create_future()
        self._sock.send(self._msg)
        await fut

    def close(self) -> None:
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        os.waitpid(self.pid, 0)


async def _rounds(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    x = {"x": np.random.default_rng(0).random((1, 4), dtype=np.float32)}
    session = ort.InferenceSession(str(model / "model.onnx"), providers=["CPUExecutionProvider"])
    echo = _Echo()
    echo.open(loop)
    samples: dict[str, list[float]] = {"process": [], "echo": [], "ort": []}
    cpu: dict[str, list[float]] = {"process": [], "echo": []}
    worker_cpu: dict[str, list[float]] = {"process": [], "echo": []}
    faults: dict[str, list[float]] = {"process": [], "echo": []}
    worker_faults: dict[str, list[float]] = {"process": [], "echo": []}
    async with WorkerFactory() as factory:
        instance = ProcessInstance(factory)
        await instance.start(StartRequest(RuntimeSpec("onnx", str(model), model_name="identity")))
        pid = instance.pid
        assert pid is not None
        try:
            for _ in range(300):  # warm-up
                await instance.infer(x, 5.0)
                await echo.call()
            n = args.calls
            for _ in range(args.rounds):
                for mode in ("process", "echo", "ort"):
                    other = pid if mode == "process" else echo.pid
                    (w0, wf0), c0, f0 = _proc_stat(other), time.thread_time(), _own_faults()
                    walls = samples[mode]
                    if mode == "process":
                        for _ in range(n):
                            t0 = time.perf_counter()
                            await instance.infer(x, 5.0)
                            walls.append(time.perf_counter() - t0)
                    elif mode == "echo":
                        for _ in range(n):
                            t0 = time.perf_counter()
                            await echo.call()
                            walls.append(time.perf_counter() - t0)
                    else:
                        for _ in range(n):
                            t0 = time.perf_counter()
                            session.run(None, x)
                            walls.append(time.perf_counter() - t0)
                        continue
                    cpu[mode].append((time.thread_time() - c0) / n)
                    faults[mode].append((_own_faults() - f0) / n)
                    w1, wf1 = _proc_stat(other)
                    worker_cpu[mode].append((w1 - w0) / n)
                    worker_faults[mode].append((wf1 - wf0) / n)
        finally:
            await instance.stop()
            echo.close()
    out: dict[str, Any] = {}
    for mode, walls in samples.items():
        row = {"median_us": statistics.median(walls) * 1e6}
        if mode in cpu:
            row["server_cpu_us"] = statistics.median(cpu[mode]) * 1e6
            row["worker_cpu_us"] = statistics.median(worker_cpu[mode]) * 1e6
            row["server_faults"] = statistics.median(faults[mode])
            row["worker_faults"] = statistics.median(worker_faults[mode])
        out[mode] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="calls per mode per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-hop-") as tmp:
        model = build_identity(Path(tmp))
        result = uvloop.run(_rounds(args, model))
    result["loadavg"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(result))
        return
    print(f"load average {result['loadavg']:.2f}; {args.rounds} rounds of {args.calls} calls")
    print(
        "| mode | median (µs) | server CPU / call (µs) | worker CPU / call (µs) "
        "| server page faults / call | worker page faults / call |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for mode in ("process", "echo", "ort"):
        row = result[mode]
        print(
            f"| {mode} | {row['median_us']:.1f} | {row.get('server_cpu_us', float('nan')):.1f} "
            f"| {row.get('worker_cpu_us', float('nan')):.1f} "
            f"| {row.get('server_faults', float('nan')):.2f} "
            f"| {row.get('worker_faults', float('nan')):.2f} |"
        )


if __name__ == "__main__":
    main()
