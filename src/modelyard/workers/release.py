"""What a generative worker gives back as it closes its runtime, before it exits.

An evicted worker's exit is slow for what it frees: the kernel tears down every page
table the worker inherited from the fork server (tens of MiB shared with it, freeing
nothing) besides its own memory, 9-18 ms on a 2-core machine. Closing the runtime in
the worker (llama.cpp frees its context and unmaps the model) takes 2 ms, and the
kernel's own counters say at once how much private memory that gave back. The worker
reports it in :class:`~modelyard.workers.messages.Released`; the server lowers the
model's reservation to what is left, which stays charged until the process has gone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

from modelyard.workers.huge_pages import trim_heap
from modelyard.workers.messages import Released

DRIFT_BYTES: Final = 1024 * 1024
"""Taken off the measured fall: the kernel's resident-memory counters are per-CPU and
read approximately (off by up to a few hundred KiB), and the release must never be
overstated."""


_PAGE_BYTES: Final = os.sysconf("SC_PAGE_SIZE")


def resident_anon_bytes() -> int:
    """This process's resident anonymous memory: resident less shared pages in
    ``/proc/self/statm``, the kernel's ``RssAnon`` counter (``RssFile`` and ``RssShmem``
    are the shared ones). A counter, no page walk, unlike ``smaps_rollup`` (milliseconds
    in a worker with llama.cpp); and a few microseconds where ``/proc/self/status``,
    which formats fifty fields, takes 0.1-0.3 ms, read twice on a switch's path."""
    with open("/proc/self/statm", "rb") as f:
        fields = f.read().split()
    return (int(fields[1]) - int(fields[2])) * _PAGE_BYTES


def close_and_measure(close: Callable[[], None], *, unmaps: bool) -> Released:
    """Run ``close`` (the runtime's) and say what it gave back: the fall of resident
    anonymous memory less :data:`DRIFT_BYTES`; ``unmaps``: the runtime's close unmaps
    its weight file (llama.cpp always maps its GGUF file, and frees the model on close:
    told, not read from ``/proc/self/maps``, whose thousand lines take milliseconds)."""
    before = resident_anon_bytes()
    close()
    # glibc keeps freed blocks in its heap (its mmap threshold rises as large blocks are
    # freed, so llama.cpp's buffers come from the heap): hand them back to the system.
    # (Without glibc nothing is trimmed: the fall measured is smaller, never wrong.)
    trim_heap()
    freed = max(0, before - resident_anon_bytes() - DRIFT_BYTES)
    return Released(freed, unmaps)
