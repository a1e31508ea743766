"""SchedulerConfig and BreakerConfig validation, and the mapping from ModelConfig."""

from __future__ import annotations

from typing import Any

import pytest

from modelyard.config.model_config import ModelConfig
from modelyard.scheduling import BreakerConfig, SchedulerConfig


@pytest.mark.parametrize(
    "fields",
    [
        {"max_batch_size": -1},
        {"max_queue_delay_s": -0.1},
        {"preferred_batch_sizes": (0,)},
        {"max_queue_size": 0},
        {"latency_slo_s": 0.0},
        {"default_priority": 0},
        {"max_concurrency": 0},
        {"aging_s": 0.0},
    ],
    ids=lambda fields: next(iter(fields)),
)
def test_scheduler_config_rejects_nonsense(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(fields))):
        SchedulerConfig(**fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"window": 0},
        {"failure_ratio": 0.0},
        {"failure_ratio": 1.5},
        {"min_calls": 0},
        {"min_calls": 50},
        {"cooldown_s": -1.0},
        {"half_open_probes": 0},
    ],
    ids=[
        "window",
        "ratio-0",
        "ratio-1.5",
        "min-calls-0",
        "min-calls-over-window",
        "cooldown",
        "probes",
    ],
)
def test_breaker_config_rejects_nonsense(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="breaker"):
        BreakerConfig(**fields)


@pytest.mark.parametrize(
    ("config", "is_batching"),
    [
        (SchedulerConfig(), True),
        (SchedulerConfig(max_batch_size=1), False),
        (SchedulerConfig(supports_batching=False), False),
    ],
    ids=["default", "max-1", "model-cannot"],
)
def test_is_batching(config: SchedulerConfig, is_batching: bool) -> None:
    assert config.is_batching is is_batching


@pytest.mark.parametrize(
    "units",
    [
        {"max_queue_delay_us": 2500, "latency_slo_ms": 50},
        {"max_queue_delay_s": 0.0025, "latency_slo_s": 0.05},
    ],
    ids=["older-names", "seconds"],
)
def test_from_model_config_converts_units(units: dict[str, float]) -> None:
    model = ModelConfig.model_validate(
        {
            "name": "m",
            "path": "m",
            "max_batch_size": 16,
            "preferred_batch_sizes": [4, 8],
            "max_queue_size": 64,
            "priority": 2,
            **units,
        }
    )
    config = SchedulerConfig.from_model_config(model, supports_batching=False, max_concurrency=3)
    assert config.max_batch_size == 16
    assert config.max_queue_delay_s == pytest.approx(0.0025)
    assert config.preferred_batch_sizes == (4, 8)
    assert config.latency_slo_s == pytest.approx(0.05)
    assert config.max_queue_size == 64
    assert config.default_priority == 2
    assert not config.supports_batching
    assert config.max_concurrency == 3
