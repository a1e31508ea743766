"""Samples the memory of a fork server's workers from a process of its own.

Kept apart from the tests that use it, with nothing but psutil to import, so that a
``spawn`` child starts in a fraction of a second and shares no GIL with the server.
"""

from __future__ import annotations

import contextlib
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path

import psutil

_KIB = 1024


def _rollup_pss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * _KIB
    return 0


def workers_pss(fork_server: psutil.Process) -> int:
    """Summed PSS of the fork server's children (the workers), from ``smaps_rollup``."""
    total = 0
    for worker in fork_server.children():
        with contextlib.suppress(OSError, psutil.Error):
            total += _rollup_pss(worker.pid)
    return total


def sample_loop(fork_pid: int, period_s: float, halt: Event, conn: Connection) -> None:
    """Sample until ``halt``; send ``"ready"`` first, then the rows.

    A row is ``(seconds, workers' PSS)``. Samples are due every ``period_s`` (they run
    late, never bunch up, when the machine is busy).
    """
    fork_server = psutil.Process(fork_pid)
    rows: list[tuple[float, int]] = []
    conn.send("ready")
    t0 = due = time.monotonic()
    while True:
        due = max(due + period_s, time.monotonic())
        if halt.wait(max(0.0, due - time.monotonic())):
            break
        rows.append((time.monotonic() - t0, workers_pss(fork_server)))
    conn.send(rows)
    conn.close()
