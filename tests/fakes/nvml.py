"""A fake NVML for unit tests: GPUs with a total, a used figure, a utilisation and
per-process memory that a test sets; no driver."""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 1024**3


@dataclass
class FakeGpu:
    """One fake GPU's figures."""

    total_bytes: int = 80 * GIB
    used_bytes: int = 0
    utilization: float = 0.0
    processes: dict[int, int] = field(default_factory=dict)
    """pid → device bytes."""


class FakeNvml:
    """Implements :class:`modelyard.manager.nvml.Nvml` over :class:`FakeGpu` s."""

    def __init__(self, *gpus: FakeGpu) -> None:
        self.gpus = list(gpus)

    def device_count(self) -> int:
        """How many fake GPUs there are."""
        return len(self.gpus)

    def total_memory_bytes(self, index: int) -> int:
        """The fake GPU's total."""
        return self.gpus[index].total_bytes

    def used_memory_bytes(self, index: int) -> int:
        """The fake GPU's used figure."""
        return self.gpus[index].used_bytes

    def utilization_ratio(self, index: int) -> float:
        """The fake GPU's utilisation."""
        return self.gpus[index].utilization

    def process_memory_bytes(self, index: int) -> dict[int, int]:
        """The fake GPU's processes."""
        return dict(self.gpus[index].processes)
