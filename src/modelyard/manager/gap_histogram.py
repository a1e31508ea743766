"""Per-model histograms of the gaps between a model's request episodes, and what they
say about how soon it is needed again given how long it has been idle.

Used by the ``arrival-cost`` eviction policy (:mod:`modelyard.manager.eviction`). A
model called by a timer every 100 s that has been idle for 90 s is due any moment; one
whose gaps were all under 10 s and that has been idle for 200 s has probably stopped
being used. Both have the same long-run rate; the histogram tells them apart (as the
keep-alive windows of "Serverless in the Wild", Shahrad et al., ATC '20). Pure; no I/O.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Hashable

EDGES = [0.05 * (4 / 3) ** i for i in range(45)]
"""Bin upper edges: 50 ms to about 4 hours, each bin a third wider than the last."""

_MIDS = [EDGES[0] / 2] + [(a + b) / 2 for a, b in itertools.pairwise(EDGES)]
_MIDS.append(EDGES[-1] * 1.5)  # the open last bin: gaps over about 4 hours


class _Gaps:
    __slots__ = ("bins", "count", "total")

    def __init__(self) -> None:
        self.bins = [0] * (len(EDGES) + 1)
        self.count = 0
        self.total = 0.0
        """Sum of the bin midpoints of every gap: the mean gap is ``total / count``."""


class GapHistograms:
    """Gaps between requests per model, in log-spaced bins; bounded to ``max_models``.

    ``urgency(key, idle_s)`` is the model's mean gap divided by its expected remaining
    wait given ``idle_s`` (the mean of ``gap - idle_s`` over the gaps longer than
    ``idle_s``): 1 for a memoryless (Poisson) model, above 1 for one that is due (a
    timer near its period, a bursty model just after a request), below 1 for one idle
    for longer than its gaps say it should be. Estimated from few gaps, the ratio is
    shrunk toward 1 as if ``prior_gaps`` more gaps had agreed with a memoryless model.
    """

    def __init__(self, *, prior_gaps: float = 10.0, max_models: int = 10_000) -> None:
        if prior_gaps < 0:
            raise ValueError("prior_gaps must not be negative")
        self.prior_gaps = prior_gaps
        self._max_models = max_models
        self._models: dict[Hashable, _Gaps] = {}

    def add(self, key: Hashable, gap_s: float) -> None:
        """Record one gap of ``gap_s`` seconds between two requests for ``key``."""
        gaps = self._models.get(key)
        if gaps is None:
            if len(self._models) >= self._max_models:
                return  # bounded memory: new models are then memoryless
            gaps = self._models[key] = _Gaps()
        i = bisect.bisect_left(EDGES, gap_s)
        gaps.bins[i] += 1
        gaps.count += 1
        gaps.total += _MIDS[i]

    def urgency(self, key: Hashable, idle_s: float) -> float:
        """How much sooner than its average ``key`` is expected back, idle for ``idle_s``."""
        gaps = self._models.get(key)
        if gaps is None or gaps.count == 0:
            return 1.0
        mean = gaps.total / gaps.count
        i = bisect.bisect_left(EDGES, idle_s)
        longer = 0
        remaining = 0.0
        if i < len(EDGES) and gaps.bins[i]:
            # Gaps in the idle time's own bin: assume half of what is left of the bin.
            longer += gaps.bins[i]
            remaining += gaps.bins[i] * (EDGES[i] - idle_s) / 2
        for j in range(i + 1, len(gaps.bins)):
            n = gaps.bins[j]
            if n:
                longer += n
                remaining += n * (_MIDS[j] - idle_s)
        if longer == 0:
            # Idle for longer than any gap it ever had: its rate has probably fallen to
            # about one request per idle time.
            return min(1.0, mean / max(idle_s, 1e-9))
        ratio = mean / max(remaining / longer, 1e-3)
        return (longer * ratio + self.prior_gaps) / (longer + self.prior_gaps)

    def forget(self, key: Hashable) -> None:
        """Drop ``key``'s gaps."""
        self._models.pop(key, None)
