"""ManagerCollector: the manager's state read at scrape time, as Prometheus families.

Model states, bytes per model and device, queue depth and running requests (from each
scheduler's typed :class:`~modelyard.scheduling.stats.SchedulerStats`), in-flight
requests, breaker state, worker memory and CUDA readings. It runs on the event loop
when ``/metrics`` is scraped, so it reads state only the loop mutates without a lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from modelyard.manager.states import RESIDENT, ModelState
from modelyard.observability.cuda import cuda_readings

if TYPE_CHECKING:
    from modelyard.manager.manager import ModelManager

BREAKER_STATE_VALUES = {"closed": 0, "half_open": 1, "open": 2}
"""``modelyard_scheduler_breaker_state``: 0 closed, 1 half-open, 2 open."""
_WORKER_MEMORY_KINDS = ("rss", "uss", "pss", "swap")


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
                stats = record.scheduler.snapshot()
                f["modelyard_scheduler_queued_requests"].add_metric(mv, stats.queue_depth)
                f["modelyard_scheduler_running_requests"].add_metric(mv, stats.running_requests)
                breaker = BREAKER_STATE_VALUES.get(stats.breaker_state)
                if breaker is not None:
                    f["modelyard_scheduler_breaker_state"].add_metric(mv, breaker)
                f["modelyard_scheduler_breaker_opened"].add_metric(mv, stats.breaker_times_opened)
            if record.info is not None and record.state in RESIDENT:
                # Process workers report ``rss_bytes``… at the top level; others may nest them.
                details = record.info.details
                memory = details.get("memory", details)
                if isinstance(memory, dict):
                    for kind in _WORKER_MEMORY_KINDS:
                        value = memory.get(f"{kind}_bytes")
                        if isinstance(value, int | float):
                            f["modelyard_worker_memory_bytes"].add_metric([*mv, kind], value)
                kv = details.get("kv_cache_bytes")
                if isinstance(kv, int):
                    f["modelyard_generation_kv_cache_bytes"].add_metric(mv, kv)
        for dev in self._manager.budget.devices.values():
            f["modelyard_device_memory_budget_bytes"].add_metric([dev.name], dev.budget_bytes)
            f["modelyard_device_memory_reserved_bytes"].add_metric([dev.name], dev.reserved_bytes)
            f["modelyard_device_memory_free_bytes"].add_metric([dev.name], dev.free_bytes)
            f["modelyard_device_memory_used_bytes"].add_metric([dev.name], used.get(dev.name, 0))
        for name, (physical, utilization) in cuda_readings(self._manager.budget.devices).items():
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
            g("modelyard_generation_kv_cache_bytes",
              "KV cache a generative model's worker holds (n_ctx x parallel sequences).",
              labels=mv),
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
