"""trim_heap gives the C heap's free memory back to the system (glibc malloc_trim)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from modelyard.workers.huge_pages import trim_heap

SCRIPT = textwrap.dedent(
    """
    import os
    from modelyard.workers.huge_pages import trim_heap

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    # ~190 MiB from the heap, each block followed by a small one that stays: freeing
    # the blocks leaves holes glibc keeps (only a free top of the heap goes back itself).
    blocks, pins = [], []
    for _ in range(3000):
        blocks.append(bytearray(b"x" * (64 * 1024)))
        pins.append(bytearray(b"y" * 1024))
    del blocks
    before = rss()
    trim_heap()
    print(before - rss())
    """
)


@pytest.mark.skipif(not trim_heap(), reason="malloc_trim is glibc's")
def test_freed_heap_goes_back_to_the_system() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=60
    )
    freed = int(out.stdout.strip())
    assert freed > 100 * 1024 * 1024, f"only {freed} bytes went back"
