"""Layer offload of GGUF models on a fake GPU: how many layers fit the device's free
budget, what goes to the host's ``cpu`` budget, what the worker is told, and what the
event log and the stats say.

The GGUF files are real (written with the gguf package here); the GPU is a fake NVML
with a budget capped by ``memory_budget_mb``, and the workers are fake instances.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modelyard.config.devices import DeviceConfig
from modelyard.config.model_config import GenerationConfig
from modelyard.errors import MemoryBudgetError
from modelyard.examples.gguf_llama import LlamaShape, write_llama_gguf
from modelyard.manager.llm_memory import GPU_WORKER_BYTES, LayerSplit, split_layers
from modelyard.manager.manager import ModelManager
from modelyard.manager.states import ModelState
from modelyard.manager.stats import ManagerView
from modelyard.workers.instance import StartRequest
from tests.fakes.nvml import GIB, FakeGpu, FakeNvml
from tests.unit.manager.test_placement import make

pytest.importorskip("gguf", reason="the llm extra writes the test models")

MIB = 1024 * 1024
SHAPE = LlamaShape(layers=8, width=256, feed_forward=512, heads=4, kv_heads=2, merges=50)
GENERATION = {"n_ctx": 256, "parallel": 1, "n_batch": 8}
PID = 4242
FIXED_MB = GPU_WORKER_BYTES / MIB
"""The worker's CUDA context and pools, planned for on every GPU budget."""


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = write_llama_gguf(tmp_path_factory.mktemp("offload") / "m.gguf", SHAPE)
    return path.read_bytes()


def llm(**fields: Any) -> dict[str, Any]:
    generation = dict(GENERATION)
    generation.update(fields.pop("generation", {}))
    return {"runtime": "llama_cpp", "generation": generation, **fields}


def setup(
    tmp_path: Path,
    gguf_bytes: bytes,
    models: dict[str, dict[str, Any]],
    *,
    gpu_mb: float,
    cpu_mb: float = 1024,
    gpu: FakeGpu | None = None,
) -> tuple[ModelManager, list[StartRequest], LayerSplit]:
    devices = [
        DeviceConfig(name="cpu", memory_budget_mb=cpu_mb),
        DeviceConfig(name="cuda:0", memory_budget_mb=gpu_mb),
    ]
    manager, starts = make(tmp_path, devices, models, FakeNvml(gpu or FakeGpu(16 * GIB)))
    split = None
    for name, fields in models.items():
        if fields.get("runtime") == "llama_cpp":
            path = tmp_path / name / "1" / "model.gguf"
            path.write_bytes(gguf_bytes)
            split = split_layers(path, GenerationConfig(**GENERATION), GPU_WORKER_BYTES)
    assert split is not None
    return manager, starts, split


def messages(manager: ModelManager, kind: str) -> list[str]:
    return [e.message for e in manager.events.recent() if e.kind == kind]


async def test_a_gguf_bigger_than_the_gpu_budget_is_offloaded_in_part(
    tmp_path: Path, gguf_bytes: bytes
) -> None:
    gpu = FakeGpu(16 * GIB)
    manager, starts, split = setup(
        tmp_path, gguf_bytes, {"llm": llm(devices=["cuda:0", "cpu"])}, gpu_mb=FIXED_MB + 5, gpu=gpu
    )
    budget = int((FIXED_MB + 5) * MIB)
    expected = split.most_that_fit(budget)
    assert 0 < expected < split.layers, "the shape is chosen so that only part fits"
    gpu.processes[PID] = split.device_bytes(expected)  # what the worker holds there
    record = await manager.load("llm")
    assert record.device == "cuda:0"
    plan = record.offload
    assert plan is not None
    assert plan.gpu_layers == expected
    # The worker is started with the chosen number, on the GPU.
    assert starts[0].spec.options["n_gpu_layers"] == str(expected)
    assert starts[0].spec.device == "cuda:0"
    # Device part on the GPU (no mapped file there), the rest on the host's budget.
    assert manager.budget.reserved("cuda:0", record.key) == split.device_bytes(expected)
    assert manager.budget.device("cuda:0").shared == {}
    assert manager.budget.reserved("cpu", record.key) == split.host_bytes(expected)
    assert plan.host_bytes == split.host_bytes(expected)
    for name in ("cpu", "cuda:0"):
        dev = manager.budget.device(name)
        assert dev.reserved_bytes <= dev.budget_bytes
    [why] = messages(manager, "offloaded")
    head = f"n_gpu_layers auto: {expected} of {split.layers + 1} fit in {FIXED_MB + 5:.1f} MiB"
    assert why.startswith(head)
    assert f"{expected} of {split.layers} layers on the device" in why
    assert "host part charged to cpu" in why
    [view] = [m for m in ManagerView.of(manager).stats_json()["models"] if m["name"] == "llm"]
    assert view["offload"]["gpu_layers"] == expected
    assert view["offload"]["host_device"] == "cpu"
    # Unloading gives back both parts.
    await manager.unload("llm")
    assert manager.budget.device("cuda:0").reserved_bytes == 0
    assert manager.budget.device("cpu").reserved_bytes == 0
    await manager.close()


async def test_a_gguf_that_fits_goes_to_the_gpu_whole(tmp_path: Path, gguf_bytes: bytes) -> None:
    manager, starts, split = setup(
        tmp_path, gguf_bytes, {"llm": llm(devices=["cuda:0"])}, gpu_mb=FIXED_MB + 512
    )
    record = await manager.load("llm")
    assert record.offload is not None
    assert record.offload.gpu_layers == split.layers + 1, "every block and the output"
    assert starts[0].spec.options["n_gpu_layers"] == str(split.layers + 1)
    assert manager.budget.reserved("cpu", record.key) == split.host_bytes(split.layers + 1)
    await manager.close()


async def test_a_fixed_n_gpu_layers_is_kept(tmp_path: Path, gguf_bytes: bytes) -> None:
    manager, starts, split = setup(
        tmp_path,
        gguf_bytes,
        {"llm": llm(devices=["cuda:0"], generation={"n_gpu_layers": 2})},
        gpu_mb=FIXED_MB + 512,
    )
    record = await manager.load("llm")
    assert starts[0].spec.options["n_gpu_layers"] == "2"
    assert record.offload is not None
    assert record.offload.device_bytes == split.device_bytes(2), "reserved before the load"
    assert "n_gpu_layers 2 set in the config" in messages(manager, "offloaded")[0]
    await manager.close()


async def test_free_room_first_evicting_only_for_the_first_layer(
    tmp_path: Path, gguf_bytes: bytes
) -> None:
    models = {
        "enc": {"memory_mb": 4, "devices": ["cuda:0"]},
        "llm": llm(devices=["cuda:0"]),
    }
    manager, _, split = setup(tmp_path, gguf_bytes, models, gpu_mb=FIXED_MB + 6)
    enc = await manager.load("enc")
    free = manager.budget.device("cuda:0").free_bytes
    room = split.most_that_fit(free)
    assert room >= 1
    record = await manager.load("llm")
    assert enc.is_ready, "one layer fit in the free room: nothing evicted for more"
    assert record.offload is not None
    assert record.offload.gpu_layers == room
    await manager.unload("llm")

    # Not even one layer fits: the encoder is evicted, and the room it gives back is
    # used for as many layers as fit.
    models["enc"]["memory_mb"] = FIXED_MB + 5.9
    manager2, _, split = setup(tmp_path / "b", gguf_bytes, models, gpu_mb=FIXED_MB + 6)
    enc2 = await manager2.load("enc")
    assert manager2.budget.device("cuda:0").free_bytes < split.device_bytes(1)
    record2 = await manager2.load("llm")
    assert enc2.state is ModelState.UNLOADED
    assert record2.offload is not None
    assert record2.offload.gpu_layers == split.most_that_fit(int((FIXED_MB + 6) * MIB))
    assert "after evicting enc:1" in messages(manager2, "offloaded")[0]
    await manager.close()
    await manager2.close()


async def test_a_host_part_that_does_not_fit_refuses_and_frees_the_gpu(
    tmp_path: Path, gguf_bytes: bytes
) -> None:
    manager, starts, _ = setup(
        tmp_path, gguf_bytes, {"llm": llm(devices=["cuda:0"])}, gpu_mb=FIXED_MB + 2, cpu_mb=1
    )
    with pytest.raises(MemoryBudgetError):
        await manager.load("llm")
    assert starts == []
    assert manager.budget.device("cuda:0").reserved_bytes == 0, "the GPU part is given back"
    assert manager.budget.device("cpu").reserved_bytes == 0
    await manager.close()


async def test_on_a_cpu_device_auto_is_zero_layers(tmp_path: Path, gguf_bytes: bytes) -> None:
    manager, starts, split = setup(tmp_path, gguf_bytes, {"llm": llm(devices=["cpu"])}, gpu_mb=5)
    record = await manager.load("llm")
    assert record.device == "cpu"
    assert starts[0].spec.options["n_gpu_layers"] == "0"
    assert record.offload is not None
    assert record.offload.gpu_layers == 0
    assert "0 of 9 offloaded, every layer on the CPU" in record.offload.reason
    # The file is charged once as a mapped file, as before.
    [charge] = manager.budget.device("cpu").shared.values()
    assert charge.file.size == len(gguf_bytes)
    assert split.layers == SHAPE.layers
    await manager.close()


async def test_a_gpu_too_small_for_one_layer_is_refused_with_the_reason(
    tmp_path: Path, gguf_bytes: bytes
) -> None:
    manager, starts, _ = setup(tmp_path, gguf_bytes, {"llm": llm(devices=["cuda:0"])}, gpu_mb=64)
    with pytest.raises(MemoryBudgetError, match="for its first layer alone") as refused:
        await manager.load("llm")
    assert "budget of cuda:0" in refused.value.message
    assert starts == []
    await manager.close()
