"""Per-model request episodes by time of day, and how much more (or less) a model is
asked for in the coming window than on average over the day.

Used by the ``arrival-cost`` eviction policy and, through it, by the hot-model rule
(:mod:`modelyard.manager.eviction`). A model used only by day has the same decayed rate
at dusk as at noon; its gap histogram learns that it sleeps only once it has been idle
for a while, and meanwhile it holds memory the night's models need (issue 16: on the
diurnal trace, the policy's largest loss against Belady's MIN). Counting each model's
episodes in bins of the day tells that the night has come the moment it does. Pure; no
I/O.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

DAY_S = 86_400.0
MIN_SHARED_BINS = 5
"""The days' agreement is the weight once this many bins have been seen whole on an
even and an odd day (before: :meth:`TimeOfDay.dispersion`). Within one half of a
day/night cycle the bins of two days agree only by chance; the agreement means something
once the second day has seen both halves of the first."""
MIN_EPISODES = 10.0
"""A model counts in :meth:`TimeOfDay.dispersion` from this many episodes (fewer say
little about their spread)."""


class TimeOfDay:
    """Episodes per model in ``bins`` equal bins of a ``period_s`` cycle.

    ``factor(key, now)`` is the share of ``key``'s episodes that fell in the window
    from now's bin to ``ahead`` bins later, divided by the window's share of the day:
    1 for a model asked for evenly round the clock, about 2 for one asked for only in
    the half of the day that is now, near 0 for one that sleeps now. It is 1 until a
    whole period has been seen (nothing is known of the rest of the day before), and
    shrunk toward 1 as if ``prior`` more episodes had been spread evenly.

    Any steady clock will do (the manager's is monotonic): the bins need not start at
    midnight, only the period must be the traffic's.
    """

    def __init__(
        self,
        period_s: float = DAY_S,
        *,
        bins: int = 10,
        ahead: int = 1,
        prior: float = 1.0,
        max_models: int = 10_000,
    ) -> None:
        if period_s <= 0 or bins < 1 or not 0 <= ahead < bins or prior < 0:
            raise ValueError("need period_s > 0, bins >= 1, 0 <= ahead < bins, prior >= 0")
        self.period_s = period_s
        self.bins = bins
        self.ahead = ahead
        self.prior = prior
        self._max_models = max_models
        self._start: float | None = None
        self._counts: dict[Hashable, list[float]] = {}
        self._weight = (-1.0, 0.0)
        """(as of, value) of :meth:`weight`, recomputed once per tenth of a bin."""

    def _bin(self, now: float) -> int:
        return min(self.bins - 1, int(now % self.period_s / self.period_s * self.bins))

    def observe(self, key: Hashable, now: float, weight: float = 1.0) -> None:
        """Count an episode (or ``weight`` of one) of ``key`` at ``now``."""
        if self._start is None:
            self._start = now
        counts = self._counts.get(key)
        if counts is None:
            if len(self._counts) >= self._max_models:
                return  # bounded memory: new models are then asked for evenly
            counts = self._counts[key] = [0.0] * (2 * self.bins)
        # Even periods in the first half, odd ones in the second (see :meth:`weight`).
        counts[self._bin(now) + self.bins * (int(now // self.period_s) % 2)] += weight

    def observe_run(self, key: Hashable, times: Sequence[float], weights: Sequence[float]) -> None:
        """:meth:`observe` for each of ``times`` with its weight, in order."""
        if self._start is None:
            self._start = times[0]
        counts = self._counts.get(key)
        if counts is None:
            if len(self._counts) >= self._max_models:
                return
            counts = self._counts[key] = [0.0] * (2 * self.bins)
        bins, period = self.bins, self.period_s
        if len(times) != len(weights):
            raise ValueError("observe_run needs one weight per time")
        lo, hi = min(times), max(times)
        if lo // period == hi // period:
            first = min(bins - 1, int(lo % period / period * bins))
            if first == min(bins - 1, int(hi % period / period * bins)):
                # Every time lies between two of one bin and one period (a batch of a
                # loop turn, most runs): the same cell, the same additions in order.
                at = first + bins * (int(lo // period) % 2)
                total = counts[at]
                for weight in weights:
                    total += weight
                counts[at] = total
                return
        for now, weight in zip(times, weights, strict=True):
            at = min(bins - 1, int(now % period / period * bins))
            counts[at + bins * (int(now // period) % 2)] += weight

    def factor(self, key: Hashable, now: float) -> float:
        """How many times its daily average ``key`` is asked for from now to the end of
        the window (1: no knowledge yet, or asked for evenly)."""
        counts = self._counts.get(key)
        if counts is None or self._start is None or now - self._start < self.period_s:
            return 1.0
        weight = self.weight(now)
        if weight <= 0:
            return 1.0
        first = self._bin(now)
        window = [(first + i) % self.bins for i in range(self.ahead + 1)]
        share = len(window) / self.bins
        inside = sum(counts[i] + counts[i + self.bins] for i in window) + self.prior * share
        return 1.0 + weight * (inside / (sum(counts) + self.prior) / share - 1.0)

    def weight(self, now: float) -> float:
        """How much the cycle is to be believed, 0 to 1: how well the time-of-day
        profiles of even periods (days) agree with those of odd ones, as a correlation
        pooled over every model, over the bins both have seen (from
        :data:`MIN_SHARED_BINS` such bins on; before, :meth:`dispersion`).

        Bins that differ by chance, or by bursts that fall at no particular time of day,
        differ differently from one day to the next; a daily cycle repeats. Without
        this, chance steers evictions on traffic that has no cycle at all.
        """
        asof, value = self._weight
        if 0 <= now - asof < self.period_s / self.bins / 10:
            return value
        value = 0.0
        if self._start is not None and now - self._start >= self.period_s:
            # Only bins both kinds of day have seen whole (the second may be under way).
            shared = [
                b for b in range(self.bins) if self._seen(b, 0, now) and self._seen(b, 1, now)
            ]
            if len(shared) < min(MIN_SHARED_BINS, self.bins):
                value = self.dispersion(now)
                self._weight = (now, value)
                return value
            products = even_squares = odd_squares = 0.0
            for counts in self._counts.values():
                even = [counts[b] for b in shared]
                odd = [counts[b + self.bins] for b in shared]
                mean_even, mean_odd = sum(even) / len(shared), sum(odd) / len(shared)
                for e, o in zip(even, odd, strict=True):
                    products += (e - mean_even) * (o - mean_odd)
                    even_squares += (e - mean_even) ** 2
                    odd_squares += (o - mean_odd) ** 2
            if even_squares > 0 and odd_squares > 0:
                value = max(0.0, products / math.sqrt(even_squares * odd_squares))
        self._weight = (now, value)
        return value

    def dispersion(self, now: float) -> float:
        """The weight while the days cannot be compared yet (one day seen, the second
        not past :data:`MIN_SHARED_BINS` bins): the share of the spread of the models'
        episodes over the bins that chance does not explain, ``1 - df / chi2`` pooled
        over the models with at least :data:`MIN_EPISODES` episodes, against a spread in
        proportion to the time each bin has been watched (0 to 1; 0 when chance explains
        it all).

        Poisson traffic without a cycle spreads as chance does (chi-square about its
        degrees of freedom: 0); a day/night swap puts most of the spread outside
        chance. Without it the first day's profile went unused until the second day's
        dusk, through a dawn where it was most of what eviction needed (issue 16, the
        diurnal trace; BENCHMARKS.md §17, session 8 second pass).
        """
        assert self._start is not None
        watched = [self._watched(b, now) for b in range(self.bins)]
        total = sum(watched)
        open_bins = sum(1 for w in watched if w > 0)
        chi2 = df = 0.0
        for counts in self._counts.values():
            per_bin = [counts[b] + counts[b + self.bins] for b in range(self.bins)]
            n = sum(per_bin)
            if n < MIN_EPISODES or total <= 0:
                continue
            for b, seen in enumerate(watched):
                if seen > 0:
                    expected = n * seen / total
                    chi2 += (per_bin[b] - expected) ** 2 / expected
            df += open_bins - 1
        return max(0.0, 1.0 - df / chi2) if chi2 > 0 else 0.0

    def _watched(self, b: int, now: float) -> float:
        """Seconds of bin ``b`` (over every day) between the first observation and ``now``."""
        assert self._start is not None
        width = self.period_s / self.bins
        seconds = 0.0
        day = int(self._start // self.period_s)
        while day * self.period_s <= now:
            begins = day * self.period_s + b * width
            seconds += max(0.0, min(begins + width, now) - max(begins, self._start))
            day += 1
        return seconds

    def _seen(self, b: int, parity: int, now: float) -> bool:
        """Whether bin ``b`` of some day of ``parity`` (0: even) lay wholly between the
        first observation and ``now``."""
        assert self._start is not None
        if now - self._start >= 3 * self.period_s:
            return True  # a whole day of each kind lies in between
        width = self.period_s / self.bins
        day = int(self._start // self.period_s)
        while day * self.period_s <= now:
            begins = day * self.period_s + b * width
            if day % 2 == parity and begins >= self._start and begins + width <= now:
                return True
            day += 1
        return False

    def forget(self, key: Hashable) -> None:
        """Drop ``key``'s counts."""
        self._counts.pop(key, None)
