"""Transparent huge pages for a model's large mapped weight files, and giving freed heap back.

**Huge pages.** The design notes put models over 10 GB on 2 MiB pages: one TLB entry then
covers 512 times the memory, which matters when every decoded token reads every weight.
Here the weights are memory-mapped files (llama.cpp maps its GGUF; safetensors and ONNX
external data are mapped too), so the worker asks the kernel for transparent huge pages
on those mappings once the runtime has loaded: ``madvise(MADV_HUGEPAGE)`` on each range
of ``/proc/self/maps`` that maps a file of the version folder at least
``huge_pages_min_mb`` big. It is advice: the kernel's THP mode
(``/sys/kernel/mm/transparent_hugepage/enabled``) and its support for huge pages in the
page cache decide what happens (see docs/seeds.md and the figures in BENCHMARKS.md).

**Freed heap.** glibc keeps freed blocks in its heap; in a process that lives on after an
unload (the server with its inline models, a spare worker after its warm-up, the fork
server after its imports), ``malloc_trim(0)`` hands them back to the system, as the
notes' memory-leak case asks (an evicted worker simply exits).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path
from typing import Final

MADV_HUGEPAGE: Final = getattr(mmap, "MADV_HUGEPAGE", 14)
"""Linux's ``MADV_HUGEPAGE`` (Python's mmap module names it on Linux)."""

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_madvise = getattr(_libc, "madvise", None)
if _madvise is not None:
    _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    _madvise.restype = ctypes.c_int
_malloc_trim = getattr(_libc, "malloc_trim", None)
"""glibc's; None with another C library (musl has no such heap to trim)."""


def trim_heap() -> bool:
    """Give the C heap's free memory back to the system (glibc ``malloc_trim(0)``);
    whether anything could be asked (False without glibc)."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


def large_files(folder: Path, min_bytes: int) -> set[str]:
    """Real paths of the files directly in ``folder`` of at least ``min_bytes``."""
    found: set[str] = set()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return found
    for entry in entries:
        try:
            if entry.is_file() and entry.stat().st_size >= min_bytes:
                found.add(os.path.realpath(entry.path))
        except OSError:
            continue
    return found


def _mapped_ranges(paths: set[str]) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].rstrip("\n") in paths:
                start, _, end = parts[0].partition("-")
                ranges.append((int(start, 16), int(end, 16)))
    return ranges


def advise_huge_pages(folder: Path, min_bytes: int | None) -> int:
    """``madvise(MADV_HUGEPAGE)`` on this process's mappings of ``folder``'s files of at
    least ``min_bytes``; the bytes advised (0: none that big, off, or refused)."""
    if min_bytes is None or _madvise is None:
        return 0
    paths = large_files(folder, min_bytes)
    if not paths:
        return 0  # the common case costs one scandir, never a read of /proc/self/maps
    advised = 0
    for start, end in _mapped_ranges(paths):
        if _madvise(start, end - start, MADV_HUGEPAGE) == 0:
            advised += end - start
    return advised
