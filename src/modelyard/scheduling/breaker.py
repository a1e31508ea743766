"""A per-model circuit breaker: fail fast while a model keeps failing, then probe it.

States::

    CLOSED ──(failures / outcomes >= failure_ratio, outcomes >= min_calls)──► OPEN
    OPEN ──(cooldown_s passed)──► HALF_OPEN
    HALF_OPEN ──(a probe succeeds)──► CLOSED      (the window starts empty)
    HALF_OPEN ──(a probe fails)──► OPEN            (for another cooldown_s)

While CLOSED the breaker keeps the last ``window`` outcomes, one per model call. While
OPEN every admission is refused. While HALF_OPEN at most ``half_open_probes`` admitted
requests (probes) are in flight; the first probe outcome decides.

Each admission returns a :class:`Permit` stamped with the breaker's *generation*, which
changes at every transition. An outcome counts only if it carries a permit of the current
generation, so a slow call admitted before the breaker opened cannot close it again, nor
fill the fresh window after it closed. Probes that end without an outcome that says
anything about the model (the client left, the deadline passed while queued) must be
handed back with :meth:`CircuitBreaker.release`, or the breaker would stay half-open.

The class is pure and synchronous: time comes from the injected :class:`Clock`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from modelyard.clock import Clock
from modelyard.scheduling.config import BreakerConfig


class BreakerState(StrEnum):
    """Where the breaker stands."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class Permit:
    """Proof that the breaker admitted one request; hand it back with the outcome."""

    generation: int
    """The breaker's generation when the request was admitted."""
    is_probe: bool
    """True when admitted while half-open."""


class CircuitBreaker:
    """Closed / open / half-open breaker over a sliding window of outcomes."""

    def __init__(self, config: BreakerConfig, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self._state = BreakerState.CLOSED
        self.is_closed = True
        """``state is CLOSED``, read without the property (the request path's check)."""
        self._generation = 0
        self._permit = Permit(0, is_probe=False)
        """The closed state's permit of the current generation: immutable, so shared."""
        self._outcomes: deque[bool] = deque(maxlen=config.window)  # True = failure
        self._failures = 0
        self._opened_until: float | None = None
        self._probes_in_flight = 0
        self.times_opened = 0
        """How many times the breaker has opened (for metrics)."""
        self.on_change: Callable[[BreakerState, BreakerState], None] | None = None
        """Called with ``(old, new)`` on every explicit transition (for logs and events)."""

    @property
    def state(self) -> BreakerState:
        """The current state; an open breaker whose cool-down has passed is half-open."""
        if (
            self._state is BreakerState.OPEN
            and self._opened_until is not None
            and self._clock.monotonic() >= self._opened_until
        ):
            self._transition(BreakerState.HALF_OPEN)
        return self._state

    @property
    def opened_until(self) -> float | None:
        """Monotonic time the cool-down ends, while open; otherwise None."""
        return self._opened_until if self.state is BreakerState.OPEN else None

    def retry_after_s(self) -> float:
        """Seconds a refused client should wait before trying again."""
        until = self.opened_until
        if until is not None:
            return max(0.0, until - self._clock.monotonic())
        # Half-open with every probe slot taken: the probes answer soon, one way or the other.
        return min(self._config.cooldown_s, 1.0)

    def admit(self) -> Permit | None:
        """A permit for one request, or None when the request must be refused."""
        if self.is_closed:  # closed never turns into anything by itself (open does)
            return self._permit
        state = self.state
        if state is BreakerState.CLOSED:
            return self._permit
        if state is BreakerState.HALF_OPEN and (
            self._probes_in_flight < self._config.half_open_probes
        ):
            self._probes_in_flight += 1
            return Permit(self._generation, is_probe=True)
        return None

    def may_run(self, permit: Permit) -> bool:
        """Whether a queued request admitted with ``permit`` may still reach the model.

        While the breaker is open, nothing may; while half-open, only current probes.
        """
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        return (
            state is BreakerState.HALF_OPEN
            and permit.is_probe
            and permit.generation == self._generation
        )

    def record(self, *, failed: bool, permits: Iterable[Permit]) -> None:
        """Record the outcome of one model call made for the requests holding ``permits``.

        ``failed`` is True only for failures that are the model's fault.
        """
        generation = self._generation
        if self.is_closed:  # most calls: one outcome if any permit is of this generation
            for permit in permits:
                if permit.generation == generation:
                    self._add_outcome(failed)
                    return
            return
        current = [p for p in permits if p.generation == generation]
        if not current:
            return  # admitted under an earlier generation: says nothing about now
        state = self.state
        if state is BreakerState.CLOSED:
            self._add_outcome(failed)
        elif state is BreakerState.HALF_OPEN and any(p.is_probe for p in current):
            self._transition(BreakerState.OPEN if failed else BreakerState.CLOSED)

    def record_one(self, *, failed: bool, permit: Permit) -> None:
        """:meth:`record` for a call made for one request (the scheduler's direct path)."""
        if permit.generation != self._generation:
            return  # admitted under an earlier generation: says nothing about now
        if self.is_closed:
            self._add_outcome(failed)
            return
        state = self.state
        if state is BreakerState.CLOSED:
            self._add_outcome(failed)
        elif state is BreakerState.HALF_OPEN and permit.is_probe:
            self._transition(BreakerState.OPEN if failed else BreakerState.CLOSED)

    def release(self, permits: Iterable[Permit]) -> None:
        """Hand back permits whose requests ended without an outcome that counts."""
        if self.state is not BreakerState.HALF_OPEN:
            return
        for permit in permits:
            if permit.is_probe and permit.generation == self._generation:
                self._probes_in_flight = max(0, self._probes_in_flight - 1)

    def snapshot(self) -> dict[str, object]:
        """State, cool-down end and window contents, for stats and metrics."""
        state = self.state
        return {
            "state": str(state),
            "opened_until": self._opened_until if state is BreakerState.OPEN else None,
            "window_outcomes": len(self._outcomes),
            "window_failures": self._failures,
            "probes_in_flight": self._probes_in_flight,
            "times_opened": self.times_opened,
        }

    def _add_outcome(self, failed: bool) -> None:
        if len(self._outcomes) == self._outcomes.maxlen and self._outcomes[0]:
            self._failures -= 1
        self._outcomes.append(failed)
        self._failures += failed
        n = len(self._outcomes)
        if n >= self._config.min_calls and self._failures / n >= self._config.failure_ratio:
            self._transition(BreakerState.OPEN)

    def _transition(self, state: BreakerState) -> None:
        old = self._state
        self._state = state
        self.is_closed = state is BreakerState.CLOSED
        self._generation += 1
        self._permit = Permit(self._generation, is_probe=False)
        self._probes_in_flight = 0
        self._outcomes.clear()
        self._failures = 0
        if state is BreakerState.OPEN:
            self._opened_until = self._clock.monotonic() + self._config.cooldown_s
            self.times_opened += 1
        else:
            self._opened_until = None
        if self.on_change is not None and old is not state:
            self.on_change(old, state)
