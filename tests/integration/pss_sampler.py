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


def models_memory(fork_server: psutil.Process) -> int:
    """What the models really hold: each worker's USS, plus mapped weight pages once.

    Each worker's private pages, except that its weight-file mappings (``*.onnx.data``)
    count as their PSS: pages several workers map are split among them, so the shares
    add up to the file's pages once.
    """
    total = 0
    for worker in fork_server.children():
        with contextlib.suppress(OSError, psutil.Error):
            text = Path(f"/proc/{worker.pid}/smaps").read_text()
            weights = False
            for line in text.splitlines():
                parts = line.split(maxsplit=5)
                if not parts[0].endswith(":"):
                    weights = len(parts) == 6 and parts[5].endswith(".onnx.data")
                elif parts[0] in (("Pss:",) if weights else ("Private_Clean:", "Private_Dirty:")):
                    total += int(parts[1]) * _KIB
    return total


def sample_loop(
    fork_pid: int, period_s: float, every_nth_full: int, halt: Event, conn: Connection
) -> None:
    """Sample until ``halt``; send ``"ready"`` first, then the rows.

    A row is ``(seconds, workers' PSS, models' memory or -1)``: the full ``smaps`` read
    behind the models' memory is slower, so it is taken on every ``every_nth_full``-th
    sample only. Samples are due every ``period_s`` (they run late, never bunch up,
    when the machine is busy).
    """
    fork_server = psutil.Process(fork_pid)
    rows: list[tuple[float, int, int]] = []
    conn.send("ready")
    t0 = due = time.monotonic()
    n = 0
    while True:
        due = max(due + period_s, time.monotonic())
        if halt.wait(max(0.0, due - time.monotonic())):
            break
        full = models_memory(fork_server) if n % every_nth_full == 0 else -1
        rows.append((time.monotonic() - t0, workers_pss(fork_server), full))
        n += 1
    conn.send(rows)
    conn.close()
