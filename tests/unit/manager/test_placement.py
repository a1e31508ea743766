"""Placement on fake instances: which allowed device a load goes to, and why.

Two core-set devices (``cpu:0``, ``cpu:1``) and fake GPUs through a fake NVML; each
device has its own budget, and the event log says why each choice was made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modelyard.config.devices import DeviceConfig
from modelyard.config.model_config import ModelConfig
from modelyard.errors import MemoryBudgetError, ModelLoadError
from modelyard.manager.devices import DeviceTable
from modelyard.manager.manager import ModelManager
from modelyard.manager.nvml import Nvml
from modelyard.manager.states import ModelState
from modelyard.workers.instance import InstanceInfo, StartRequest
from tests.fakes.clock import FakeClock
from tests.fakes.instance import FakeInstance
from tests.fakes.nvml import GIB, FakeGpu, FakeNvml
from tests.unit.manager.settings import folder_settings

MIB = 1024 * 1024


class GpuInstance(FakeInstance):
    """A fake worker with a pid, so NVML can report its device memory."""

    def __init__(self, footprint_bytes: int, pid: int, starts: list[StartRequest]) -> None:
        super().__init__(footprint_bytes)
        self.pid = pid
        self.starts = starts

    async def start(self, request: StartRequest) -> InstanceInfo:
        self.starts.append(request)
        info = await super().start(request)
        return InstanceInfo(
            info.inputs, info.outputs, info.supports_batching, info.footprint_bytes, pid=self.pid
        )


def make(
    tmp_path: Path,
    devices: list[DeviceConfig],
    models: dict[str, dict[str, Any]],
    nvml: Nvml | None = None,
) -> tuple[ModelManager, list[StartRequest]]:
    settings = folder_settings(tmp_path, devices, models)
    table = DeviceTable(
        settings.devices,
        nvml_opener=lambda: (nvml, "" if nvml else "no NVIDIA driver answers"),
        host_budget_bytes=lambda: 1024 * MIB,
        usable_cores=lambda: {0, 1},
    )
    starts: list[StartRequest] = []

    def factory(config: ModelConfig) -> FakeInstance:
        return GpuInstance(int((config.memory_mb or 1) * MIB), 4242, starts)

    manager = ModelManager(settings, factory, clock=FakeClock(), devices=table)
    return manager, starts


CORE_SETS = [
    DeviceConfig(name="cpu:0", memory_budget_mb=100),
    DeviceConfig(name="cpu:1", memory_budget_mb=300),
]


def events(manager: ModelManager, kind: str) -> list[str]:
    return [e.message for e in manager.events.recent() if e.kind == kind]


async def test_a_model_too_big_for_the_preferred_device_goes_to_the_other(tmp_path: Path) -> None:
    manager, starts = make(
        tmp_path, CORE_SETS, {"big": {"memory_mb": 150, "devices": ["cpu:0", "cpu:1"]}}
    )
    record = await manager.load("big")
    assert record.device == "cpu:1"
    assert manager.budget.reserved("cpu:1", record.key) == 150 * MIB
    assert manager.budget.device("cpu:0").reserved_bytes == 0
    # The worker is pinned to the device's cores with one thread per core.
    assert starts[0].spec.device == "cpu:1"
    assert starts[0].spec.cores == (1,)
    assert starts[0].spec.intra_op_threads == 1
    [placed] = events(manager, "placed")
    assert placed.startswith("cpu:1: fits in free budget")
    assert "cpu:0: needs 150.0 MiB, budget 100.0" in placed
    await manager.close()


async def test_free_room_beats_evictions_and_preference_breaks_ties(tmp_path: Path) -> None:
    manager, _ = make(
        tmp_path,
        CORE_SETS,
        {
            "a": {"memory_mb": 80, "devices": ["cpu:0"]},
            "b": {"memory_mb": 60, "devices": ["cpu:0", "cpu:1"]},
            "c": {"memory_mb": 10, "devices": ["cpu:0", "cpu:1"]},
        },
    )
    await manager.load("a")
    b = await manager.load("b")
    assert b.device == "cpu:1", "cpu:0 would have to evict a; cpu:1 has room"
    assert manager.resolve("a", None).is_ready
    c = await manager.load("c")
    assert c.device == "cpu:0", "both have room: the model's own order decides"
    for name in CORE_SETS:
        dev = manager.budget.device(name.name)
        assert dev.reserved_bytes <= dev.budget_bytes
    await manager.close()


async def test_the_cheapest_eviction_wins_when_no_device_has_room(tmp_path: Path) -> None:
    manager, _ = make(
        tmp_path,
        CORE_SETS,
        {
            "slow": {"memory_mb": 90, "devices": ["cpu:0"]},
            "quick": {"memory_mb": 290, "devices": ["cpu:1"]},
            "new": {"memory_mb": 50, "devices": ["cpu:0", "cpu:1"]},
        },
    )
    slow = await manager.load("slow")
    quick = await manager.load("quick")
    slow.timings.total_s = 9.0  # reloading it would cost 9 s, the other 0.2 s
    quick.timings.total_s = 0.2
    new = await manager.load("new")
    assert new.device == "cpu:1"
    assert quick.state is ModelState.UNLOADED
    assert slow.is_ready
    assert "cpu:1: fits after evicting quick:1" in events(manager, "placed")[0]
    await manager.close()


async def test_cuda_without_a_gpu_fails_with_the_reason_never_running_on_the_cpu(
    tmp_path: Path,
) -> None:
    manager, starts = make(
        tmp_path,
        [DeviceConfig(name="cpu"), DeviceConfig(name="cuda:0")],
        {"gpu_only": {"devices": ["cuda:0"]}, "either": {"devices": ["cuda:0", "cpu"]}},
    )
    with pytest.raises(ModelLoadError, match="no CUDA device: no NVIDIA driver answers"):
        await manager.load("gpu_only")
    assert manager.resolve("gpu_only", None).state is ModelState.FAILED
    assert starts == [], "no worker started anywhere"
    either = await manager.load("either")
    assert either.device == "cpu", "its list allows the CPU: the fallback is its own choice"
    [placed] = events(manager, "placed")
    assert "cuda:0: no CUDA device" in placed, "and the log says why"
    await manager.close()


async def test_a_gpu_model_is_measured_by_nvml_per_process_and_capped(tmp_path: Path) -> None:
    gpu = FakeGpu(total_bytes=16 * GIB)
    gpu.processes[4242] = 700 * MIB  # what the worker holds on the device after warm-up
    manager, starts = make(
        tmp_path,
        [DeviceConfig(name="cpu"), DeviceConfig(name="cuda:0", reserve_mb=1024)],
        {"enc": {"memory_mb": 200, "memory_limit_mb": 900, "devices": ["cuda:0", "cpu"]}},
        nvml=FakeNvml(gpu),
    )
    record = await manager.load("enc")
    assert record.device == "cuda:0"
    assert manager.budget.device("cuda:0").budget_bytes == 15 * GIB
    assert record.measured_bytes == 700 * MIB, "NVML's per-process figure, not host USS"
    assert manager.budget.reserved("cuda:0", record.key) == 700 * MIB
    spec = starts[0]
    assert spec.spec.gpu_memory_limit_bytes == 900 * MIB
    assert spec.memory_limit_bytes is None, "no host address-space limit under CUDA"
    await manager.close()


async def test_no_room_on_any_device_names_the_budget_refusal(tmp_path: Path) -> None:
    manager, _ = make(
        tmp_path,
        CORE_SETS,
        {
            "p0": {"memory_mb": 90, "devices": ["cpu:0"], "pinned": True},
            "p1": {"memory_mb": 290, "devices": ["cpu:1"], "pinned": True},
            "late": {"memory_mb": 50, "devices": ["cpu:0", "cpu:1"]},
        },
    )
    await manager.load("p0")
    await manager.load("p1")
    with pytest.raises(MemoryBudgetError) as refused:
        await manager.load("late")
    assert "pinned: p0:1, p1:1" in refused.value.message
    assert "on every device it allows" in refused.value.message
    await manager.close()
