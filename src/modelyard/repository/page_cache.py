"""The page-cache tier: read a model's files into the kernel's page cache, or drop them.

A model that is likely to be asked for but cannot be loaded (no room in the budget)
still loads faster if its files are already in memory: ``posix_fadvise(WILLNEED)``
starts the kernel's readahead of each file without any process holding the pages, so
no budget is used and the kernel may drop them again under pressure. ``DONTNEED`` is
the reverse (benchmarks use it for a cold cache). Blocking calls: run them in a thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

_CHUNK = 8 * 1024 * 1024


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []
    return [p for p in sorted(path.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]


def _each_file(path: Path, act: Callable[[int], object]) -> int:
    """Call ``act`` on an open descriptor of every file under ``path``; the bytes of the
    files it did not fail on (unreadable files and failures are skipped)."""
    total = 0
    for p in _files(path):
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            act(fd)
            total += os.fstat(fd).st_size
        except OSError:
            continue
        finally:
            os.close(fd)
    return total


def warm(path: Path, *, read: bool = True) -> int:
    """Read every file under ``path`` into the page cache; the bytes asked for.

    ``posix_fadvise(WILLNEED)`` first (where the platform has it), then, with ``read``
    (the default), the files are read through: Linux acts on WILLNEED only up to its
    readahead window (a few MiB of a 200 MB file, measured), so reading is what makes
    the whole file resident. Blocking: call it in a thread. Unreadable files are skipped.
    """
    view = memoryview(bytearray(_CHUNK))

    def load(fd: int) -> None:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        if read:
            while os.readv(fd, [view]):
                pass

    return _each_file(path, load)


def drop(path: Path) -> int:
    """Ask the kernel to drop the cached pages of every file under ``path``; bytes asked.

    Only clean pages go (call ``os.sync`` first for files just written). A no-op where
    ``posix_fadvise`` is missing.
    """
    if not hasattr(os, "posix_fadvise"):
        return 0

    def evict(fd: int) -> None:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    return _each_file(path, evict)


def resident_fraction(path: Path) -> float | None:
    """Fraction of ``path``'s file bytes in the page cache (None where it cannot be told).

    Uses ``mincore`` on a read-only mapping of each file (Linux); for tests and the
    benchmark, not the serving path.
    """
    import ctypes
    import ctypes.util
    import mmap

    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    libc = ctypes.CDLL(libc_name, use_errno=True)
    page = mmap.PAGESIZE
    in_core = total = 0
    for p in _files(path):
        size = p.stat().st_size
        if size == 0:
            continue
        # A private (copy-on-write) mapping: ctypes needs a writable buffer, and mincore
        # reports the file's cached pages through it until one is written (none is).
        with p.open("rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            addr = ctypes.c_char.from_buffer(m)
            try:
                rc = libc.mincore(ctypes.byref(addr), ctypes.c_size_t(size), vec)
            finally:
                del addr
            if rc != 0:
                return None
            in_core += sum(1 for b in vec if b & 1)
            total += pages
    return in_core / total if total else None
