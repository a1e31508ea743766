"""Devices: what ``devices:`` entries name, and how a device name is read.

Three kinds of device hold models, each with its own byte budget:

* ``cpu``: the whole host, as before;
* a CPU **core set**, ``cpu:0``, ``cpu:0-1``, ``cpu:2,3`` (Linux CPU numbers): workers
  placed there are pinned to those cores (``sched_setaffinity``) and their runtime uses
  as many threads as the set has cores;
* ``cuda:N``: the N-th NVIDIA GPU, whose budget comes from its total memory (NVML) less
  a reserve, never from the host's RAM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DeviceKind = Literal["cpu", "cores", "cuda"]

DEVICE_NAME_PATTERN = r"^(cpu|cpu:\d+(-\d+)?(,\d+(-\d+)?)*|cuda:\d+)$"
"""``cpu``, a core set ``cpu:<list>`` (``0``, ``0-1``, ``2,3``, ``0-1,4``) or ``cuda:N``."""

_NAME = re.compile(DEVICE_NAME_PATTERN)

AUTO = "auto"
"""A model's ``devices: auto``: any configured device."""


@dataclass(frozen=True, slots=True)
class DeviceName:
    """A parsed device name."""

    name: str
    kind: DeviceKind
    cores: tuple[int, ...] = ()
    """The CPU numbers of a core set (empty otherwise)."""
    cuda_index: int | None = None
    """The GPU index of ``cuda:N``."""

    @property
    def is_cuda(self) -> bool:
        """True for ``cuda:N``."""
        return self.kind == "cuda"


def parse_device(name: str) -> DeviceName:
    """Read a device name; ValueError names what is wrong with it."""
    if not _NAME.match(name):
        raise ValueError(
            f"device {name!r}: expected 'cpu', a core set such as 'cpu:0-1' or 'cpu:2,3', "
            "or 'cuda:N'"
        )
    if name == "cpu":
        return DeviceName(name, "cpu")
    kind, _, rest = name.partition(":")
    if kind == "cuda":
        return DeviceName(name, "cuda", cuda_index=int(rest))
    cores: set[int] = set()
    for part in rest.split(","):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if last < first:
            raise ValueError(f"device {name!r}: range {part!r} runs backwards")
        cores.update(range(first, last + 1))
    return DeviceName(name, "cores", cores=tuple(sorted(cores)))


class DeviceConfig(BaseModel):
    """A device and the bytes loaded models may hold on it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=DEVICE_NAME_PATTERN)
    """``cpu``, a CPU core set (``cpu:0-1``, ``cpu:2,3``) or ``cuda:N``."""
    memory_budget_mb: float | None = Field(default=None, gt=0)
    """Budget in MiB. Default for ``cpu``: half of the host's RAM; for a core set: that
    half shared among the host's cores, times the set's size; for ``cuda:N``: the GPU's
    total memory (NVML) less ``reserve_mb``. A ``cuda:N`` budget set here is capped by
    that same figure: a GPU budget never comes from host RAM."""
    reserve_mb: float = Field(default=1024.0, ge=0)
    """``cuda:N`` only: device memory kept out of the budget (the CUDA context of each
    worker, the allocator's slack, other processes)."""

    @model_validator(mode="after")
    def _check(self) -> DeviceConfig:
        parse_device(self.name)  # ranges that run backwards
        return self

    @property
    def parsed(self) -> DeviceName:
        """The name, read."""
        return parse_device(self.name)


class ReplicasConfig(BaseModel):
    """How many workers (replicas) of one model version may serve at once, and when
    more are started or stopped."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min: int = Field(default=1, ge=1, le=64)
    """Replicas kept while the model is loaded."""
    max: int = Field(default=1, ge=1, le=64)
    """Most replicas scale-out may reach."""
    target_queue_depth: float = Field(default=2.0, gt=0)
    """Scale out when the requests waiting or running per replica stay above this..."""
    target_queue_wait_s: float = Field(default=0.05, gt=0)
    """...or when requests wait in the queue longer than this on average..."""
    scale_up_after_s: float = Field(default=1.0, ge=0)
    """...for this long."""
    scale_down_idle_s: float = Field(default=30.0, gt=0)
    """A spare replica that had no request for this long is stopped (down to ``min``)."""

    @model_validator(mode="after")
    def _check(self) -> ReplicasConfig:
        if self.min > self.max:
            raise ValueError(f"replicas: min ({self.min}) must not exceed max ({self.max})")
        return self


def check_core_sets(devices: list[DeviceName]) -> None:
    """Core sets must not overlap: two budgets on the same cores would both be spent."""
    seen: dict[int, str] = {}
    for dev in devices:
        for core in dev.cores:
            if core in seen:
                raise ValueError(f"devices {seen[core]} and {dev.name} share CPU {core}")
            seen[core] = dev.name
