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

    __slots__ = ("monotonic",)

    def __init__(self) -> None:
        # The C function itself, not a method calling it: the request path reads the
        # clock about eight times per request, and each Python call layer costs ~0.3 µs.
        self.monotonic = time.monotonic
        """Seconds from :func:`time.monotonic`."""
