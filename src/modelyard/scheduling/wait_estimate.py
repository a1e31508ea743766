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

Service times are measured, not declared: per batch-size bucket (powers of two: 1,
2-3, 4-7, ...) a smoothed (EWMA) compute time and the smoothed row count it was measured
at, from every model call that returned an answer. A size between two measured buckets is
interpolated linearly between them; a size below the smallest is scaled down through zero
(``t * rows / size``); a size above the largest measured is predicted at the largest one's
time, a lower bound (a call never gets faster with more rows). So a request is never
refused on an extrapolation: one slow call of 4,500 rows says nothing bad about one row,
and a batch bigger than any seen is judged on what was seen (a request too big for a
model is refused by the model's ``max_request_rows``, not by a guess). Before the first
call nothing is known and no estimate is made.

Evidence ages. With a clock, a sample older than :data:`FRESH_S` counts for less: the
prediction decays with half-life :data:`STALE_HALF_LIFE_S` toward zero ("not known"),
and the next measurement of a bucket replaces a stale value rather than averaging with
it. An estimate that refuses every request therefore comes down by itself with time
(nothing runs, nothing is measured, the figure fades), and the first request then
admitted brings fresh evidence (see also the scheduler's probe).

The module is pure and synchronous; :mod:`~modelyard.scheduling.degradation` turns the
estimate into refusals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from modelyard.clock import Clock

__all__ = [
    "FRESH_S",
    "MIN_SHARE",
    "STALE_HALF_LIFE_S",
    "RunningCall",
    "ServiceTimes",
    "admission_bound_s",
    "estimate_latency_s",
    "share_left",
]

_ALPHA = 0.2
FRESH_S = 1.0
"""Measurements this recent count in full; older ones decay (see the module docstring)."""
STALE_HALF_LIFE_S = 2.0
"""Half-life of a stale measurement's weight: an estimate no call refreshes halves every
this many seconds, so a model that refuses everything admits again within seconds."""
MIN_SHARE = 0.1
"""The least share of the model a class is assumed to keep, however busy the classes
above it are (the estimate is divided by the share: this bounds the division)."""


class ServiceTimes:
    """Smoothed compute seconds per batch-size bucket, measured from model calls; see the
    module docstring."""

    def __init__(
        self,
        alpha: float = _ALPHA,
        *,
        clock: Clock | None = None,
        half_life_s: float = STALE_HALF_LIFE_S,
    ) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if half_life_s <= 0:
            raise ValueError(f"half_life_s must be > 0, got {half_life_s}")
        self._alpha = alpha
        self._clock = clock
        self._half_life_s = half_life_s
        self._buckets: dict[int, _Bucket] = {}
        self._keys: list[int] = []
        """The bucket keys (``rows.bit_length()``), sorted."""
        self._points: list[tuple[float, float]] = []
        """``(rows, seconds)`` of each bucket, in the order of ``_keys`` (so by rows): what
        predictions interpolate."""
        self._last_at = 0.0
        """Clock time of the latest measurement (any bucket)."""
        self.upper_s: float | None = None
        """The largest per-bucket service time, undecayed: ``predict_s(rows) <= upper_s``
        for any ``rows`` (None before any measurement). Admission uses it to skip the
        estimate when no estimate could come near a request's deadline."""
        self.largest_rows = 0
        """The largest batch size measured (``predict_s(rows) <= upper_s`` for any size:
        :func:`admission_bound_s` counts batches of at most this many rows)."""

    @property
    def is_known(self) -> bool:
        """True once at least one call was measured."""
        return bool(self._buckets)

    def observe(self, rows: int, compute_s: float, *, replace: bool = False) -> None:
        """Take in one model call of ``rows`` rows that took ``compute_s`` seconds;
        ``replace``: it replaces its bucket's value instead of being averaged in (a
        probe's call: the evidence the estimate that refused it lacked)."""
        if rows < 1 or compute_s < 0:
            return
        now = self._clock.monotonic() if self._clock is not None else 0.0
        key = rows.bit_length()
        bucket = self._buckets.get(key)
        before = -math.inf  # the bucket's value before this call
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(rows), compute_s, now)
            # Buckets hold disjoint row ranges: sorted by key is sorted by rows, for good.
            self._keys = sorted(self._buckets)
            self._points = [(self._buckets[k].rows, self._buckets[k].seconds) for k in self._keys]
        else:
            alpha = 1.0 if replace else self._alpha
            before = bucket.seconds
            age_s = now - bucket.at
            if age_s > FRESH_S:
                # Fresh evidence weighs more the older the bucket's: a stale value is replaced.
                alpha = max(alpha, 1.0 - 0.5 ** (age_s / self._half_life_s))
            bucket.rows += alpha * (rows - bucket.rows)
            bucket.seconds += alpha * (compute_s - bucket.seconds)
            bucket.at = now
            self._points[self._keys.index(key)] = (bucket.rows, bucket.seconds)
        self._last_at = now
        if rows > self.largest_rows:
            self.largest_rows = rows
        upper = self.upper_s
        if upper is None or bucket.seconds >= upper or len(self._points) == 1:
            self.upper_s = bucket.seconds
        elif before >= upper:  # the largest fell: another bucket may be the largest now
            self.upper_s = max(seconds for _, seconds in self._points)
        # else: it neither was nor is the largest, which stands (most calls, per batch)

    def freshness(self) -> float:
        """The weight left to the measurements now: 1 while fresh (or without a clock),
        halving every half-life once the latest is older than :data:`FRESH_S`."""
        if self._clock is None:
            return 1.0
        stale_s = self._clock.monotonic() - self._last_at - FRESH_S
        if stale_s <= 0:
            return 1.0
        return float(0.5 ** (stale_s / self._half_life_s))

    def predict_s(self, rows: int) -> float | None:
        """Expected compute seconds of a call of ``rows`` rows, decayed by
        :meth:`freshness`; None before any measurement."""
        points = self._points
        if not points:
            return None
        rows = max(1, rows)
        low_rows, low_s = points[0]
        if rows <= low_rows:
            seconds = low_s * rows / low_rows
        elif rows >= points[-1][0]:
            seconds = points[-1][1]  # a lower bound: never extrapolated upward
        else:
            seconds = low_s
            for high_rows, high_s in points[1:]:
                if rows <= high_rows:
                    share = (rows - low_rows) / (high_rows - low_rows)
                    seconds = low_s + share * (high_s - low_s)
                    break
                low_rows, low_s = high_rows, high_s
        return seconds * self.freshness()


@dataclass(slots=True)
class _Bucket:
    """One batch-size bucket: smoothed rows and seconds, and when last measured."""

    rows: float
    seconds: float
    at: float


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
    calls that may run at once, ``running`` the calls in flight (``own_rows`` 0: the wait
    until the request's call would start). None when no service time is known yet.
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
    rows = max(0, rows_ahead) + max(0, own_rows)
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
    # max(1, x) and max(0, x) written as conditionals: this runs on every request.
    largest = service.largest_rows if service.largest_rows > 1 else 1
    cap = batch_cap if batch_cap > 1 else 1
    own = own_rows if own_rows > 1 else 1
    rows = (queued_rows if queued_rows > 0 else 0) + own
    busy_s = 0.0
    running = 0
    shortest = -1
    for r in running_rows:
        if r < 0:
            r = 0
        if shortest < 0 or r < shortest:
            shortest = r
        running += r if r > 1 else 1
    if shortest >= 0:
        ratio = shortest / largest
        busy_s = upper_s * (ratio if ratio > 1.0 else 1.0)
    ratio = cap / largest
    work_s = -(-rows // cap) * upper_s * (ratio if ratio > 1.0 else 1.0)
    ratio = own / largest
    slack_s = upper_s * (ratio if ratio > 1.0 else 1.0)
    by_batch_s = (busy_s + work_s) / MIN_SHARE + slack_s
    by_row_s = upper_s * ((rows + running) / MIN_SHARE + own)
    return by_batch_s if by_batch_s < by_row_s else by_row_s
