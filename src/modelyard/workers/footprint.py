"""What a worker process holds in memory, read from ``/proc`` by the server.

The footprint of a process-isolated model is the worker's **USS** (unique set size:
pages only this process maps). A worker forked from the warm parent shares the
parent's interpreter, numpy and ONNX Runtime pages copy-on-write; those are paid once
for all workers, so they are not the model's cost. USS is also exactly what returns
to the system when the worker exits, which is what the memory budget needs to know.
PSS (shared pages divided among their sharers) is reported beside it: with shared
weights, PSS shows each replica's fair share of the common page cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

_FIELDS = {
    "Rss:": "rss",
    "Pss:": "pss",
    "Private_Clean:": "private",
    "Private_Dirty:": "private",
    "Private_Hugetlb:": "private",
    "Swap:": "swap",
}


@dataclass(frozen=True, slots=True)
class MemorySample:
    """One reading of a process's memory, in bytes."""

    rss_bytes: int
    uss_bytes: int
    pss_bytes: int
    swap_bytes: int = 0

    def as_details(self) -> dict[str, object]:
        """For ``InstanceInfo.details`` and health output."""
        return {
            "rss_bytes": self.rss_bytes,
            "uss_bytes": self.uss_bytes,
            "pss_bytes": self.pss_bytes,
            "swap_bytes": self.swap_bytes,
        }


def parse_smaps_rollup(text: str) -> MemorySample:
    """A sample from the text of ``/proc/<pid>/smaps_rollup`` (sizes in kB)."""
    totals = {"rss": 0, "pss": 0, "private": 0, "swap": 0}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in _FIELDS:
            totals[_FIELDS[parts[0]]] += int(parts[1]) * 1024
    return MemorySample(totals["rss"], totals["private"], totals["pss"], totals["swap"])


def sample_memory(pid: int, proc_root: Path = Path("/proc")) -> MemorySample:
    """RSS, USS and PSS of ``pid``; psutil.NoSuchProcess once it has gone.

    Reads ``smaps_rollup`` (one file, cheap); falls back to psutil where it is missing.
    Blocking but short: call it from a thread on the server's event loop.
    """
    try:
        return parse_smaps_rollup((proc_root / str(pid) / "smaps_rollup").read_text())
    except FileNotFoundError:
        if not (proc_root / str(pid)).exists():
            raise psutil.NoSuchProcess(pid) from None
    except ProcessLookupError:
        raise psutil.NoSuchProcess(pid) from None
    info = psutil.Process(pid).memory_full_info()
    return MemorySample(info.rss, info.uss, getattr(info, "pss", info.uss), info.swap)
