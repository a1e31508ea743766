"""CUDA device readings for the metrics collector, without importing torch or creating a
CUDA context in the server."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("modelyard.metrics")


def cuda_readings(devices: Iterable[str]) -> dict[str, tuple[float | None, float | None]]:
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
