"""An open-loop load generator: requests leave on a fixed schedule, whatever the answers.

A closed loop (each client waits for its answer before sending again) slows down with
the server and so never overloads it; a burst is open-loop. Request ``i`` leaves at
``i / rate_per_s`` seconds after the start, its answer (or error) is recorded with its
latency, and the run waits for every answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Answer", "Post", "Shot", "open_loop", "percentile"]


@dataclass(frozen=True, slots=True)
class Shot:
    """One request of an open-loop run and what came back."""

    index: int
    priority: int
    deadline_s: float
    """The request's own deadline, seconds after it left."""
    latency_s: float
    status: int
    """HTTP status; 0 when no answer came (connection error)."""
    served_by: str | None
    """The ``x-modelyard-served-by`` header: the fallback that answered."""
    doc: dict[str, Any] | None
    """The JSON answer (None when it was not JSON)."""

    @property
    def is_ok(self) -> bool:
        """Answered with 200."""
        return self.status == 200

    @property
    def is_good(self) -> bool:
        """Answered with 200 within its deadline (what goodput counts)."""
        return self.status == 200 and self.latency_s <= self.deadline_s


Request = Callable[[int], tuple[str, dict[str, Any], int, float]]
"""``i`` -> ``(path, JSON body, priority, deadline_s)`` of request ``i``."""

Answer = tuple[int, dict[str, Any] | None, str | None]
"""``(HTTP status, JSON answer or None, x-modelyard-served-by or None)``; status 0: none."""

Post = Callable[[str, dict[str, Any]], Awaitable[Answer]]
"""Sends one JSON body to a path; the caller's HTTP client (httpx, aiohttp) behind it."""


async def open_loop(
    post: Post, request: Request, *, rate_per_s: float, duration_s: float
) -> list[Shot]:
    """Send ``rate_per_s * duration_s`` requests on schedule; every :class:`Shot`, in order."""
    count = max(1, round(rate_per_s * duration_s))
    start = time.perf_counter()

    async def one(i: int) -> Shot:
        path, body, priority, deadline_s = request(i)
        delay = start + i / rate_per_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sent = time.perf_counter()
        status, doc, served_by = await post(path, body)
        latency = time.perf_counter() - sent
        return Shot(i, priority, deadline_s, latency, status, served_by, doc)

    return list(await asyncio.gather(*(one(i) for i in range(count))))


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1, nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))
    return ordered[rank]
