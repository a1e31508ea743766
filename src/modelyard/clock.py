"""Where the server reads the time: a small ``Clock`` protocol, so tests can inject their own.

Deadlines, breaker cool-downs and queue waits are all measured on a monotonic clock
(``time.monotonic()``), never the wall clock, which jumps when the system time changes.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of monotonic time in seconds."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (its origin is arbitrary)."""
        ...


class MonotonicClock:
    """The real clock: :func:`time.monotonic`, the same clock asyncio's event loop uses."""

    def monotonic(self) -> float:
        """Seconds from :func:`time.monotonic`."""
        return time.monotonic()
