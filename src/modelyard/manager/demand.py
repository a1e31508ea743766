"""Exponentially decayed request counts per model, counted in batches off the request path."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence

__all__ = ["DEFAULT_HALF_LIFE_S", "PENDING_MAX", "DemandTracker"]

DEFAULT_HALF_LIFE_S = 60.0
"""How fast demand is forgotten: a request counts half as much after this long."""

PENDING_MAX = 256
"""Observations a :class:`DemandTracker` keeps unfolded at most (memory stays bounded
when nothing reads demand for a long time)."""

_NO_KEY: Hashable = object()
"""Stands for no key in :meth:`DemandTracker._fold` (None may be a key)."""


class DemandTracker:
    """Exponentially decayed request counts per model: recent demand, in requests.

    ``demand(k)`` is the number of requests for ``k``, each weighted by
    ``0.5 ** (age / half_life_s)``. Stored as ``(value, as of)`` pairs, decayed on read,
    so an observation is O(1) and nothing runs in the background.
    """

    def __init__(self, half_life_s: float = DEFAULT_HALF_LIFE_S) -> None:
        if half_life_s <= 0:
            raise ValueError("half_life_s must be positive")
        self.half_life_s = half_life_s
        self.scale: Callable[[Hashable, float], float] | None = None
        """What :meth:`hot` multiplies demand by unless told otherwise (the policy's
        time of day: :func:`demand_scale`, set by whoever pairs the two)."""
        self._rate = math.log(2) / half_life_s
        self._demand: dict[Hashable, tuple[float, float]] = {}
        # Observations not folded into _demand yet, in order: the request path appends,
        # every read folds first, so each read sees exactly what eager updates would give.
        self._pending: list[tuple[Hashable, Sequence[float], Sequence[float]]] = []
        """Runs ``(key, times, weights)``, folded in order."""
        self._pending_count = 0
        """Observations in ``_pending``."""
        self._requests: dict[Hashable, tuple[float, float]] = {}
        """The same decay over plain requests, whatever their weight (:meth:`top`)."""

    def observe(self, key: Hashable, now: float, weight: float = 1.0) -> None:
        """Count one request for ``key`` at ``now`` (folded in at the next read)."""
        self.observe_run(key, (now,), (weight,))

    def observe_run(self, key: Hashable, times: Sequence[float], weights: Sequence[float]) -> None:
        """Count requests for ``key`` at ``times`` (ascending), each of its ``weights``:
        the same as one :meth:`observe` per request, in order."""
        if len(times) != len(weights):
            raise ValueError("observe_run needs one weight per time")
        self._pending.append((key, times, weights))
        self._pending_count += len(times)
        if self._pending_count >= PENDING_MAX:
            self._fold()

    def _fold(self) -> None:
        pending, self._pending = self._pending, []
        self._pending_count = 0
        demand, requests, rate, exp = self._demand, self._requests, self._rate, math.exp
        # Consecutive runs of one key (a busy model's) are folded in locals: the same
        # arithmetic in the same order as one update each, with one lookup and one store
        # per key's stretch (a key's hash may be a Python call). max(0.0, gap) is written
        # as a conditional: it runs per request.
        run: Hashable = _NO_KEY
        value = since = count = 0.0
        for key, times, weights in pending:
            if key is not run:
                if run is not _NO_KEY:
                    demand[run] = (value, since)
                    requests[run] = (count, since)
                run = key
                found = demand.get(key)
                if found is None:
                    # Its first request: as if a zero demand at that time were decayed.
                    value, since, count = 0.0, times[0], 0.0
                else:
                    value, since = found
                    count = requests[key][0]
            for now, weight in zip(times, weights, strict=True):
                gap = now - since
                decay = exp(-rate * (gap if gap > 0.0 else 0.0))
                value = value * decay + weight
                count = count * decay + 1.0
                since = now
        if run is not _NO_KEY:
            demand[run] = (value, since)
            requests[run] = (count, since)

    def demand(self, key: Hashable, now: float) -> float:
        """Decayed requests of ``key`` as of ``now`` (0 if never seen)."""
        if self._pending:
            self._fold()
        value, since = self._demand.get(key, (0.0, now))
        return value * math.exp(-self._rate * max(0.0, now - since))

    def forget(self, key: Hashable) -> None:
        """Drop ``key`` (removed from the repository)."""
        if self._pending:
            self._fold()
        self._demand.pop(key, None)
        self._requests.pop(key, None)

    def top(
        self, now: float, scale: Callable[[Hashable, float], float] | None = None
    ) -> Hashable | None:
        """The model of most recent requests, counted whole whatever their weight (a
        model in steady use is the hottest even where its close requests count as one
        episode), times ``scale(key, now)`` if given (not :attr:`scale`); None if none
        is known."""
        if self._pending:
            self._fold()
        ranked = (
            (v * math.exp(-self._rate * max(0.0, now - t)) * (scale(k, now) if scale else 1.0), k)
            for k, (v, t) in self._requests.items()
        )
        best = max(ranked, key=lambda dk: dk[0], default=None)
        return None if best is None or best[0] < 1e-3 else best[1]

    def hot(
        self,
        now: float,
        fraction: float = 0.1,
        scale: Callable[[Hashable, float], float] | None = None,
    ) -> dict[Hashable, float]:
        """The top ``fraction`` of models by recent demand (at least one, if any is known),
        with their demand.

        Ranked among every model that has had a request; a model whose demand decayed
        below a thousandth of a request no longer counts as known. ``scale(key, now)``,
        if given (else :attr:`scale`), multiplies each demand first (the time of day's).
        """
        if self._pending:
            self._fold()
        scale = scale or self.scale
        ranked = [
            (self.demand(k, now) * (scale(k, now) if scale else 1.0), k) for k in self._demand
        ]
        live = [(d, k) for d, k in ranked if d >= 1e-3]
        if not live:
            return {}
        n = max(1, math.ceil(len(live) * fraction))
        live.sort(key=lambda dk: dk[0], reverse=True)
        return {k: d for d, k in live[:n]}
