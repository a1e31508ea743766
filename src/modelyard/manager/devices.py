"""The server's devices: each configured device with its budget, and whether it is usable.

Built once at start from ``devices:``. A core set's cores must be ones this process may
run on; a ``cuda:N`` device needs NVML to answer for GPU ``N``, and its budget is the
GPU's total memory less the device's reserve (capped by ``memory_budget_mb`` if set),
never the host's RAM. A configured device that is not usable stays listed with its
reason and a zero budget, so a model that asks for it fails naming that reason instead
of running somewhere else.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from modelyard.config.devices import DeviceConfig, DeviceName
from modelyard.config.model_config import ModelConfig
from modelyard.config.units import MIB
from modelyard.manager.nvml import Nvml, open_nvml

__all__ = ["Device", "DeviceTable", "default_budget_bytes"]

log = logging.getLogger("modelyard.devices")


def default_budget_bytes() -> int:
    """Half of the host's physical memory."""
    import psutil

    return int(psutil.virtual_memory().total // 2)


def _usable_cores() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return set(range(os.cpu_count() or 1))


@dataclass(frozen=True, slots=True)
class Device:
    """One configured device."""

    name: str
    parsed: DeviceName
    budget_bytes: int
    unusable_reason: str = ""
    """Why no model can run here (empty: usable)."""
    total_bytes: int | None = None
    """A GPU's whole memory (NVML), for the stats view."""

    @property
    def is_usable(self) -> bool:
        """True when models may be placed here."""
        return not self.unusable_reason


class DeviceTable:
    """Every configured device, in the order of ``devices:``."""

    def __init__(
        self,
        configs: Iterable[DeviceConfig],
        *,
        nvml_opener: Callable[[], tuple[Nvml | None, str]] = open_nvml,
        host_budget_bytes: Callable[[], int] = default_budget_bytes,
        usable_cores: Callable[[], set[int]] = _usable_cores,
    ) -> None:
        configs = list(configs)
        self.nvml: Nvml | None = None
        """The GPUs' management library, when a ``cuda:N`` device is configured and NVML loads."""
        nvml_reason = ""
        if any(c.parsed.is_cuda for c in configs):
            self.nvml, nvml_reason = nvml_opener()
        cores = usable_cores()
        host_cores = max(1, len(cores))
        self.devices: dict[str, Device] = {}
        for cfg in configs:
            dev = self._build(cfg, nvml_reason, cores, host_cores, host_budget_bytes)
            if not dev.is_usable:
                log.error("device %s cannot hold models: %s", dev.name, dev.unusable_reason)
            self.devices[dev.name] = dev

    def _build(
        self,
        cfg: DeviceConfig,
        nvml_reason: str,
        cores: set[int],
        host_cores: int,
        host_budget: Callable[[], int],
    ) -> Device:
        parsed = cfg.parsed
        explicit = int(cfg.memory_budget_mb * MIB) if cfg.memory_budget_mb else None
        if parsed.kind == "cpu":
            return Device(cfg.name, parsed, explicit or host_budget())
        if parsed.kind == "cores":
            missing = sorted(set(parsed.cores) - cores)
            if missing:
                reason = (
                    f"CPU(s) {', '.join(map(str, missing))} are not available to this process "
                    f"(it may run on {_ranges(cores)})"
                )
                return Device(cfg.name, parsed, 0, reason)
            share = host_budget() * len(parsed.cores) // host_cores
            return Device(cfg.name, parsed, explicit or share)
        index = parsed.cuda_index or 0
        if self.nvml is None:
            return Device(cfg.name, parsed, 0, f"no CUDA device: {nvml_reason}")
        try:
            count = self.nvml.device_count()
            if index >= count:
                return Device(
                    cfg.name, parsed, 0, f"no CUDA device: NVML sees {count} GPU(s), not {index}"
                )
            total = self.nvml.total_memory_bytes(index)
        except Exception as exc:  # an NVML error names the driver's problem
            return Device(cfg.name, parsed, 0, f"NVML cannot read GPU {index}: {exc}")
        room = total - int(cfg.reserve_mb * MIB)
        if room <= 0:
            reason = (
                f"its reserve ({cfg.reserve_mb:g} MiB) is the whole GPU ({total / MIB:.0f} MiB)"
            )
            return Device(cfg.name, parsed, 0, reason, total)
        return Device(cfg.name, parsed, min(explicit or room, room), total_bytes=total)

    def __getitem__(self, name: str) -> Device:
        return self.devices[name]

    def budgets(self) -> dict[str, int]:
        """Each device's budget in bytes (0 for unusable devices)."""
        return {name: d.budget_bytes for name, d in self.devices.items()}

    def allowed(self, config: ModelConfig) -> list[str]:
        """The devices ``config`` may use, in its order of preference (``auto``: all).

        On a Ray cluster devices are ``NODE/cpu``, ``NODE/cuda:N``: a model's ``cpu``
        means that device of every node."""
        names = config.allowed_devices
        if names is None:
            return list(self.devices)
        out: list[str] = []
        for n in names:
            if n in self.devices:
                out.append(n)
            else:
                out.extend(d for d in self.devices if d.endswith("/" + n))
        return out

    def put(self, device: Device) -> None:
        """Add a device, or replace one (a cluster node joined, left or came back)."""
        self.devices[device.name] = device

    def clear(self) -> None:
        """Forget every device (Ray mode: the cluster's nodes replace the host's)."""
        self.devices.clear()

    def process_device_bytes(self, name: str, pid: int) -> int | None:
        """Device memory the process ``pid`` holds on GPU ``name`` (None: not a GPU, or
        NVML cannot tell)."""
        dev = self.devices.get(name)
        if dev is None or not dev.parsed.is_cuda or self.nvml is None:
            return None
        try:
            return self.nvml.process_memory_bytes(dev.parsed.cuda_index or 0).get(pid)
        except Exception:
            log.debug("NVML: no per-process reading for %s", name, exc_info=True)
            return None

    def readings(self) -> dict[str, tuple[float | None, float | None]]:
        """``(memory used by every process, utilisation)`` of each usable GPU."""
        out: dict[str, tuple[float | None, float | None]] = {}
        if self.nvml is None:
            return out
        for name, dev in self.devices.items():
            if not dev.parsed.is_cuda or not dev.is_usable:
                continue
            index = dev.parsed.cuda_index or 0
            used: float | None
            util: float | None
            try:
                used = float(self.nvml.used_memory_bytes(index))
            except Exception:
                used = None
            try:
                util = self.nvml.utilization_ratio(index)
            except Exception:
                util = None
            out[name] = (used, util)
        return out


def _ranges(cores: set[int]) -> str:
    return ",".join(map(str, sorted(cores))) or "none"
