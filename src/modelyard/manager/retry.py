"""When requests may try a failed load again: exponential backoff, reset by new files.

A model whose load failed is not retried by every request (a broken file would cost a
worker start per request), but not banned for long either: the wait doubles with each
failure in a row (1 s, 2 s, 4 s … up to a minute) and starts over after a success, an
explicit load, or a change of the version folder (the operator fixed the files).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

FIRST_RETRY_S = 1.0
"""Wait after the first failure."""
MAX_RETRY_S = 60.0
"""Longest wait between retries, however many failures in a row."""

Fingerprint = tuple[tuple[str, int, int], ...]
"""``(relative path, size, mtime_ns)`` of every file under a version folder."""


def folder_fingerprint(path: Path) -> Fingerprint:
    """A cheap fingerprint of ``path``'s files: names, sizes and modification times.

    Reads directory entries only (no file contents), so checking it on each request for
    a failed model costs a few system calls. A missing folder has an empty fingerprint.
    """
    found: list[tuple[str, int, int]] = []
    pending = [path]
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as it:
                for item in it:
                    if item.is_dir(follow_symlinks=False):
                        pending.append(Path(item.path))
                        continue
                    try:
                        st = item.stat()
                    except OSError:
                        continue  # removed while we looked: the next check sees the change
                    found.append((os.path.relpath(item.path, path), st.st_size, st.st_mtime_ns))
        except OSError:
            continue
    return tuple(sorted(found))


@dataclass
class LoadBackoff:
    """Failures in a row of one model version's loads, and when a request may retry."""

    failures: int = 0
    """Failed loads since the last success (or reset)."""
    retry_at: float = 0.0
    """``time.monotonic()`` from which a request may start a load again."""
    fingerprint: Fingerprint | None = None
    """The version folder as it was at the last failure."""

    def failed(self, now: float, path: Path) -> float:
        """Count a failure at ``now``; returns the wait before the next retry."""
        self.failures += 1
        delay = min(MAX_RETRY_S, FIRST_RETRY_S * 2.0 ** (self.failures - 1))
        self.retry_at = now + delay
        self.fingerprint = folder_fingerprint(path)
        return delay

    def wait_s(self, now: float, path: Path) -> float:
        """Seconds until a request may retry (0: now); a changed folder resets the count."""
        if self.failures == 0 or now >= self.retry_at:
            return 0.0
        if folder_fingerprint(path) != self.fingerprint:
            self.reset()
            return 0.0
        return self.retry_at - now

    def reset(self) -> None:
        """Forget the failures (a success, an explicit load, new files)."""
        self.failures = 0
        self.retry_at = 0.0
        self.fingerprint = None
