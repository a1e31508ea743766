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
    from modelyard.manager.records import ModelRecord

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
        on_device: dict[tuple[str, str], int] = {}
        for record in self._manager.records():
            mv = [record.key.name, record.key.version]
            device = record.device
            for state in ModelState:
                f["modelyard_model_state"].add_metric([*mv, state.value], state is record.state)
            f["modelyard_model_reserved_bytes"].add_metric([*mv, device], record.reserved_bytes)
            if record.measured_bytes is not None:
                f["modelyard_model_measured_bytes"].add_metric([*mv, device], record.measured_bytes)
            for dev_name, held_bytes in self.device_bytes(record):
                pair = (dev_name, record.key.name)
                on_device[pair] = on_device.get(pair, 0) + held_bytes
                used[dev_name] = used.get(dev_name, 0) + held_bytes
            f["modelyard_model_replicas"].add_metric(
                mv, (1 if record.state in RESIDENT else 0) + len(record.replicas)
            )
            f["modelyard_model_in_flight_requests"].add_metric(mv, record.in_flight)
            f["modelyard_model_cold_starts"].add_metric(mv, record.stats.cold_starts)
            st = record.stats
            f["modelyard_model_prefetches"].add_metric(mv, st.prefetches)
            f["modelyard_model_prefetch_hits"].add_metric(mv, st.prefetch_hits)
            f["modelyard_model_prefetch_wasted"].add_metric(mv, st.prefetch_wasted)
            f["modelyard_model_prefetch_hidden_seconds"].add_metric(mv, st.prefetch_hidden_s)
            f["modelyard_model_page_cache_warms"].add_metric(mv, st.page_cache_warms)
            _scheduler(f, mv, record)
            _worker(f, mv, record)
        for dev in self._manager.budget.devices.values():
            f["modelyard_device_memory_budget_bytes"].add_metric([dev.name], dev.budget_bytes)
            f["modelyard_device_memory_reserved_bytes"].add_metric([dev.name], dev.reserved_bytes)
            f["modelyard_device_memory_free_bytes"].add_metric([dev.name], dev.free_bytes)
            f["modelyard_device_memory_used_bytes"].add_metric([dev.name], used.get(dev.name, 0))
        for (dev_name, model), held_bytes in on_device.items():
            f["modelyard_model_device_memory_bytes"].add_metric([dev_name, model], held_bytes)
        readings = self._manager.devices.readings() or cuda_readings(self._manager.budget.devices)
        for name, (physical, utilization) in readings.items():
            if physical is not None:
                f["modelyard_device_physical_memory_used_bytes"].add_metric([name], physical)
            if utilization is not None:
                f["modelyard_device_utilization_ratio"].add_metric([name], utilization)
        return fams

    def device_bytes(self, record: ModelRecord) -> list[tuple[str, int]]:
        """``(device, bytes)`` each resident replica of ``record`` holds: NVML's live
        per-process figure on a GPU, else the measured footprint (reserved until measured)."""
        devices = self._manager.devices
        holders: list[tuple[str, int | None, int | None, int]] = []
        if record.state in RESIDENT:
            pid = record.info.pid if record.info is not None else None
            holders.append((record.device, pid, record.measured_bytes, record.reserved_bytes))
        for rep in record.replicas:
            pid = rep.info.pid if rep.info is not None else None
            holders.append((rep.device, pid, rep.measured_bytes, rep.reserved_bytes))
        out = []
        for device, pid, measured, reserved in holders:
            live = devices.process_device_bytes(device, pid) if pid is not None else None
            held = live if live is not None else measured
            out.append((device, held if held is not None else reserved))
        return out

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
            g("modelyard_model_device_memory_bytes",
              "Bytes a model's resident replicas hold on each device (NVML's per-process "
              "figures on GPUs, the measured footprint elsewhere).",
              labels=["device", "model"]),
            g("modelyard_model_replicas", "Resident replicas of the version (workers serving it).",
              labels=mv),
            g("modelyard_model_in_flight_requests", "Model calls running for the version.",
              labels=mv),
            c("modelyard_model_cold_starts", "Loads started by a request (cache misses).",
              labels=mv),
            c("modelyard_model_prefetches", "Loads started by the predictor.", labels=mv),
            c("modelyard_model_prefetch_hits", "Prefetched loads a request then used.",
              labels=mv),
            c("modelyard_model_prefetch_wasted",
              "Prefetched loads evicted before any request used them.", labels=mv),
            c("modelyard_model_prefetch_hidden_seconds",
              "Load seconds requests did not wait thanks to a prefetch.", labels=mv),
            c("modelyard_model_page_cache_warms",
              "Page-cache warm-ups of a predicted model that did not fit.", labels=mv),
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


def _scheduler(
    f: dict[str, GaugeMetricFamily | CounterMetricFamily], mv: list[str], record: ModelRecord
) -> None:
    """The scheduler's readings of ``record`` (none while it has no scheduler)."""
    if record.scheduler is None:
        return
    stats = record.scheduler.snapshot()
    f["modelyard_scheduler_queued_requests"].add_metric(mv, stats.queue_depth)
    f["modelyard_scheduler_running_requests"].add_metric(mv, stats.running_requests)
    breaker = BREAKER_STATE_VALUES.get(stats.breaker_state)
    if breaker is not None:
        f["modelyard_scheduler_breaker_state"].add_metric(mv, breaker)
    f["modelyard_scheduler_breaker_opened"].add_metric(mv, stats.breaker_times_opened)


def _worker(
    f: dict[str, GaugeMetricFamily | CounterMetricFamily], mv: list[str], record: ModelRecord
) -> None:
    """What ``record``'s resident worker reports of its memory and KV cache."""
    if record.info is None or record.state not in RESIDENT:
        return
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
