"""A labelled Prometheus histogram whose ``observe`` costs a bisect and two additions.

``prometheus_client.Histogram`` takes a lock per value it touches and scans its buckets
in Python: about 5 µs an observation, and an inference request makes five of them
(request, queue and compute durations, batch rows and batch compute time), a tenth of
the server's Python work per request (BENCHMARKS.md section 5). The server observes from
its event loop thread only, so no lock is needed: :class:`FastHistogram` keeps plain
per-bucket counts and builds the cumulative buckets when ``/metrics`` is scraped. The
exposition is a standard histogram family (``_bucket``, ``_count``, ``_sum``) under the
same name, help text and labels.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["FastHistogram", "HistogramChild"]


class HistogramChild:
    """The observations of one label set; call :meth:`observe` from one thread."""

    __slots__ = ("_bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        """Observations per bucket (not cumulative); the last is above every bound."""
        self.total = 0.0
        """Sum of the observed values."""

    def observe(self, value: float) -> None:
        """Count ``value`` in the first bucket whose upper bound is at least ``value``."""
        # bisect_left: a value equal to a bound belongs to that bound's bucket (le="...").
        self.counts[bisect_left(self._bounds, value)] += 1
        self.total += value

    def observe_each(self, values: Iterable[float]) -> None:
        """:meth:`observe` for each of ``values``, in order (one call for a batch)."""
        counts, bounds, total = self.counts, self._bounds, self.total
        for value in values:
            counts[bisect_left(bounds, value)] += 1
            total += value
        self.total = total

    def observe_repeated(self, value: float, times: int) -> None:
        """:meth:`observe` of ``value`` ``times`` times (the same sum, added in turn)."""
        if times <= 0:
            return
        self.counts[bisect_left(self._bounds, value)] += times
        total = self.total
        for _ in range(times):
            total += value
        self.total = total


class FastHistogram(Collector):
    """A histogram metric with labels, registered on ``registry`` (see the module docstring)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = tuple(float(b) for b in buckets)
        if not bounds or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram {name!r}: buckets must be distinct and increasing")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._bounds = bounds
        self._le = [repr(b) for b in bounds]  # as prometheus_client writes them: "0.5", "1.0"
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> HistogramChild:
        """The child of one label set (created on first use); cache it on hot paths."""
        if len(values) != len(self.labelnames):
            raise ValueError(f"histogram {self.name!r} takes labels {self.labelnames}")
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = HistogramChild(self._bounds)
        return child

    def describe(self) -> list[Metric]:
        """The family without samples: lets the registry check names without collecting."""
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[Metric]:
        """One histogram family with every label set's cumulative buckets, count and sum."""
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in list(self._children.items()):
            counts, running = list(child.counts), 0
            buckets: list[tuple[str, float]] = []
            for le, count in zip([*self._le, "+Inf"], counts, strict=True):
                running += count
                buckets.append((le, float(running)))
            family.add_metric(list(key), buckets, child.total)
        yield family
