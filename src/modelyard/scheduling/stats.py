"""SchedulerStats: one typed reading of a model's scheduler, for metrics and the stats view."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """Queue, batching and breaker figures plus the request counters, at one moment.

    The metrics collector reads the fields; :meth:`as_dict` is the JSON form the
    ``/v2/stats`` view shows (counters at the top level, as before this type existed).
    """

    model: str
    state: str
    """The scheduler's lifecycle: ``new``, ``running``, ``draining`` or ``closed``."""
    queue_depth: int
    max_queue_size: int
    running_requests: int
    batches_in_flight: int
    pending: int
    batch_size_cap: int
    queue_delay_s: float
    breaker_state: str
    breaker_opened_until: float | None
    breaker_open_for_s: float | None
    breaker_times_opened: int
    p99_latency_s: float | None
    counters: Mapping[str, int]
    """Admission and outcome counters and ``model_calls`` (see ``scheduler.py``)."""

    def as_dict(self) -> dict[str, object]:
        """The JSON form: every field, with the counters flattened in."""
        out: dict[str, object] = {
            "model": self.model,
            "state": self.state,
            "queue_depth": self.queue_depth,
            "max_queue_size": self.max_queue_size,
            "running_requests": self.running_requests,
            "batches_in_flight": self.batches_in_flight,
            "pending": self.pending,
            "batch_size_cap": self.batch_size_cap,
            "queue_delay_s": self.queue_delay_s,
            "breaker_state": self.breaker_state,
            "breaker_opened_until": self.breaker_opened_until,
            "breaker_open_for_s": self.breaker_open_for_s,
            "breaker_times_opened": self.breaker_times_opened,
            "p99_latency_s": self.p99_latency_s,
        }
        out.update(self.counters)
        return out
