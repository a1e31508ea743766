"""Spin or block on the worker channel: what a short busy-poll buys at concurrency 1.

Run from the repository root::

    .venv/bin/python bench/bench_spin.py            # 5 repeats of 3,000 round trips per mode
    .venv/bin/python bench/bench_spin.py --quick

Two processes exchange a 41-byte datagram over a SOCK_SEQPACKET pair, as the server and
a worker do (BENCHMARKS.md section 12). The "worker" busy-works ``--work-us`` per request
(decode, a tiny model, encode); the "server" waits ``--gap-us`` between requests (what
the HTTP side costs at concurrency 1 before the next request reaches the worker) and
waits for each reply in its event-loop way (``selectors``, i.e. epoll). Modes:

* ``block``: both sides block (the worker in ``recv``, the server in ``select``): today.
* ``worker-spin``: the worker polls its socket for ``--spin-us`` before blocking.
* ``server-spin``: the server polls for the reply for ``--spin-us`` before selecting.
* ``both-spin``: both.

Per mode: round-trip median and p99 (µs) and the CPU of both processes per round trip,
with ratios against ``block`` measured in the same repeat (modes interleaved, order
rotated, medians over repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import statistics
import sys
import time
from typing import Any

import numpy as np

MODES = ("block", "worker-spin", "server-spin", "both-spin")
_MESSAGE = b"x" * 41


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _poll(sock: socket.socket, buf: bytearray, seconds: float) -> int | None:
    """Non-blocking receives for up to ``seconds``; the byte count, or None if nothing came."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        try:
            return sock.recv_into(buf)
        except BlockingIOError:
            pass
    return None


def _worker(sock: socket.socket, work_s: float, spin_s: float) -> None:
    buf = bytearray(65536)
    sock.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    while True:
        n = _poll(sock, buf, spin_s) if spin_s else None
        if n is None:
            sel.select()
            n = sock.recv_into(buf)
        if n == 0:
            return
        _busy(work_s)
        sock.send(memoryview(buf)[:n])


def one_mode(mode: str, calls: int, work_s: float, gap_s: float, spin_s: float) -> dict[str, Any]:
    """``calls`` timed round trips in ``mode`` (after 200 untimed)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker_spin = spin_s if mode in ("worker-spin", "both-spin") else 0.0
    server_spin = spin_s if mode in ("server-spin", "both-spin") else 0.0
    pid = os.fork()
    if pid == 0:  # the worker
        ours.close()
        try:
            _worker(theirs, work_s, worker_spin)
        finally:
            os._exit(0)
    theirs.close()
    ours.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(ours, selectors.EVENT_READ)
    buf = bytearray(65536)
    samples = np.empty(calls, dtype=np.float64)
    try:
        for i in range(-200, calls):
            if i == 0:
                cpu0 = time.process_time()
                child0 = _child_cpu_s(pid)
            _busy(gap_s)
            t0 = time.perf_counter()
            ours.send(_MESSAGE)
            if not (server_spin and _poll(ours, buf, server_spin)):
                sel.select()
                ours.recv_into(buf)
            if i >= 0:
                samples[i] = time.perf_counter() - t0
        # The gap is the server's own (HTTP) work, not the channel's: leave it out.
        server_cpu = time.process_time() - cpu0 - calls * gap_s
        worker_cpu = _child_cpu_s(pid) - child0
    finally:
        ours.close()
        os.waitpid(pid, 0)
    samples *= 1e6
    p50, p99 = np.percentile(samples, [50, 99]).tolist()
    return {
        "p50_us": p50,
        "p99_us": p99,
        "server_cpu_us": server_cpu / calls * 1e6,
        "worker_cpu_us": worker_cpu / calls * 1e6,
    }


def _child_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 repeats of 1,000 calls")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--work-us", type=float, default=30.0, help="worker work per request")
    parser.add_argument("--gap-us", type=float, default=100.0, help="server work between calls")
    parser.add_argument("--spin-us", type=float, default=75.0, help="poll this long first")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.calls = 2, 1000
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for rep in range(args.repeats):
        for mode in MODES[rep % len(MODES) :] + MODES[: rep % len(MODES)]:
            runs[mode].append(
                one_mode(
                    mode, args.calls, args.work_us / 1e6, args.gap_us / 1e6, args.spin_us / 1e6
                )
            )
    print(f"load average {os.getloadavg()}, {os.cpu_count()} CPUs; {vars(args)}")
    print(
        "| mode | p50 (µs) | p99 (µs) | p50 / block | server CPU (µs) | worker CPU (µs) "
        "| CPU / block |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    summary: dict[str, dict[str, float]] = {}
    for mode in MODES:
        summary[mode] = {k: statistics.median(r[k] for r in runs[mode]) for k in runs[mode][0]}
    base = summary["block"]
    for mode, s in summary.items():
        cpu, base_cpu = (
            s["server_cpu_us"] + s["worker_cpu_us"],
            base["server_cpu_us"] + base["worker_cpu_us"],
        )
        ratio = s["p50_us"] / base["p50_us"]
        print(
            f"| {mode} | {s['p50_us']:.1f} | {s['p99_us']:.1f} | {ratio:.2f}x "
            f"| {s['server_cpu_us']:.1f} | {s['worker_cpu_us']:.1f} | {cpu / base_cpu:.2f}x |"
        )
    json.dump({"args": vars(args), "summary": summary}, sys.stderr)


if __name__ == "__main__":
    main()
