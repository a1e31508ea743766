"""RecentTraffic: per-second request counts, p50/p99 latency and cold starts of one version,
and for generative models the time to first token and the tokens generated.

The dashboard draws these. No background task: a second is summarised when the next
one starts, or when the buffer is read.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

_SAMPLE_CAP = 1024
"""Latencies kept per model version per second; beyond it a uniform reservoir sample."""


_Summary = tuple[int, int, int, float | None, float | None, int, float | None, int]
"""requests, errors, cold starts, p50, p99, client errors, p50 TTFT, generated tokens."""
_EMPTY: _Summary = (0, 0, 0, None, None, 0, None, 0)


@dataclass(slots=True)
class _Second:
    second: int
    requests: int = 0
    errors: int = 0
    client_errors: int = 0
    cold_starts: int = 0
    tokens: int = 0
    latencies_s: list[float] = field(default_factory=list)
    ttfts_s: list[float] = field(default_factory=list)

    def add(self, latency_s: float) -> None:
        self.requests += 1
        if len(self.latencies_s) < _SAMPLE_CAP:
            self.latencies_s.append(latency_s)
        else:
            slot = int(random.random() * self.requests)
            if slot < _SAMPLE_CAP:
                self.latencies_s[slot] = latency_s

    def summary(self) -> _Summary:
        ordered = sorted(self.latencies_s)
        return (
            self.requests,
            self.errors,
            self.cold_starts,
            _quantile(ordered, 0.50),
            _quantile(ordered, 0.99),
            self.client_errors,
            _quantile(sorted(self.ttfts_s), 0.50),
            self.tokens,
        )


def _quantile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class RecentTraffic:
    """One model version's requests per second over the last ``horizon_s`` seconds."""

    def __init__(self, horizon_s: int) -> None:
        self._closed: deque[tuple[int, _Summary]] = deque(maxlen=horizon_s)
        self._open: _Second | None = None

    def _at(self, second: int) -> _Second:
        current = self._open
        if current is None or current.second != second:
            if current is not None:
                self._closed.append((current.second, current.summary()))
            current = self._open = _Second(second)
        return current

    def request(
        self, second: int, latency_s: float, *, is_error: bool, is_client_error: bool = False
    ) -> None:
        """Count one answered request: ``is_error`` for the model's or server's failures,
        ``is_client_error`` for the caller's own mistakes (counted apart)."""
        bucket = self._at(second)
        bucket.add(latency_s)
        bucket.errors += is_error
        bucket.client_errors += is_client_error

    def succeeded(self, second: int, latency_s: float) -> None:
        """:meth:`request` for a success (the common case, counted in batches by the
        metrics' fold): the current second's bucket without a call to find it."""
        bucket = self._open
        if bucket is None or bucket.second != second:
            bucket = self._at(second)
        bucket.add(latency_s)

    def generation(self, second: int, ttft_s: float, tokens: int) -> None:
        """Count one generation stream that ended: its time to first token and tokens."""
        bucket = self._at(second)
        if len(bucket.ttfts_s) < _SAMPLE_CAP:
            bucket.ttfts_s.append(ttft_s)
        bucket.tokens += tokens

    def cold_start(self, second: int) -> None:
        """Count one request that waited for a load."""
        self._at(second).cold_starts += 1

    def window(self, end_second: int, length_s: int) -> dict[str, list[Any]]:
        """The ``length_s`` whole seconds before ``end_second``, oldest first, gaps as 0."""
        if self._open is not None and self._open.second < end_second:
            self._closed.append((self._open.second, self._open.summary()))
            self._open = None
        start = end_second - length_s
        by_second = {s: row for s, row in self._closed if start <= s < end_second}
        rows = [by_second.get(s, _EMPTY) for s in range(start, end_second)]
        return {
            "requests": [r[0] for r in rows],
            "errors": [r[1] for r in rows],
            "client_errors": [r[5] for r in rows],
            "cold_starts": [r[2] for r in rows],
            "p50_s": [r[3] for r in rows],
            "p99_s": [r[4] for r in rows],
            "ttft_p50_s": [r[6] for r in rows],
            "tokens": [r[7] for r in rows],
        }
