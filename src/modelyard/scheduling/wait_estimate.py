"""How long a new request would take: measured service times and the queue ahead of it.

A request's *latency estimate* is the time until its answer if it were queued now:

* the time until a model slot frees (zero when one is free; otherwise the shortest
  remainder of the running calls, each expected to take its batch size's service time);
* plus the service time of every batch needed to run the rows queued ahead of it (those
  of equal or better effective priority) and its own rows, in batches of the current
  batch-size cap, divided among ``max_concurrency`` slots;
* all divided by the share of the model that more important classes leave (:func:`share_left`):
  requests of a better priority that arrive while it waits go first, so a class behind
  busy ones waits longer than its queue alone says (the M/G/1 priority-queue result).

Service times are measured, not declared: a smoothed (EWMA) compute time per batch size,
from every model call that returned an answer. A size not seen yet is predicted from the
nearest larger size seen, or else the largest smaller one scaled linearly (pessimistic:
batching is sublinear). Before the first call nothing is known and no estimate is made,
so a model is never refused on a guess.

The module is pure and synchronous; :mod:`~modelyard.scheduling.degradation` turns the
estimate into refusals.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "MIN_SHARE",
    "RunningCall",
    "ServiceTimes",
    "admission_bound_s",
    "estimate_latency_s",
    "share_left",
]

_ALPHA = 0.2
MIN_SHARE = 0.1
"""The least share of the model a class is assumed to keep, however busy the classes
above it are (the estimate is divided by the share: this bounds the division)."""


class ServiceTimes:
    """Smoothed compute seconds per batch size (rows), measured from model calls."""

    def __init__(self, alpha: float = _ALPHA) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self._alpha = alpha
        self._by_rows: dict[int, float] = {}
        self.upper_s: float | None = None
        """The largest per-size service time: ``predict_s(rows) <= upper_s * rows`` for any
        ``rows >= 1`` (None before any measurement). Admission uses it to skip the estimate
        when no estimate could come near a request's deadline."""
        self.largest_rows = 0
        """The largest batch size measured: ``predict_s(rows) <= upper_s`` for any
        ``rows <= largest_rows`` (the size itself or the nearest larger one seen), which
        lets :func:`admission_bound_s` count batches instead of rows."""

    @property
    def is_known(self) -> bool:
        """True once at least one call was measured."""
        return bool(self._by_rows)

    def observe(self, rows: int, compute_s: float) -> None:
        """Take in one model call of ``rows`` rows that took ``compute_s`` seconds."""
        if rows < 1 or compute_s < 0:
            return
        old = self._by_rows.get(rows)
        by_rows = self._by_rows
        by_rows[rows] = compute_s if old is None else old + self._alpha * (compute_s - old)
        if rows > self.largest_rows:
            self.largest_rows = rows
        self.upper_s = max(by_rows.values()) if len(by_rows) > 1 else by_rows[rows]

    def predict_s(self, rows: int) -> float | None:
        """Expected compute seconds of a call of ``rows`` rows; None before any measurement."""
        if rows in self._by_rows:
            return self._by_rows[rows]
        larger = [size for size in self._by_rows if size > rows]
        if larger:
            return self._by_rows[min(larger)]
        smaller = [size for size in self._by_rows if size < rows]
        if smaller:
            size = max(smaller)
            return self._by_rows[size] * rows / size
        return None


@dataclass(frozen=True, slots=True)
class RunningCall:
    """A model call in flight: when it started and how many rows it carries."""

    started: float
    rows: int


def estimate_latency_s(
    service: ServiceTimes,
    *,
    now: float,
    rows_ahead: int,
    own_rows: int,
    batch_cap: int,
    concurrency: int,
    running: Iterable[RunningCall],
) -> float | None:
    """Seconds until a request of ``own_rows`` queued now behind ``rows_ahead`` is answered.

    ``batch_cap`` is the most rows one call takes (1 without batching), ``concurrency`` the
    calls that may run at once, ``running`` the calls in flight. None when no service time
    is known yet.
    """
    cap = max(1, batch_cap)
    full_s = service.predict_s(cap)
    if full_s is None:
        return None
    calls = list(running)
    busy_s = 0.0
    if len(calls) >= concurrency:
        remaining: list[float] = []
        for call in calls:
            expected = service.predict_s(call.rows)
            remaining.append(max(0.0, call.started + (expected or 0.0) - now))
        busy_s = min(remaining)
    rows = max(0, rows_ahead) + max(1, own_rows)
    full, rest = divmod(rows, cap)
    work_s = full * full_s
    if rest:
        work_s += service.predict_s(rest) or 0.0
    return busy_s + work_s / max(1, concurrency)


def share_left(higher_rows_per_s: float, service: ServiceTimes, batch_cap: int) -> float:
    """The share of the model left to a class when more important classes bring
    ``higher_rows_per_s`` rows per second (one minus their load, at least :data:`MIN_SHARE`)."""
    cap = max(1, batch_cap)
    full_s = service.predict_s(cap)
    if full_s is None or higher_rows_per_s <= 0:
        return 1.0
    load = higher_rows_per_s * full_s / cap
    return max(MIN_SHARE, 1.0 - load)


def admission_bound_s(
    service: ServiceTimes,
    *,
    queued_rows: int,
    own_rows: int,
    running_rows: Iterable[int],
    batch_cap: int,
) -> float | None:
    """An upper bound on a request's estimated latency divided by any share of the model
    (at least :data:`MIN_SHARE`) plus the slack of its own call: what admission compares
    with the deadline; None before any measurement.

    Cheap (no walk over the queue): ``queued_rows`` is every queued row, whatever its
    priority, ``running_rows`` the rows of each call in flight. With ``U`` the largest
    per-size service time and ``K`` the largest size measured, any call of ``r`` rows is
    predicted at most ``U * max(1, r / K)``. So the wait for a slot is at most that of any
    one running call, the queue and the request take ``ceil(rows / cap)`` calls of at most
    ``U * max(1, cap / K)`` each (the same calls :func:`estimate_latency_s` counts), and
    the slack is at most ``U * max(1, own / K)``. Counting batches rather than rows is
    what keeps a batched model with a long call (MiniLM: ~45 ms for 8 rows, 16 requests
    outstanding) under the default 10 s deadline's margin, so busy admission skips the
    estimate; the row-by-row bound, ``U * ((rows + running) / MIN_SHARE + own)``, is the
    tighter one without batching and is taken when it is.
    """
    upper_s = service.upper_s
    if upper_s is None:
        return None
    largest = max(1, service.largest_rows)
    cap = max(1, batch_cap)
    own = max(1, own_rows)
    calls = [max(0, rows) for rows in running_rows]
    rows = max(0, queued_rows) + own
    busy_s = upper_s * max(1.0, min(calls) / largest) if calls else 0.0
    work_s = -(-rows // cap) * upper_s * max(1.0, cap / largest)
    slack_s = upper_s * max(1.0, own / largest)
    by_batch_s = (busy_s + work_s) / MIN_SHARE + slack_s
    by_row_s = upper_s * ((rows + sum(max(1, r) for r in calls)) / MIN_SHARE + own)
    return min(by_batch_s, by_row_s)
