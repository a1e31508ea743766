"""Pre-warm windows from per-model idle-time histograms ("Serverless in the Wild").

Shahrad et al. (ATC '20) keep, per function, a histogram of its idle times (the gaps
between invocations). When the histogram is representative, its head percentile is a
*pre-warm window* (nothing will call the function sooner: unload it, and load it again
just before that much idle time has passed) and its tail percentile closes a *keep-alive
window* (if nothing came by then, the pattern broke). Timer-triggered functions, a fifth
of Azure's, are the case where the window is narrow: a model called every 300 s with 2 %
jitter is certain to be asked for between 294 and 306 s after its last call, and can be
loaded just before, so its request never waits for the load.

:class:`PrewarmWindows` keeps each model's last idle times exactly (a histogram of
``keep`` samples; exact values rather than bins, since a narrow window is the whole
point) and trusts a model's window only when the gaps agree: at least ``min_gaps`` of
them, and the tail at most ``spread`` times the head. Memoryless arrivals (a Zipf mix of
independent requests) essentially never pass: four exponential gaps lie within a factor
of 1.25 of each other about once in a thousand draws. Pure; no I/O.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

HEAD = 0.05
"""The percentile of idle times that opens the pre-warm window."""
TAIL = 0.99
"""... and the one that closes the keep-alive window."""


BEFORE = 0.01
"""What a model that will be pre-warmed is worth before its pre-warm time, relative."""
DURING = 100.0
"""... and from its pre-warm time to the end of its window."""


@dataclass(frozen=True, slots=True)
class Window:
    """When a model is expected next: between ``opens`` and ``closes`` (absolute times)."""

    model: str
    opens: float
    closes: float
    probability: float
    """P(a request inside the window): gaps seen inside it, over one more than seen."""
    gaps: int


@dataclass
class _Model:
    name: str
    last: float
    gaps: deque[float]
    lead_s: float = 0.0
    window: Window | None = None
    """The window from the last request (None: the gaps do not agree)."""


class PrewarmWindows:
    """Per-model idle times, and the models whose pre-warm window is about to open.

    ``observe(model, now, lead_s)`` records a request and, when the model's gaps agree,
    schedules it to be due ``lead_s`` before its window opens (``lead_s``: how long its
    load takes, with a margin). ``due(now)`` returns the models due and not yet asked for
    again, until their window closes. Bounded: ``max_models`` models, ``keep`` gaps each.
    """

    def __init__(
        self,
        *,
        keep: int = 16,
        min_gaps: int = 5,
        spread: float = 1.25,
        max_models: int = 10_000,
    ) -> None:
        if keep < min_gaps or min_gaps < 2 or spread < 1:
            raise ValueError("need keep >= min_gaps >= 2 and spread >= 1")
        self.keep = keep
        self.min_gaps = min_gaps
        self.spread = spread
        self._max_models = max_models
        self._models: dict[str, _Model] = {}
        self._heap: list[tuple[float, float, str]] = []
        """(due at, the request it was scheduled after, model): lazily invalidated."""
        self._due: dict[str, Window] = {}

    def observe(self, model: str, now: float, lead_s: float | Callable[[str], float] = 0.0) -> None:
        """Record a request for ``model`` at ``now``; schedule its next pre-warm.

        ``lead_s`` may be a function of the model, asked only when a window opens (the
        prefetcher's looks the model up; most requests need no lead at all)."""
        self.observe_run(model, (now,), lead_s)

    def observe_run(
        self, model: str, times: Sequence[float], lead_s: float | Callable[[str], float] = 0.0
    ) -> None:
        """:meth:`observe` for consecutive requests for ``model`` at ``times`` (ascending).

        The same gaps, last request and window as one call each: only the window after
        the last request is computed and scheduled (those after the others would be
        superseded entries of the heap, skipped by :meth:`due`)."""
        m = self._models.get(model)
        self._due.pop(model, None)  # asked for: whatever window was open is over
        if m is None:
            if len(self._models) >= self._max_models:
                return
            m = self._models[model] = _Model(model, times[0], deque(maxlen=self.keep))
            if len(times) == 1:
                return
            times = times[1:]
        last = m.last
        gaps = m.gaps
        for now in times:
            gaps.append(now - last)
            last = now
        m.last = last
        m.window = window = self._window(m)
        if window is not None:
            m.lead_s = lead_s(model) if callable(lead_s) else lead_s
            heapq.heappush(self._heap, (window.opens - m.lead_s, last, model))

    def window(self, model: str) -> Window | None:
        """``model``'s next window from its last request, if its gaps agree (else None)."""
        m = self._models.get(model)
        return m.window if m is not None else None

    def _window(self, m: _Model) -> Window | None:
        gaps = m.gaps
        n = len(gaps)
        if n < self.min_gaps:
            return None
        first, last = int(HEAD * (n - 1)), min(n - 1, round(TAIL * (n - 1)))
        ordered: list[float] | None = None
        if first == 0 and last == n - 1:
            # The percentiles are the extremes (up to 20 gaps: the default keeps 16), so
            # every gap lies inside: min and max in C, no sort and no count (this runs on
            # every request, and was a tenth of the cache's learning per request).
            head, tail = min(gaps), max(gaps)
        else:
            ordered = sorted(gaps)
            head, tail = ordered[first], ordered[last]
        if head <= 0 or tail > self.spread * head:
            return None
        inside = n
        if ordered is not None:
            inside = 0
            for gap in ordered:  # a loop, not sum() over a generator: runs per request
                if head <= gap <= tail:
                    inside += 1
        return Window(m.name, m.last + head, m.last + tail, inside / (n + 1), n)

    def ahead(self, model: str, now: float) -> bool:
        """Whether ``model`` will be pre-warmed before its next request, which is not
        due before then: evicting it until its pre-warm time costs no cold start (the
        keep-alive side of the windows: a timer need not stay resident between calls)."""
        m = self._models.get(model)
        return m is not None and m.window is not None and now < m.window.opens - m.lead_s

    def factor(self, model: str, now: float) -> float:
        """What keeping ``model`` resident is worth at ``now``, relative to what its rate
        says: :data:`BEFORE` until its pre-warm time (it will be loaded back in time),
        :data:`DURING` from then until its window closes (its request is imminent: a
        pre-warmed model evicted before it is a wasted load), 1 otherwise."""
        m = self._models.get(model)
        if m is None or m.window is None or now > m.window.closes:
            return 1.0
        return BEFORE if now < m.window.opens - m.lead_s else DURING

    def due(self, now: float) -> list[Window]:
        """Models whose pre-warm time has come and whose window has not closed, soonest
        first. A model stays due until it is asked for or its window closes."""
        while self._heap and self._heap[0][0] <= now:
            _, after, model = heapq.heappop(self._heap)
            m = self._models.get(model)
            if m is None or m.last != after:
                continue  # asked for again since: a newer entry stands for it
            if m.window is not None:
                self._due[model] = m.window
        if not self._due:  # most calls: nothing due, nothing to sort
            return []
        for model in [m for m, w in self._due.items() if w.closes < now]:
            del self._due[model]  # the window passed without the request
        return sorted(self._due.values(), key=lambda w: w.opens)

    def done(self, model: str) -> None:
        """``model`` was pre-warmed (or found loaded): no longer due in this window."""
        self._due.pop(model, None)
