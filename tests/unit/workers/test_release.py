"""What a stopping worker reports as given back: the measured fall of its resident
anonymous memory as its runtime closes (``workers/release.py``)."""

from __future__ import annotations

import mmap

from modelyard.workers.release import DRIFT_BYTES, close_and_measure, resident_anon_bytes

MIB = 1024 * 1024


def _touched(nbytes: int) -> mmap.mmap:
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for i in range(0, nbytes, mmap.PAGESIZE):
        buf[i] = 1  # resident, as a KV cache that has been written
    return buf


def test_the_memory_a_close_frees_is_reported() -> None:
    close_and_measure(lambda: None, unmaps=False)  # the heap's free blocks, trimmed before
    buffers = _touched(32 * MIB)
    assert resident_anon_bytes() >= 32 * MIB
    released = close_and_measure(buffers.close, unmaps=True)
    assert released.unmapped
    # All 32 MiB went back at once, less the margin for the counters' drift.
    assert 32 * MIB - DRIFT_BYTES - 4 * MIB <= released.anon_bytes <= 36 * MIB


def test_nothing_is_claimed_for_memory_a_close_keeps() -> None:
    kept = _touched(16 * MIB)
    close_and_measure(lambda: None, unmaps=False)
    try:
        released = close_and_measure(lambda: None, unmaps=False)
        # At most what malloc_trim hands back of the interpreter's own free heap: not
        # the 16 MiB still held.
        assert released.anon_bytes < 4 * MIB
        assert not released.unmapped
    finally:
        kept.close()


def test_the_anonymous_memory_read_is_the_kernels_rss_anon() -> None:
    def rss_anon() -> int:
        with open("/proc/self/status", encoding="ascii") as f:
            line = next(line for line in f if line.startswith("RssAnon:"))
        return int(line.split()[1]) * 1024

    kept = _touched(8 * MIB)
    try:
        before, read, after = rss_anon(), resident_anon_bytes(), rss_anon()
        # The same counter (the reads themselves allocate a little between them).
        assert min(before, after) - MIB <= read <= max(before, after) + MIB
    finally:
        kept.close()
