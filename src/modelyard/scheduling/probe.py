"""Probes: how an early rejection that refuses everything finds out it is wrong.

The wait estimate is fed only by calls it lets through; an estimate past every deadline
would let none through and never change. So an idle model (nothing queued or running:
the probe delays no one) that would refuse a request admits it instead, at most once per
:data:`PROBE_INTERVAL_S`, as a circuit breaker's half-open state lets one call through.
The probe's call is the next one measured, and its measurement replaces the one that
refused it rather than being averaged in.
"""

from __future__ import annotations

import math

__all__ = ["PROBE_INTERVAL_S", "Prober"]

PROBE_INTERVAL_S = 1.0
"""Least time between two probes of one model."""


class Prober:
    """One model's probes: when one may be admitted, and whether a call measured is one."""

    def __init__(self, interval_s: float = PROBE_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._last = -math.inf
        self._out = False
        self.count = 0
        """Probes admitted."""

    def admit(self, now: float, *, idle: bool) -> bool:
        """True when a request admission would refuse at ``now`` is admitted as a probe."""
        if not idle or now - self._last < self._interval_s:
            return False
        self._last = now
        self._out = True
        self.count += 1
        return True

    def measured(self) -> bool:
        """Called for each call measured: True (once) for the probe's."""
        out, self._out = self._out, False
        return out
