"""The one fake clock of the unit tests: time moves only when a test says so."""

from __future__ import annotations


class FakeClock:
    """A :class:`modelyard.clock.Clock` that moves only when told to."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s

    def monotonic(self) -> float:
        """The current fake time in seconds."""
        return self.now_s

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self.now_s += seconds
