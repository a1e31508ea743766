"""Per-model scheduling: bounded priority queue, dynamic batching, deadlines, circuit breaker."""

from modelyard.scheduling.adaptive import AdaptiveBatchController
from modelyard.scheduling.breaker import BreakerState, CircuitBreaker, Permit
from modelyard.scheduling.config import BreakerConfig, SchedulerConfig
from modelyard.scheduling.scheduler import BatchHook, Execute, ModelScheduler

__all__ = [
    "AdaptiveBatchController",
    "BatchHook",
    "BreakerConfig",
    "BreakerState",
    "CircuitBreaker",
    "Execute",
    "ModelScheduler",
    "Permit",
    "SchedulerConfig",
]
