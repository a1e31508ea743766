"""Adaptive batching: an AIMD controller of the batch-size cap and queue delay, after Clipper.

Clipper (Crankshaw et al., NSDI 2017) finds the largest batch a model can run within its
latency objective with additive-increase / multiplicative-decrease. This controller keeps:

* a window of recent end-to-end latencies (queue wait plus compute) of finished requests;
* a smoothed (EWMA) compute latency for each batch size it has seen.

After every batch:

* **the batch itself too slow** (its compute plus the delay above ``slo_s``): the cap
  and the delay are halved (multiplicative decrease), and the window is emptied;
* **the SLO missed in the queue** (p99 of the window above ``slo_s`` while the batch's
  compute fits): the server is overloaded, and smaller batches would only lower
  throughput and lengthen the queue, so the delay drops to zero (a full queue provides
  company) and the cap keeps growing as below;
* **the cap grows** by ``increase_step`` (additive increase) when it was binding (the
  batch reached it) and the compute known or extrapolated for the larger size still fits;
* **the delay** grows by one step (``max_delay_s / delay_steps``) when the batch found
  company but not enough to fill the cap and p99 has headroom (under half the SLO), and
  shrinks by one step when a lone request waited for nobody or the headroom is gone.

The cap stays in ``[1, max_batch_size]`` and the delay in ``[0, slo_s / 4]``. The class is
pure and synchronous; the scheduler calls :meth:`observe` and reads the two knobs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence


class AdaptiveBatchController:
    """AIMD control of ``batch_size_cap`` and ``delay_s`` against a p99 latency objective."""

    def __init__(
        self,
        *,
        slo_s: float,
        max_batch_size: int,
        initial_delay_s: float = 0.0,
        initial_batch_size: int = 1,
        window: int = 256,
        increase_step: int = 1,
        decrease_factor: float = 0.5,
        delay_steps: int = 10,
        ewma_alpha: float = 0.2,
    ) -> None:
        if slo_s <= 0:
            raise ValueError(f"slo_s must be > 0, got {slo_s}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if not 0.0 < decrease_factor < 1.0:
            raise ValueError(f"decrease_factor must be in (0, 1), got {decrease_factor}")
        if window < 1 or increase_step < 1 or delay_steps < 1 or not 0.0 < ewma_alpha <= 1.0:
            raise ValueError("window, increase_step and delay_steps must be >= 1, ewma in (0, 1]")
        self.slo_s = slo_s
        self.max_batch_size = max_batch_size
        self.max_delay_s = slo_s / 4
        self._cap = min(max(1, initial_batch_size), max_batch_size)
        self._delay_s = min(max(0.0, initial_delay_s), self.max_delay_s)
        self._delay_step_s = self.max_delay_s / delay_steps
        self._increase_step = increase_step
        self._decrease_factor = decrease_factor
        self._alpha = ewma_alpha
        self._latencies: deque[float] = deque(maxlen=window)
        self._compute_by_size: dict[int, float] = {}
        self.increases = 0
        """How many times the cap grew."""
        self.decreases = 0
        """How many times a batch's compute missed the SLO and cap and delay were cut."""
        self.overloads = 0
        """How many times the SLO was missed in the queue (delay dropped to zero)."""

    @property
    def batch_size_cap(self) -> int:
        """Most rows the next batch may hold."""
        return self._cap

    @property
    def delay_s(self) -> float:
        """How long the oldest request of the next batch may wait for company."""
        return self._delay_s

    @property
    def latency_by_batch_size(self) -> dict[int, float]:
        """Smoothed compute seconds per batch size seen so far."""
        return dict(sorted(self._compute_by_size.items()))

    def p99_s(self) -> float | None:
        """p99 (nearest rank) of the recent end-to-end latencies; None before any."""
        if not self._latencies:
            return None
        ordered = sorted(self._latencies)
        return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]

    def predicted_compute_s(self, batch_size: int) -> float | None:
        """Compute seconds expected for ``batch_size`` rows; None when nothing is known.

        A size seen before gives its own average; otherwise the nearest larger size seen,
        or else the largest smaller one scaled linearly (pessimistic: batching is sublinear).
        """
        if batch_size in self._compute_by_size:
            return self._compute_by_size[batch_size]
        larger = [s for s in self._compute_by_size if s > batch_size]
        if larger:
            return self._compute_by_size[min(larger)]
        smaller = [s for s in self._compute_by_size if s < batch_size]
        if smaller:
            size = max(smaller)
            return self._compute_by_size[size] * batch_size / size
        return None

    def observe(self, *, batch_size: int, compute_s: float, latencies_s: Sequence[float]) -> None:
        """Take in one finished batch and adjust the cap and the delay.

        ``batch_size`` is its row count, ``compute_s`` the model call's duration and
        ``latencies_s`` the end-to-end latency of each request in it.
        """
        if batch_size >= 1:
            old = self._compute_by_size.get(batch_size)
            self._compute_by_size[batch_size] = (
                compute_s if old is None else old + self._alpha * (compute_s - old)
            )
        self._latencies.extend(latencies_s)
        p99 = self.p99_s()
        cap_before = self._cap
        # Multiplicative decrease when the batch itself is too slow: its compute plus
        # the time its oldest request may wait no longer fits the objective.
        if compute_s + self._delay_s > self.slo_s:
            self._cap = max(1, int(self._cap * self._decrease_factor))
            self._delay_s *= self._decrease_factor
            self._latencies.clear()
            self.decreases += 1
            return
        overloaded = p99 is not None and p99 > self.slo_s
        if overloaded:
            # The objective is missed in the queue, not in the model: smaller batches
            # would only lower throughput and lengthen the queue. Stop waiting for
            # company (a full queue provides it) and keep growing batches that still fit.
            self._delay_s = 0.0
            self._latencies.clear()
            self.overloads += 1
        if batch_size >= cap_before and cap_before < self.max_batch_size:
            target = min(self.max_batch_size, self._cap + self._increase_step)
            predicted = self.predicted_compute_s(target)
            if predicted is None or predicted + self._delay_s < self.slo_s:
                self._cap = target
                self.increases += 1
        if overloaded:
            return
        requests = len(latencies_s)
        headroom = p99 is not None and p99 < self.slo_s / 2
        if batch_size < cap_before:
            if requests > 1 and headroom:
                self._delay_s = min(self.max_delay_s, self._delay_s + self._delay_step_s)
            elif requests == 1 or not headroom:
                self._delay_s = max(0.0, self._delay_s - self._delay_step_s)
