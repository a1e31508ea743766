"""Every Prometheus metric of the server, defined once, against an injected registry.

Three kinds of figures, three ways in:

* **Request path** (hot): :meth:`Metrics.request_done`, :meth:`Metrics.cold_start_wait`
  and the scheduler hook from :meth:`Metrics.batch_hook`. Label children are cached per
  model version, so a request costs a few dict lookups and histogram observations.
* **Lifecycle** (cold): :meth:`Metrics.on_event`, an :class:`EventLog` listener, counts
  loads, unloads, evictions, crashes, restarts and load failures, and times model switches.
* **State** (at scrape time): :meth:`Metrics.bind` registers a collector that reads the
  manager when ``/metrics`` is scraped: model states, bytes per model and device, queue
  depth, in-flight requests, breaker state, worker memory. Workers report their figures
  over their channel into ``record.info``; only the server process serves ``/metrics``.

Names follow ``modelyard_<subsystem>_<what>_<unit>``; label values come from bounded
sets (model, version, device, code, state, kind), never from requests.

The same calls feed :class:`RecentTraffic`, a per-second ring buffer of request counts,
p50/p99 latency and cold starts that the dashboard draws. It needs no background task:
a second is summarised when the next one starts, or when the buffer is read.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from modelyard.clock import Clock, MonotonicClock
from modelyard.manager.states import RESIDENT, ModelState

if TYPE_CHECKING:
    from modelyard.manager.events import Event
    from modelyard.manager.manager import ModelManager

log = logging.getLogger("modelyard.metrics")

OK = "ok"
"""The ``code`` of a request that succeeded; failures use their ``ErrorCode`` value."""

LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
SWITCH_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

BREAKER_STATE_VALUES = {"closed": 0, "half_open": 1, "open": 2}
"""``modelyard_scheduler_breaker_state``: 0 closed, 1 half-open, 2 open."""

_EVENT_COUNTERS = {
    "loaded": "loads",
    "unloaded": "unloads",
    "evicted": "evictions",
    "crashed": "crashes",
    "restarted": "restarts",
}
_LOAD_FAILURES = {"load_failed": "failed", "load_refused": "refused", "verify_failed": "verify"}
_WORKER_MEMORY_KINDS = ("rss", "uss", "pss", "swap")

BatchHook = Callable[[int, list[float], float], None]
"""The scheduler's ``on_batch(batch_rows, queue_wait_s_per_request, compute_s)``."""


# --------------------------------------------------------------------------- recent traffic

_SAMPLE_CAP = 1024
"""Latencies kept per model version per second; beyond it a uniform reservoir sample."""


@dataclass(slots=True)
class _Second:
    second: int
    requests: int = 0
    errors: int = 0
    cold_starts: int = 0
    latencies_s: list[float] = field(default_factory=list)

    def add(self, latency_s: float) -> None:
        self.requests += 1
        if len(self.latencies_s) < _SAMPLE_CAP:
            self.latencies_s.append(latency_s)
        else:
            slot = int(random.random() * self.requests)
            if slot < _SAMPLE_CAP:
                self.latencies_s[slot] = latency_s

    def summary(self) -> tuple[int, int, int, float | None, float | None]:
        ordered = sorted(self.latencies_s)
        return (
            self.requests,
            self.errors,
            self.cold_starts,
            _quantile(ordered, 0.50),
            _quantile(ordered, 0.99),
        )


def _quantile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class RecentTraffic:
    """One model version's requests per second over the last ``horizon_s`` seconds."""

    def __init__(self, horizon_s: int) -> None:
        self._closed: deque[tuple[int, tuple[int, int, int, float | None, float | None]]] = deque(
            maxlen=horizon_s
        )
        self._open: _Second | None = None

    def _at(self, second: int) -> _Second:
        current = self._open
        if current is None or current.second != second:
            if current is not None:
                self._closed.append((current.second, current.summary()))
            current = self._open = _Second(second)
        return current

    def request(self, second: int, latency_s: float, *, is_error: bool) -> None:
        """Count one answered request."""
        bucket = self._at(second)
        bucket.add(latency_s)
        bucket.errors += is_error

    def cold_start(self, second: int) -> None:
        """Count one request that waited for a load."""
        self._at(second).cold_starts += 1

    def window(self, end_second: int, length_s: int) -> dict[str, list[Any]]:
        """The ``length_s`` whole seconds before ``end_second``, oldest first, gaps as 0."""
        if self._open is not None and self._open.second < end_second:
            self._closed.append((self._open.second, self._open.summary()))
            self._open = None
        start = end_second - length_s
        by_second = {s: row for s, row in self._closed if start <= s < end_second}
        empty = (0, 0, 0, None, None)
        rows = [by_second.get(s, empty) for s in range(start, end_second)]
        return {
            "requests": [r[0] for r in rows],
            "errors": [r[1] for r in rows],
            "cold_starts": [r[2] for r in rows],
            "p50_s": [r[3] for r in rows],
            "p99_s": [r[4] for r in rows],
        }


# --------------------------------------------------------------------------- metrics


@dataclass(slots=True)
class _VersionMetrics:
    """The cached label children of one model version (``.labels()`` is slow)."""

    model: str
    version: str
    requests: dict[str, Counter]
    request_seconds: Histogram
    queue_seconds: Histogram
    compute_seconds: Histogram
    batch_rows: Histogram
    batch_compute_seconds: Histogram
    cold_start_seconds: Histogram
    recent: RecentTraffic


class Metrics:
    """Every metric of one server, registered on ``registry`` (tests pass a fresh one)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        clock: Clock | None = None,
        horizon_s: int = 300,
        process_metrics: bool = True,
    ) -> None:
        self.registry = registry
        self.horizon_s = horizon_s
        """Seconds of per-second traffic kept for the dashboard."""
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._versions: dict[tuple[str, str], _VersionMetrics] = {}
        self._bound = False
        mv = ("model", "version")

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, mv, buckets=buckets, registry=registry)

        def counter(name: str, doc: str, *extra: str) -> Counter:
            return Counter(name, doc, [*mv, *extra], registry=registry)

        self.requests = counter(
            "modelyard_inference_requests",
            "Inference requests answered, by outcome (code: ok or the error code).",
            "code",
        )
        self.request_seconds = histogram(
            "modelyard_inference_request_duration_seconds",
            "Time from receipt to answer of an inference request (any outcome).",
            LATENCY_BUCKETS_S,
        )
        self.queue_seconds = histogram(
            "modelyard_inference_queue_duration_seconds",
            "Time a request waited in the model's queue before its model call.",
            LATENCY_BUCKETS_S,
        )
        self.compute_seconds = histogram(
            "modelyard_inference_compute_duration_seconds",
            "Duration of the model call that served a request (its batch's call).",
            LATENCY_BUCKETS_S,
        )
        self.batch_rows = histogram(
            "modelyard_scheduler_batch_size_rows", "Rows in each model call.", BATCH_SIZE_BUCKETS
        )
        self.batch_compute_seconds = histogram(
            "modelyard_scheduler_batch_compute_seconds",
            "Duration of each model call (one batch).",
            LATENCY_BUCKETS_S,
        )
        self.cold_start_seconds = histogram(
            "modelyard_model_cold_start_wait_seconds",
            "How long a request waited for its model to load (cache misses).",
            SWITCH_BUCKETS_S,
        )
        self.switch_seconds = histogram(
            "modelyard_model_switch_latency_seconds",
            "Model-switch latency: a load from admission to ready (queue, start, load, warm-up).",
            SWITCH_BUCKETS_S,
        )
        self.lifecycle = {
            name: counter(f"modelyard_model_{name}", f"Model {name}, from the event log.")
            for name in _EVENT_COUNTERS.values()
        }
        self.load_failures = counter(
            "modelyard_model_load_failures",
            "Failed loads by reason: failed (an error), refused (no memory), verify (checksum).",
            "reason",
        )
        self.events = counter(
            "modelyard_model_events",
            "Every lifecycle event by kind, including kinds without a counter of their own.",
            "kind",
        )
        if process_metrics:
            ProcessCollector(namespace="modelyard", registry=registry)

    # ----------------------------------------------------------------- hot path

    def _of(self, model: str, version: str) -> _VersionMetrics:
        found = self._versions.get((model, version))
        if found is None:
            found = self._versions[(model, version)] = _VersionMetrics(
                model=model,
                version=version,
                requests={},
                request_seconds=self.request_seconds.labels(model, version),
                queue_seconds=self.queue_seconds.labels(model, version),
                compute_seconds=self.compute_seconds.labels(model, version),
                batch_rows=self.batch_rows.labels(model, version),
                batch_compute_seconds=self.batch_compute_seconds.labels(model, version),
                cold_start_seconds=self.cold_start_seconds.labels(model, version),
                recent=RecentTraffic(self.horizon_s),
            )
        return found

    def request_done(
        self,
        model: str,
        version: str,
        code: str,
        total_s: float,
        queue_s: float | None = None,
        compute_s: float | None = None,
    ) -> None:
        """One inference request answered; ``code`` is ``"ok"`` or an ``ErrorCode`` value.

        ``model``/``version`` must name a known version (``""`` for requests that named no
        existing model). Pass ``queue_s``/``compute_s`` only where the scheduler's
        :meth:`batch_hook` is not installed, or they are counted twice.
        """
        m = self._of(model, version)
        counter = m.requests.get(code)
        if counter is None:
            counter = m.requests[code] = self.requests.labels(model, version, str(code))
        counter.inc()
        m.request_seconds.observe(total_s)
        if queue_s is not None:
            m.queue_seconds.observe(queue_s)
        if compute_s is not None:
            m.compute_seconds.observe(compute_s)
        m.recent.request(int(self._clock.monotonic()), total_s, is_error=code != OK)

    def batch_done(self, model: str, version: str, batch_size: int, compute_s: float) -> None:
        """One model call of ``batch_size`` rows took ``compute_s``."""
        m = self._of(model, version)
        m.batch_rows.observe(batch_size)
        m.batch_compute_seconds.observe(compute_s)

    def batch_hook(self, model: str, version: str) -> BatchHook:
        """The scheduler's ``on_batch`` for one model version: batch, queue and compute."""
        m = self._of(model, version)

        def on_batch(rows: int, queue_waits_s: list[float], compute_s: float) -> None:
            m.batch_rows.observe(rows)
            m.batch_compute_seconds.observe(compute_s)
            for wait_s in queue_waits_s:
                m.queue_seconds.observe(wait_s)
                m.compute_seconds.observe(compute_s)

        return on_batch

    def cold_start_wait(self, model: str, version: str, wait_s: float) -> None:
        """A request found its model not ready and waited ``wait_s`` for the load."""
        m = self._of(model, version)
        m.cold_start_seconds.observe(wait_s)
        m.recent.cold_start(int(self._clock.monotonic()))

    # ----------------------------------------------------------------- lifecycle events

    def on_event(self, event: Event) -> None:
        """EventLog listener: count the event, time model switches; never raises."""
        try:
            mv = (event.model, event.version)
            self.events.labels(*mv, event.kind).inc()
            counter = _EVENT_COUNTERS.get(event.kind)
            if counter is not None:
                self.lifecycle[counter].labels(*mv).inc()
            reason = _LOAD_FAILURES.get(event.kind)
            if reason is not None:
                self.load_failures.labels(*mv, reason).inc()
            if event.kind == "loaded" and event.duration_s is not None:
                self.switch_seconds.labels(*mv).observe(event.duration_s)
        except Exception:  # a listener must not break the manager
            log.exception("metrics: could not count event %s", event)

    # ----------------------------------------------------------------- state at scrape time

    def bind(self, manager: ModelManager) -> None:
        """Register the collector that reads ``manager`` whenever ``/metrics`` is scraped."""
        if self._bound:
            raise RuntimeError("Metrics.bind: already bound to a manager")
        self.registry.register(ManagerCollector(manager))
        self._bound = True

    # ----------------------------------------------------------------- dashboard feed

    def recent_traffic(self, window_s: int) -> dict[str, Any]:
        """Per-second traffic of every model version over the last ``window_s`` seconds."""
        length = max(1, min(window_s, self.horizon_s))
        end = int(self._clock.monotonic())
        return {
            "interval_s": 1,
            "window_s": length,
            "end_time": float(int(time.time())),
            "models": [
                {"name": m.model, "version": m.version, **m.recent.window(end, length)}
                for m in self._versions.values()
                if m.model
            ],
        }


class ManagerCollector:
    """A prometheus_client collector reading the manager's state at scrape time."""

    def __init__(self, manager: ModelManager) -> None:
        self._manager = manager

    def describe(self) -> Iterable[Metric]:
        """The families this collector yields (for the registry's duplicate check)."""
        return self._families()

    def collect(self) -> Iterable[Metric]:
        """One fresh reading of every model version and device."""
        fams = self._families()
        f = {fam.name: fam for fam in fams}
        used: dict[str, int] = {}
        for record in self._manager.records():
            mv = [record.key.name, record.key.version]
            device = record.config.device
            for state in ModelState:
                f["modelyard_model_state"].add_metric([*mv, state.value], state is record.state)
            f["modelyard_model_reserved_bytes"].add_metric([*mv, device], record.reserved_bytes)
            if record.measured_bytes is not None:
                f["modelyard_model_measured_bytes"].add_metric([*mv, device], record.measured_bytes)
            if record.state in RESIDENT:
                held = record.measured_bytes
                used[device] = used.get(device, 0) + (
                    held if held is not None else record.reserved_bytes
                )
            f["modelyard_model_in_flight_requests"].add_metric(mv, record.in_flight)
            f["modelyard_model_cold_starts"].add_metric(mv, record.stats.cold_starts)
            if record.scheduler is not None:
                stats = record.scheduler.stats()
                f["modelyard_scheduler_queued_requests"].add_metric(mv, _num(stats["queue_depth"]))
                f["modelyard_scheduler_running_requests"].add_metric(
                    mv, _num(stats["running_requests"])
                )
                breaker = BREAKER_STATE_VALUES.get(str(stats["breaker_state"]))
                if breaker is not None:
                    f["modelyard_scheduler_breaker_state"].add_metric(mv, breaker)
                f["modelyard_scheduler_breaker_opened"].add_metric(
                    mv, _num(stats["breaker_times_opened"])
                )
            if record.info is not None and record.state in RESIDENT:
                # Process workers report ``rss_bytes``… at the top level; others may nest them.
                details = record.info.details
                memory = details.get("memory", details)
                if isinstance(memory, dict):
                    for kind in _WORKER_MEMORY_KINDS:
                        value = memory.get(f"{kind}_bytes")
                        if isinstance(value, int | float):
                            f["modelyard_worker_memory_bytes"].add_metric([*mv, kind], value)
        for dev in self._manager.budget.devices.values():
            f["modelyard_device_memory_budget_bytes"].add_metric([dev.name], dev.budget_bytes)
            f["modelyard_device_memory_reserved_bytes"].add_metric([dev.name], dev.reserved_bytes)
            f["modelyard_device_memory_free_bytes"].add_metric([dev.name], dev.free_bytes)
            f["modelyard_device_memory_used_bytes"].add_metric([dev.name], used.get(dev.name, 0))
        for name, (physical, utilization) in _cuda_readings(self._manager.budget.devices).items():
            if physical is not None:
                f["modelyard_device_physical_memory_used_bytes"].add_metric([name], physical)
            if utilization is not None:
                f["modelyard_device_utilization_ratio"].add_metric([name], utilization)
        return fams

    @staticmethod
    def _families() -> list[GaugeMetricFamily | CounterMetricFamily]:
        mv = ["model", "version"]
        g = GaugeMetricFamily
        c = CounterMetricFamily
        return [
            g("modelyard_model_state", "1 for the version's lifecycle state, 0 for the others.",
              labels=[*mv, "state"]),
            g("modelyard_model_reserved_bytes", "Bytes the budget holds for the version.",
              labels=[*mv, "device"]),
            g("modelyard_model_measured_bytes", "Measured footprint of the version's last load.",
              labels=[*mv, "device"]),
            g("modelyard_model_in_flight_requests", "Model calls running for the version.",
              labels=mv),
            c("modelyard_model_cold_starts", "Loads started by a request (cache misses).",
              labels=mv),
            g("modelyard_scheduler_queued_requests", "Requests waiting in the version's queue.",
              labels=mv),
            g("modelyard_scheduler_running_requests", "Requests in running model calls.",
              labels=mv),
            g("modelyard_scheduler_breaker_state",
              "Circuit breaker: 0 closed, 1 half-open, 2 open.", labels=mv),
            c("modelyard_scheduler_breaker_opened",
              "Times the breaker opened (since the version's last load).", labels=mv),
            g("modelyard_worker_memory_bytes",
              "Memory of the version's worker as it reported it, by kind (rss, uss, pss, swap).",
              labels=[*mv, "kind"]),
            g("modelyard_device_memory_budget_bytes", "Bytes loaded models may hold on the device.",
              labels=["device"]),
            g("modelyard_device_memory_reserved_bytes", "Bytes reserved on the device's budget.",
              labels=["device"]),
            g("modelyard_device_memory_free_bytes", "Budget left on the device.",
              labels=["device"]),
            g("modelyard_device_memory_used_bytes",
              "Bytes resident models hold on the device (measured; reserved until measured).",
              labels=["device"]),
            g("modelyard_device_physical_memory_used_bytes",
              "CUDA device memory in use by every process (as nvidia-smi shows it).",
              labels=["device"]),
            g("modelyard_device_utilization_ratio", "CUDA device utilisation, 0 to 1.",
              labels=["device"]),
        ]  # fmt: skip


def _num(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def _cuda_readings(devices: Iterable[str]) -> dict[str, tuple[float | None, float | None]]:
    """Memory used and utilisation of each ``cuda:N`` device, only if torch is imported.

    Never imports torch, and never creates a CUDA context in the server (NVML queries
    only; ``mem_get_info`` only where this process already initialised CUDA).
    """
    torch: Any = sys.modules.get("torch")
    cuda_devices = [d for d in devices if d.startswith("cuda:")]
    if torch is None or not cuda_devices:
        return {}
    out: dict[str, tuple[float | None, float | None]] = {}
    try:
        if not torch.cuda.is_available():
            return {}
        for name in cuda_devices:
            index = int(name.partition(":")[2])
            out[name] = (_cuda_used(torch, index), _cuda_utilization(torch, index))
    except Exception:  # a metrics scrape must not fail for a driver hiccup
        log.debug("metrics: cannot read CUDA devices", exc_info=True)
    return out


def _cuda_used(torch: Any, index: int) -> float | None:
    try:
        return float(torch.cuda.device_memory_used(index))  # NVML: no CUDA context needed
    except Exception:
        pass
    if torch.cuda.is_initialized():
        free, total = torch.cuda.mem_get_info(index)
        return float(total - free)
    return None


def _cuda_utilization(torch: Any, index: int) -> float | None:
    try:
        return float(torch.cuda.utilization(index)) / 100.0
    except Exception:  # needs pynvml
        return None
