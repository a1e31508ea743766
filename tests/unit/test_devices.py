"""Devices: names, budgets per device, the NVML-backed GPU budget and refusals.

NVML is a fake (``tests/fakes/nvml.py``): the figures a driver would report, no GPU.
"""

from __future__ import annotations

import pytest

from modelyard.config.devices import DeviceConfig, parse_device
from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import ServerSettings
from modelyard.manager.devices import DeviceTable
from modelyard.manager.nvml import Nvml
from tests.fakes.nvml import GIB, FakeGpu, FakeNvml

MIB = 1024 * 1024
HOST_HALF = 8 * GIB


def table(
    *configs: DeviceConfig, nvml: Nvml | None = None, reason: str = "no NVML here"
) -> DeviceTable:
    return DeviceTable(
        configs,
        nvml_opener=lambda: (nvml, "" if nvml is not None else reason),
        host_budget_bytes=lambda: HOST_HALF,
        usable_cores=lambda: {0, 1, 2, 3},
    )


def test_device_names_are_read() -> None:
    assert parse_device("cpu").kind == "cpu"
    assert parse_device("cpu:1").cores == (1,)
    assert parse_device("cpu:0-1,3").cores == (0, 1, 3)
    assert parse_device("cuda:2").cuda_index == 2
    for bad in ("gpu", "cpu:", "cuda", "cpu:a", "cuda:-1"):
        with pytest.raises(ValueError, match="expected 'cpu'"):
            parse_device(bad)
    with pytest.raises(ValueError, match="backwards"):
        DeviceConfig(name="cpu:3-1")


def test_settings_refuse_overlapping_core_sets_and_unknown_devices() -> None:
    with pytest.raises(ValueError, match="share CPU 1"):
        ServerSettings(devices=[DeviceConfig(name="cpu:0-1"), DeviceConfig(name="cpu:1")])
    with pytest.raises(ValueError, match="unknown device 'cuda:0'"):
        ServerSettings(
            devices=[DeviceConfig(name="cpu")],
            models=[ModelConfig(name="m", path="m", devices=["cuda:0", "cpu"])],
        )
    with pytest.raises(ValueError, match="not both"):
        ModelConfig.model_validate(
            {"name": "m", "path": "m", "device": "cpu", "devices": ["cpu:0"]}
        )
    # The older spelling of one device loads as the list.
    one = ModelConfig.model_validate({"name": "m", "path": "m", "device": "cpu:1"})
    assert one.devices == ["cpu:1"]
    assert one.allowed_devices == ["cpu:1"]
    with pytest.raises(ValueError, match="min"):
        ModelConfig(name="m", path="m", replicas={"min": 3, "max": 2})
    auto = ModelConfig(name="m", path="m", devices="auto")
    assert auto.allowed_devices is None
    assert ModelConfig(name="m", path="m").allowed_devices == ["cpu"]


def test_a_gpu_budget_comes_from_nvml_less_the_reserve_never_from_host_ram() -> None:
    nvml = FakeNvml(FakeGpu(total_bytes=16 * GIB), FakeGpu(total_bytes=24 * GIB))
    devices = table(
        DeviceConfig(name="cuda:0"),
        DeviceConfig(name="cuda:1", reserve_mb=2048, memory_budget_mb=100_000),
        DeviceConfig(name="cuda:2"),
        nvml=nvml,
    )
    assert devices["cuda:0"].budget_bytes == 16 * GIB - 1024 * MIB
    assert devices["cuda:0"].total_bytes == 16 * GIB
    # An explicit budget larger than the GPU is capped by the GPU, not granted.
    assert devices["cuda:1"].budget_bytes == 24 * GIB - 2048 * MIB
    assert not devices["cuda:2"].is_usable
    assert "NVML sees 2 GPU(s)" in devices["cuda:2"].unusable_reason
    assert devices.budgets()["cuda:2"] == 0


def test_without_nvml_a_gpu_is_listed_unusable_with_the_reason() -> None:
    devices = table(DeviceConfig(name="cpu"), DeviceConfig(name="cuda:0"), reason="no driver")
    assert devices["cpu"].budget_bytes == HOST_HALF
    assert devices["cuda:0"].budget_bytes == 0, "never half the host's RAM"
    assert devices["cuda:0"].unusable_reason == "no CUDA device: no driver"


def test_nvml_is_not_opened_without_a_gpu_device() -> None:
    opened: list[bool] = []

    def opener() -> tuple[Nvml | None, str]:
        opened.append(True)
        return None, "unused"

    DeviceTable([DeviceConfig(name="cpu:0")], nvml_opener=opener, usable_cores=lambda: {0, 1})
    assert opened == []


def test_a_core_set_gets_its_share_of_the_host_budget_or_its_own() -> None:
    devices = table(
        DeviceConfig(name="cpu:0"),
        DeviceConfig(name="cpu:1-2", memory_budget_mb=300),
        DeviceConfig(name="cpu:3,7"),
    )
    assert devices["cpu:0"].budget_bytes == HOST_HALF // 4
    assert devices["cpu:1-2"].budget_bytes == 300 * MIB
    assert not devices["cpu:3,7"].is_usable
    assert "CPU(s) 7 are not available" in devices["cpu:3,7"].unusable_reason


def test_per_process_readings_and_utilisation_come_from_nvml() -> None:
    gpu = FakeGpu(total_bytes=16 * GIB, used_bytes=3 * GIB, utilization=0.25)
    gpu.processes[4242] = 700 * MIB
    devices = table(DeviceConfig(name="cpu"), DeviceConfig(name="cuda:0"), nvml=FakeNvml(gpu))
    assert devices.process_device_bytes("cuda:0", 4242) == 700 * MIB
    assert devices.process_device_bytes("cuda:0", 1) is None
    assert devices.process_device_bytes("cpu", 4242) is None
    assert devices.readings() == {"cuda:0": (float(3 * GIB), 0.25)}
