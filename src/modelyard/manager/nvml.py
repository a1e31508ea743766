"""NVML readings of NVIDIA GPUs: total and used memory, utilisation, memory per process.

The server reads GPUs only through :class:`Nvml`, so no CUDA context is ever created in
the server process (NVML is the driver's management library, not CUDA), and unit tests
pass a fake. :func:`open_nvml` loads the real one (``nvidia-ml-py``, the ``gpu`` extra)
lazily and says why when it cannot.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Protocol

log = logging.getLogger("modelyard.devices")


class NvmlError(RuntimeError):
    """NVML could not be loaded or could not answer."""


class Nvml(Protocol):
    """The NVML queries the server uses."""

    def device_count(self) -> int:
        """How many GPUs the driver sees."""
        ...

    def total_memory_bytes(self, index: int) -> int:
        """The GPU's memory."""
        ...

    def used_memory_bytes(self, index: int) -> int:
        """Memory in use by every process on the GPU (what nvidia-smi shows)."""
        ...

    def utilization_ratio(self, index: int) -> float:
        """Share of the last sample period the GPU was busy, 0 to 1."""
        ...

    def process_memory_bytes(self, index: int) -> dict[int, int]:
        """Device memory each compute process (by pid) holds on the GPU."""
        ...


class DriverNvml:
    """The real NVML through ``pynvml`` (package ``nvidia-ml-py``)."""

    def __init__(self, module: Any) -> None:
        self._nvml = module
        self._handles: dict[int, Any] = {}

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self._nvml.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def device_count(self) -> int:
        """How many GPUs the driver sees."""
        return int(self._nvml.nvmlDeviceGetCount())

    def total_memory_bytes(self, index: int) -> int:
        """The GPU's memory."""
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle(index)).total)

    def used_memory_bytes(self, index: int) -> int:
        """Memory in use by every process on the GPU."""
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle(index)).used)

    def utilization_ratio(self, index: int) -> float:
        """Share of the last sample period the GPU was busy."""
        return float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle(index)).gpu) / 100.0

    def process_memory_bytes(self, index: int) -> dict[int, int]:
        """Device memory per compute process; None figures (no permission) count as 0."""
        procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle(index))
        return {int(p.pid): int(p.usedGpuMemory or 0) for p in procs}


def open_nvml() -> tuple[Nvml | None, str]:
    """The driver's NVML, or None and the reason (no package, no driver, no GPU)."""
    try:
        module = importlib.import_module("pynvml")
    except ImportError:
        return None, (
            "NVML is not installed (install modelyard's 'gpu' extra: nvidia-ml-py, onnxruntime-gpu)"
        )
    try:
        module.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, f"no NVIDIA driver answers ({type(exc).__name__}: {exc})"
    return DriverNvml(module), ""
