"""Static settings of one model's scheduler: batching, queue, priorities and circuit breaker.

:class:`SchedulerConfig` is a plain frozen dataclass holding what the scheduler needs in
its own units (seconds); the app builds one from the model's validated ``ModelConfig``
with :meth:`SchedulerConfig.from_model_config`, adding what only the loaded runtime
knows. The circuit breaker's settings need no translation, so the scheduler runs on the
YAML's own :class:`~modelyard.config.model_config.BreakerConfig` (re-exported here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from modelyard.config.model_config import BreakerConfig, ModelConfig

__all__ = ["BreakerConfig", "SchedulerConfig"]


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Settings of one model's :class:`~modelyard.scheduling.scheduler.ModelScheduler`."""

    max_batch_size: int = 8
    """Most rows handed to one model call; 0 or 1 disables batching."""
    max_queue_delay_s: float = 0.0
    """How long the oldest request of a batch may wait for company."""
    preferred_batch_sizes: tuple[int, ...] = ()
    """Row counts dispatched at once, without waiting out the delay, when they can be formed."""
    max_queue_size: int = 256
    """Requests that may wait; beyond it ``submit`` raises ``OverloadedError`` at once."""
    latency_slo_s: float | None = None
    """Target p99 end-to-end latency; when set, batch size and delay adapt (AIMD) to meet it."""
    default_priority: int = 3
    """Priority of requests that name none; 1 is the highest."""
    supports_batching: bool = True
    """False: the model takes one request per call, whatever ``max_batch_size`` says."""
    max_concurrency: int = 1
    """Batches in flight at once (one per worker replica).

    Always 1 in the server today (one worker per model version). It stays because the
    scheduler already honours it (tested with 2 and 3) and replicas will set it to their
    count; the Retry-After estimate divides by it."""
    aging_s: float = 1.0
    """A queued request's effective priority improves by one level per this many seconds."""
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    """The model's circuit breaker."""
    max_batch_elements: int | None = None
    """Most tensor elements (all inputs) in one batch; None: rows alone bound it."""
    early_rejection: bool = True
    """Refuse at once a request whose estimated latency ends after its deadline
    (:mod:`~modelyard.scheduling.degradation`)."""
    latency_slo_by_priority_s: Mapping[int, float] = field(default_factory=dict)
    """Latency objective per priority; drives shedding of the less important classes."""
    max_request_rows: int | None = None
    """Most rows one request may carry (``PayloadTooLargeError`` beyond); None: no limit."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 0:
            raise ValueError(f"max_batch_size must be >= 0, got {self.max_batch_size}")
        if self.max_queue_delay_s < 0:
            raise ValueError(f"max_queue_delay_s must be >= 0, got {self.max_queue_delay_s}")
        if any(size < 1 for size in self.preferred_batch_sizes):
            raise ValueError(
                f"preferred_batch_sizes must be positive, got {self.preferred_batch_sizes}"
            )
        if self.max_queue_size < 1:
            raise ValueError(f"max_queue_size must be >= 1, got {self.max_queue_size}")
        if self.latency_slo_s is not None and self.latency_slo_s <= 0:
            raise ValueError(f"latency_slo_s must be > 0, got {self.latency_slo_s}")
        if self.default_priority < 1:
            raise ValueError(f"default_priority must be >= 1, got {self.default_priority}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if any(p < 1 or slo <= 0 for p, slo in self.latency_slo_by_priority_s.items()):
            raise ValueError(
                "latency_slo_by_priority_s maps priorities >= 1 to objectives > 0, got "
                f"{dict(self.latency_slo_by_priority_s)}"
            )
        if self.max_request_rows is not None and self.max_request_rows < 1:
            raise ValueError(f"max_request_rows must be >= 1, got {self.max_request_rows}")
        if self.aging_s <= 0:
            raise ValueError(f"aging_s must be > 0, got {self.aging_s}")

    @property
    def is_batching(self) -> bool:
        """True when requests may be combined into one model call."""
        return self.supports_batching and self.max_batch_size > 1

    @classmethod
    def from_model_config(
        cls,
        model: ModelConfig,
        *,
        supports_batching: bool = True,
        max_concurrency: int = 1,
        breaker: BreakerConfig | None = None,
        max_batch_elements: int | None = None,
    ) -> SchedulerConfig:
        """The scheduler settings of ``model`` (its own ``breaker`` unless one is given);
        the caller adds what the runtime and pool know."""
        return cls(
            max_batch_size=model.max_batch_size,
            max_queue_delay_s=model.max_queue_delay_s,
            preferred_batch_sizes=tuple(model.preferred_batch_sizes),
            max_queue_size=model.max_queue_size,
            latency_slo_s=model.latency_slo_s,
            default_priority=model.priority,
            supports_batching=supports_batching,
            max_concurrency=max_concurrency,
            breaker=breaker if breaker is not None else model.breaker,
            max_batch_elements=max_batch_elements,
            early_rejection=model.early_rejection,
            latency_slo_by_priority_s=dict(model.latency_slo_by_priority_s),
            max_request_rows=model.max_request_rows,
        )
