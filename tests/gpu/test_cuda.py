"""Real CUDA: placement on a GPU, device bytes measured per model through NVML, the
per-model GPU memory cap enforced, and no silent fallback to the CPU.

Marked ``gpu``: deselected by default, skipped with the reason where no GPU exists
(``conftest.py``); ``scripts/gpu-check.sh`` runs them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from modelyard.examples.mlp import build_mlp_onnx
from modelyard.manager.nvml import open_nvml
from tests.gpu.conftest import worker_gpu_bytes
from tests.servers import running_server, write_config

pytestmark = pytest.mark.gpu

MIB = 1024 * 1024
DEVICES = [{"name": "cpu", "memory_budget_mb": 2048}, {"name": "cuda:0", "reserve_mb": 1024}]


@pytest.fixture(scope="module")
def gpu_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gpu-repo")
    build_mlp_onnx(root / "small" / "1" / "model.onnx", 8)
    build_mlp_onnx(root / "big" / "1" / "model.onnx", 256)
    return root


def body(batch: int = 4) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "x", "shape": [batch, 64], "datatype": "FP32", "data": [0.5] * (64 * batch)}
        ]
    }


def metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_a_model_is_placed_on_the_gpu_and_measured_there(gpu_root: Path) -> None:
    model = {"name": "small", "path": "small", "devices": ["cuda:0", "cpu"]}
    config = write_config(gpu_root, [model], devices=DEVICES)
    async with running_server(config) as (app, client):
        r = await client.post("/v2/models/small/infer", json=body())
        assert r.status_code == 200, r.text
        record = app.manager.resolve("small", None)
        assert record.device == "cuda:0"
        placed = [e.message for e in app.manager.events.recent() if e.kind == "placed"]
        assert placed
        assert placed[0].startswith("cuda:0: fits in free budget")
        # The footprint is the worker's device memory as NVML reports it per process.
        on_gpu = worker_gpu_bytes(record)
        assert on_gpu > 0
        assert record.measured_bytes is not None
        assert record.measured_bytes > 0
        assert app.manager.budget.reserved("cuda:0", record.key) == record.measured_bytes
        device = app.manager.devices["cuda:0"]
        assert device.total_bytes is not None
        assert device.budget_bytes == device.total_bytes - 1024 * MIB, "from NVML, not host RAM"
        text = (await client.get("/metrics")).text
        held = metric(text, "modelyard_model_device_memory_bytes", device="cuda:0", model="small")
        assert held is not None
        assert held > 0
        util = metric(text, "modelyard_device_utilization_ratio", device="cuda:0")
        assert util is not None
        stats = (await client.get("/v2/stats")).json()
        [gpu] = [d for d in stats["devices"] if d["name"] == "cuda:0"]
        assert gpu["kind"] == "cuda"
        print(
            f"GPU-CHECK placed small on cuda:0; NVML {on_gpu / MIB:.1f} MiB for the worker; "
            f"budget {device.budget_bytes / MIB:.0f} MiB of {device.total_bytes / MIB:.0f}"
        )


async def test_the_gpu_memory_cap_is_enforced(gpu_root: Path) -> None:
    capped = {
        "name": "big",
        "path": "big",
        "devices": ["cuda:0"],
        "memory_limit_mb": 64,
        "load_timeout_s": 120,
    }
    small = {"name": "small", "path": "small", "devices": ["cuda:0"]}
    config = write_config(gpu_root, [capped, small], devices=DEVICES)
    async with running_server(config) as (_, client):
        r = await client.post("/v2/models/big/infer", json=body())
        assert r.status_code in (500, 503), r.text
        assert "failed to load" in r.json()["error"]
        # The server keeps serving other models on the same GPU.
        assert (await client.post("/v2/models/small/infer", json=body())).status_code == 200
        print(
            f"GPU-CHECK a 256 MiB model capped at 64 MiB of GPU memory: {r.json()['error'][:200]}"
        )


async def test_a_missing_gpu_is_never_replaced_by_the_cpu(gpu_root: Path) -> None:
    nvml, _ = open_nvml()
    assert nvml is not None
    absent = f"cuda:{nvml.device_count()}"
    devices = [*DEVICES, {"name": absent}]
    strict = {"name": "small", "path": "small", "devices": [absent]}
    config = write_config(gpu_root, [strict], devices=devices)
    async with running_server(config) as (app, client):
        r = await client.post("/v2/models/small/infer", json=body())
        assert r.status_code in (500, 503), r.text
        assert f"NVML sees {nvml.device_count()} GPU(s)" in r.json()["error"]
        assert app.manager.resolve("small", None).instance is None, "nothing ran on the CPU"
        print(f"GPU-CHECK {absent} refused: {r.json()['error'][:200]}")


async def test_torch_runs_on_the_gpu_under_its_memory_fraction(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="the torch extra is not installed")
    if not torch.cuda.is_available():
        pytest.skip(f"no GPU: this torch build ({torch.__version__}) has no CUDA")
    module = torch.jit.script(torch.nn.Linear(64, 10))
    (tmp_path / "lin" / "1").mkdir(parents=True)
    module.save(str(tmp_path / "lin" / "1" / "model.pt"))
    model = {
        "name": "lin",
        "path": "lin",
        "runtime": "torch",
        "devices": ["cuda:0"],
        "memory_limit_mb": 512,
        "options": {"inputs": "x:FP32:-1x64", "outputs": "y:FP32:-1x10"},
    }
    config = write_config(tmp_path, [model], devices=DEVICES)
    async with running_server(config) as (app, client):
        r = await client.post("/v2/models/lin/infer", json=body())
        assert r.status_code == 200, r.text
        record = app.manager.resolve("lin", None)
        assert record.device == "cuda:0"
        assert record.measured_bytes is not None
        print(f"GPU-CHECK torch on cuda:0, {record.measured_bytes / MIB:.1f} MiB measured by NVML")
