"""The design notes' metric names, exported beside the native ones (``metrics.seed_names``).

A user arriving with the notes' dashboards and alerts finds their series under the names,
labels and buckets the notes give (see docs/seeds.md):

* ``model_inference_latency{model_type, version}``: a histogram of each request's time
  from receipt to answer, in **milliseconds**, buckets 50, 100, 200, 500, 1000 (the
  notes' own); ``model_type`` is the model's name (the notes' ``ModelType``);
* ``gpu_mem_usage{device_id, model_id}``: a gauge of the bytes each model's resident
  replicas hold on each device (``modelyard_model_device_memory_bytes``); ``device_id``
  is the GPU index for ``cuda:N`` and the device's name otherwise (``cpu``);
* ``model_switch_latency{model_id}``: a histogram of the seconds from a request arriving
  for a model that is not resident to that model being ready (a cold start as the
  request lived it; ``modelyard_model_cold_start_wait_seconds`` is the same figure).

The native series stay: these are extra families, off unless asked for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from modelyard.observability.collector import ManagerCollector
from modelyard.observability.histogram import FastHistogram, HistogramChild

if TYPE_CHECKING:
    from modelyard.manager.manager import ModelManager

SEED_LATENCY_BUCKETS_MS = (50.0, 100.0, 200.0, 500.0, 1000.0)
"""``model_inference_latency``'s buckets, as the notes list them (milliseconds)."""
SEED_SWITCH_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""``model_switch_latency``'s buckets (the notes give none): seconds."""


def device_id(device: str) -> str:
    """The notes' ``device_id`` of a device: ``N`` for ``cuda:N``, else its name."""
    kind, _, index = device.partition(":")
    return index if kind == "cuda" and index else device


class SeedMetrics:
    """The notes' histograms; the gauge is read at scrape time (:class:`SeedMemoryCollector`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.latency_ms = FastHistogram(
            "model_inference_latency",
            "Inference request latency in milliseconds, receipt to answer (seed name).",
            ("model_type", "version"),
            buckets=SEED_LATENCY_BUCKETS_MS,
            registry=registry,
        )
        self.switch_s = FastHistogram(
            "model_switch_latency",
            "Seconds from a request for a non-resident model to the model being ready (seed name).",
            ("model_id",),
            buckets=SEED_SWITCH_BUCKETS_S,
            registry=registry,
        )

    def latency_child(self, model: str, version: str) -> HistogramChild:
        """The ``model_inference_latency`` child of one model version (observe ms)."""
        return self.latency_ms.labels(model, version)

    def switch(self, model: str, wait_s: float) -> None:
        """A request waited ``wait_s`` for ``model`` to become ready."""
        self.switch_s.labels(model).observe(wait_s)

    def bind(self, manager: ModelManager) -> None:
        """Register ``gpu_mem_usage``, read from ``manager`` at scrape time."""
        self.registry.register(SeedMemoryCollector(manager))


class SeedMemoryCollector(Collector):
    """``gpu_mem_usage{device_id, model_id}`` from the manager's resident models."""

    def __init__(self, manager: ModelManager) -> None:
        self._manager = manager

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "gpu_mem_usage",
            "Bytes a model's resident replicas hold on a device (seed name).",
            labels=["device_id", "model_id"],
        )

    def describe(self) -> Iterable[Metric]:
        """The family, without samples."""
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        """One reading per (device, model) that holds bytes."""
        family = self._family()
        held: dict[tuple[str, str], int] = {}
        reader = ManagerCollector(self._manager)
        for record in self._manager.records():
            for device, nbytes in reader.device_bytes(record):
                key = (device_id(device), record.key.name)
                held[key] = held.get(key, 0) + nbytes
        for (dev, model), nbytes in held.items():
            family.add_metric([dev, model], nbytes)
        return [family]
