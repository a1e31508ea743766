"""Metrics: hot-path counters, lifecycle events, the scrape-time collector, recent traffic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import DeviceConfig, ServerSettings
from modelyard.errors import ErrorCode
from modelyard.manager.events import EventLog
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import ModelKey
from modelyard.manager.states import ModelState
from modelyard.observability.metrics import FOLD_AT, OK, Metrics
from modelyard.scheduling.config import SchedulerConfig
from modelyard.scheduling.scheduler import ModelScheduler
from modelyard.workers.inline import InlineInstance
from modelyard.workers.instance import InstanceInfo
from tests.fakes.clock import FakeClock

MIB = 1024 * 1024


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry, clock: FakeClock) -> Metrics:
    return Metrics(registry, clock=clock, process_metrics=False)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    assert got is not None, f"no sample {name}{labels}"
    return got


def test_request_done_counts_by_code_and_observes_latency(
    metrics: Metrics, registry: CollectorRegistry
) -> None:
    metrics.request_done("m", "1", OK, 0.010)
    metrics.request_done("m", "1", OK, 0.020, queue_s=0.001, compute_s=0.005)
    metrics.request_done("m", "1", ErrorCode.OVERLOADED, 0.001)
    mv = {"model": "m", "version": "1"}
    assert value(registry, "modelyard_inference_requests_total", **mv, code="ok") == 2
    assert value(registry, "modelyard_inference_requests_total", **mv, code="overloaded") == 1
    assert value(registry, "modelyard_inference_request_duration_seconds_count", **mv) == 3
    assert value(registry, "modelyard_inference_request_duration_seconds_sum", **mv) == (
        pytest.approx(0.031)
    )
    assert value(registry, "modelyard_inference_queue_duration_seconds_count", **mv) == 1
    assert value(registry, "modelyard_inference_compute_duration_seconds_count", **mv) == 1


def test_batch_hook_observes_batch_queue_and_compute(
    metrics: Metrics, registry: CollectorRegistry
) -> None:
    hook = metrics.batch_hook("m", "2")
    hook(6, [0.001, 0.002, 0.003], 0.050)
    hook(1, [], 0.010)  # a batch whose request waited in no queue
    mv = {"model": "m", "version": "2"}
    assert value(registry, "modelyard_scheduler_batch_size_rows_count", **mv) == 2
    assert value(registry, "modelyard_scheduler_batch_size_rows_sum", **mv) == 7
    assert value(registry, "modelyard_scheduler_batch_compute_seconds_count", **mv) == 2
    assert value(registry, "modelyard_inference_queue_duration_seconds_count", **mv) == 3
    assert value(registry, "modelyard_inference_compute_duration_seconds_sum", **mv) == (
        pytest.approx(0.150)
    )


def test_events_are_counted_by_kind(metrics: Metrics, registry: CollectorRegistry) -> None:
    log = EventLog()
    log.listeners.append(metrics.on_event)
    key = ModelKey("m", "1")
    log.add("loaded", key, "in 120 ms", duration_s=0.120)
    log.add("loaded", key, "in 80 ms", duration_s=0.080)
    for kind in ("evicted", "unloaded", "crashed", "restarted", "load_failed", "load_refused"):
        log.add(kind, key, "")
    log.add("version_switched", key, "a kind with no counter of its own")
    mv = {"model": "m", "version": "1"}
    assert value(registry, "modelyard_model_loads_total", **mv) == 2
    assert value(registry, "modelyard_model_switch_latency_seconds_count", **mv) == 2
    assert value(registry, "modelyard_model_switch_latency_seconds_sum", **mv) == (
        pytest.approx(0.2)
    )
    for name in ("evictions", "unloads", "crashes", "restarts"):
        assert value(registry, f"modelyard_model_{name}_total", **mv) == 1
    for reason in ("failed", "refused"):
        assert value(registry, "modelyard_model_load_failures_total", **mv, reason=reason) == 1
    assert value(registry, "modelyard_model_events_total", **mv, kind="version_switched") == 1
    assert value(registry, "modelyard_model_events_total", **mv, kind="loaded") == 2


def test_recent_traffic_has_per_second_counts_quantiles_and_gaps(
    metrics: Metrics, clock: FakeClock
) -> None:
    for i in range(100):
        metrics.request_done("m", "1", OK, (i + 1) / 1000)
    metrics.request_done("m", "1", ErrorCode.INTERNAL, 0.5)
    metrics.cold_start_wait("m", "1", 0.3)
    clock.now_s += 2  # second 1001 has no traffic: a gap
    metrics.request_done("m", "1", OK, 0.004)
    clock.now_s += 1
    feed = metrics.recent_traffic(window_s=4)
    assert feed["window_s"] == 4
    (series,) = feed["models"]
    assert (series["name"], series["version"]) == ("m", "1")
    assert series["requests"] == [0, 101, 0, 1]
    assert series["errors"] == [0, 1, 0, 0]
    assert series["cold_starts"] == [0, 1, 0, 0]
    assert series["p50_s"][1] == pytest.approx(0.051)
    assert series["p99_s"][1] == pytest.approx(0.100)
    assert series["p50_s"][2] is None
    assert series["p99_s"][3] == pytest.approx(0.004)


def test_recent_traffic_counts_client_errors_apart_from_the_models(
    metrics: Metrics, clock: FakeClock
) -> None:
    metrics.request_done("m", "1", OK, 0.001)
    for code in (ErrorCode.INVALID_INPUT, ErrorCode.PAYLOAD_TOO_LARGE, ErrorCode.MODEL_NOT_FOUND):
        metrics.request_done("m", "1", code, 0.001)
    metrics.request_done("m", "1", ErrorCode.WORKER_CRASHED, 0.2)
    metrics.request_done("m", "1", ErrorCode.DEADLINE_EXCEEDED, 1.0)
    clock.now_s += 1
    (series,) = metrics.recent_traffic(window_s=1)["models"]
    assert series["requests"] == [6]
    assert series["client_errors"] == [3]
    assert series["errors"] == [2]


def test_recent_traffic_has_time_to_first_token_and_tokens(
    metrics: Metrics, clock: FakeClock
) -> None:
    for ttft_s, tokens in ((0.010, 8), (0.030, 4), (0.020, 16)):
        metrics.generation_done(
            "llm", "1", ttft_s=ttft_s, decode_s=0.1, prompt_tokens=5, completion_tokens=tokens
        )
    clock.now_s += 2
    (series,) = metrics.recent_traffic(window_s=2)["models"]
    assert series["tokens"] == [28, 0]
    assert series["ttft_p50_s"] == [pytest.approx(0.020), None]
    assert series["requests"] == [0, 0]  # the requests themselves are counted by request_done


def test_recent_traffic_is_bounded(metrics: Metrics, clock: FakeClock) -> None:
    for _ in range(5000):
        metrics.request_done("m", "1", OK, 0.001)
    clock.now_s += 1
    (series,) = metrics.recent_traffic(window_s=10**6)["models"]
    assert len(series["requests"]) == metrics.horizon_s
    assert series["requests"][-1] == 5000
    assert series["p99_s"][-1] == pytest.approx(0.001)


@pytest.fixture
def manager(tmp_path: Path) -> ModelManager:
    for name in ("a", "b"):
        (tmp_path / name / "1").mkdir(parents=True)
    settings = ServerSettings(
        model_repository=str(tmp_path),
        devices=[DeviceConfig(name="cpu", memory_budget_mb=100)],
        models=[ModelConfig(name="a", path="a"), ModelConfig(name="b", path="b")],
    )
    return ModelManager(settings, lambda config: InlineInstance())


def test_collector_reads_models_and_devices_at_scrape_time(
    metrics: Metrics, registry: CollectorRegistry, manager: ModelManager
) -> None:
    metrics.bind(manager)
    a = manager.resolve("a", None)
    assert value(registry, "modelyard_model_state", model="a", version="1", state="UNLOADED") == 1
    assert value(registry, "modelyard_device_memory_budget_bytes", device="cpu") == 100 * MIB
    assert value(registry, "modelyard_device_memory_used_bytes", device="cpu") == 0

    # What a load leaves behind, set by hand: no process, no runtime.
    assert manager.budget.try_reserve("cpu", a.key, 30 * MIB)
    a.reserved_bytes = 30 * MIB
    a.measured_bytes = 25 * MIB
    a.state = ModelState.READY
    a.in_flight = 2
    a.info = InstanceInfo(
        inputs=[],
        outputs=[],
        supports_batching=True,
        footprint_bytes=25 * MIB,
        pid=1234,
        details={"memory": {"rss_bytes": 40 * MIB, "uss_bytes": 25 * MIB}},
    )

    async def execute(batch: dict[str, np.ndarray], deadline: float) -> dict[str, np.ndarray]:
        raise AssertionError("never called")

    a.scheduler = ModelScheduler("a:1", SchedulerConfig(), execute)

    mv = {"model": "a", "version": "1"}
    assert value(registry, "modelyard_model_state", **mv, state="READY") == 1
    assert value(registry, "modelyard_model_state", **mv, state="UNLOADED") == 0
    assert value(registry, "modelyard_model_reserved_bytes", **mv, device="cpu") == 30 * MIB
    assert value(registry, "modelyard_model_measured_bytes", **mv, device="cpu") == 25 * MIB
    assert value(registry, "modelyard_model_in_flight_requests", **mv) == 2
    assert value(registry, "modelyard_device_memory_reserved_bytes", device="cpu") == 30 * MIB
    assert value(registry, "modelyard_device_memory_free_bytes", device="cpu") == 70 * MIB
    assert value(registry, "modelyard_device_memory_used_bytes", device="cpu") == 25 * MIB
    assert value(registry, "modelyard_scheduler_queued_requests", **mv) == 0
    assert value(registry, "modelyard_scheduler_breaker_state", **mv) == 0
    assert value(registry, "modelyard_worker_memory_bytes", **mv, kind="rss") == 40 * MIB
    assert value(registry, "modelyard_worker_memory_bytes", **mv, kind="uss") == 25 * MIB
    no_scheduler = {"model": "b", "version": "1"}
    assert registry.get_sample_value("modelyard_scheduler_queued_requests", no_scheduler) is None


def test_bind_twice_is_refused(metrics: Metrics, manager: ModelManager) -> None:
    metrics.bind(manager)
    with pytest.raises(RuntimeError, match="already bound"):
        metrics.bind(manager)


def test_folded_requests_are_counted_before_every_read(
    metrics: Metrics, registry: CollectorRegistry, clock: FakeClock
) -> None:
    """Successes wait in a buffer (the request path's cost); every read sees them, and
    the per-second traffic keeps their order with failures and cold starts."""
    mv = {"model": "m", "version": "1"}
    hook = metrics.batch_hook("m", "1")
    metrics.request_done("m", "1", OK, 0.002)
    hook(1, [0.001], 0.001)
    assert value(registry, "modelyard_inference_requests_total", **mv, code="ok") == 1
    assert value(registry, "modelyard_scheduler_batch_size_rows_count", **mv) == 1
    metrics.request_done("m", "1", OK, 0.002)
    clock.now_s += 1
    metrics.request_done("m", "1", OK, 0.003)
    metrics.request_done("m", "1", ErrorCode.INTERNAL, 0.004)  # folds the two before it
    metrics.cold_start_wait("m", "1", 0.3)
    metrics.request_done("m", "1", OK, 0.005)
    clock.now_s += 1
    (series,) = metrics.recent_traffic(window_s=3)["models"]
    assert series["requests"] == [0, 2, 3]  # whole seconds before now
    assert series["errors"] == [0, 0, 1]
    assert series["cold_starts"] == [0, 0, 1]
    text = generate_latest(registry).decode()
    assert 'modelyard_inference_requests_total{code="ok",model="m",version="1"} 4.0' in text
    assert 'modelyard_inference_request_duration_seconds_count{model="m",version="1"} 5.0' in text


def test_folding_keeps_the_buffer_bounded(metrics: Metrics, registry: CollectorRegistry) -> None:
    hook = metrics.batch_hook("m", "1")
    for _ in range(10 * FOLD_AT + 3):
        metrics.request_done("m", "1", OK, 0.001)
        hook(1, [0.0], 0.001)
    assert len(metrics._done) < FOLD_AT
    assert len(metrics._calls) < FOLD_AT
    mv = {"model": "m", "version": "1"}
    assert value(registry, "modelyard_inference_requests_total", **mv, code="ok") == (
        10 * FOLD_AT + 3
    )
    assert value(registry, "modelyard_inference_compute_duration_seconds_count", **mv) == (
        10 * FOLD_AT + 3
    )
