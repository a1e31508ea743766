"""What a stopping worker reports as given back: the measured fall of its resident
anonymous memory as its runtime closes, and whether its weight file is still mapped
(``workers/release.py``)."""

from __future__ import annotations

import mmap
from pathlib import Path

from modelyard.workers.release import DRIFT_BYTES, close_and_measure, maps_file

MIB = 1024 * 1024


def _touched(nbytes: int) -> mmap.mmap:
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for i in range(0, nbytes, mmap.PAGESIZE):
        buf[i] = 1  # resident, as a KV cache that has been written
    return buf


def test_memory_a_close_unmaps_is_reported_and_the_weight_file_with_it(tmp_path: Path) -> None:
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"w" * (4 * MIB))
    with weights.open("rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    path = str(weights.resolve())
    assert maps_file(path)
    close_and_measure(lambda: None, None)  # the heap's free blocks, trimmed before
    buffers = _touched(32 * MIB)

    def close() -> None:
        buffers.close()
        mapped.close()

    released = close_and_measure(close, path)
    assert released.unmapped
    # All 32 MiB went back at once, less the margin for the counters' drift.
    assert 32 * MIB - DRIFT_BYTES - 4 * MIB <= released.anon_bytes <= 36 * MIB


def test_nothing_is_claimed_for_memory_a_close_keeps_or_a_file_still_mapped(
    tmp_path: Path,
) -> None:
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"w" * MIB)
    with weights.open("rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    kept = _touched(16 * MIB)
    close_and_measure(lambda: None, None)
    try:
        released = close_and_measure(lambda: None, str(weights.resolve()))
        assert not released.unmapped
        # At most what malloc_trim hands back of the interpreter's own free heap: not
        # the 16 MiB still held.
        assert released.anon_bytes < 4 * MIB
        assert not close_and_measure(lambda: None, None).unmapped
    finally:
        kept.close()
        mapped.close()
