"""Real CUDA, layer offload: a GGUF model larger than a capped GPU budget loads with
part of its layers on the GPU (as many as the budget holds), the rest on the CPU, and
generates; NVML's figure for its worker stays within the GPU's budget.

Marked ``gpu`` (``scripts/gpu-check.sh``); besides a GPU it needs a llama-cpp-python
built with CUDA (``CMAKE_ARGS=-DGGML_CUDA=on pip install llama-cpp-python``), and skips
saying so without one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.examples.gguf_llama import LlamaShape, write_llama_gguf
from tests.gpu.conftest import worker_gpu_bytes
from tests.servers import running_server, write_config

pytestmark = pytest.mark.gpu

MIB = 1024 * 1024
# About 750 MB of F16 weights in 24 blocks of ~31 MB: more than the 768 MiB budget below
# holds beside the worker's CUDA context.
SHAPE = LlamaShape(layers=24, width=1024, feed_forward=4096, heads=16, kv_heads=8, merges=200)
GPU_BUDGET_MB = 768


async def test_a_gguf_bigger_than_the_gpu_budget_loads_with_partial_offload(
    tmp_path: Path,
) -> None:
    llama_cpp = pytest.importorskip("llama_cpp", reason="the llm extra runs GGUF models")
    pytest.importorskip("gguf", reason="the llm extra writes the test models")
    if not llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama-cpp-python build has no GPU offload (build it with GGML_CUDA)")
    path = write_llama_gguf(tmp_path / "big" / "1" / "model.gguf", SHAPE)
    assert path.stat().st_size > GPU_BUDGET_MB * MIB * 0.9
    model = {
        "name": "big",
        "path": "big",
        "runtime": "llama_cpp",
        "devices": ["cuda:0"],
        "load_timeout_s": 300,
        "timeout_s": 120,
        "generation": {"n_ctx": 512, "parallel": 1, "n_batch": 64},
    }
    devices = [
        {"name": "cpu", "memory_budget_mb": 8192},
        {"name": "cuda:0", "memory_budget_mb": GPU_BUDGET_MB},
    ]
    config = write_config(tmp_path, [model], devices=devices)
    async with running_server(config) as (app, client):
        body = {"text_input": "Hello world", "parameters": {"max_tokens": 8, "temperature": 0}}
        r = await client.post("/v2/models/big/generate", json=body)
        assert r.status_code == 200, r.text
        record = app.manager.resolve("big", None)
        assert record.device == "cuda:0"
        plan = record.offload
        assert plan is not None
        assert 0 < plan.gpu_layers < SHAPE.layers, plan.reason
        assert app.manager.budget.reserved("cpu", record.key) == plan.host_bytes > 0
        on_gpu = worker_gpu_bytes(record)
        assert 0 < on_gpu <= GPU_BUDGET_MB * MIB
        gpu = app.manager.budget.device("cuda:0")
        assert gpu.reserved_bytes <= gpu.budget_bytes
        offloaded = [e.message for e in app.manager.events.recent() if e.kind == "offloaded"]
        assert offloaded
        print(
            f"GPU-CHECK {path.stat().st_size / MIB:.0f} MiB GGUF under a {GPU_BUDGET_MB} MiB "
            f"cuda:0 budget: {plan.gpu_layers} of {SHAPE.layers + 1} layers offloaded, "
            f"{plan.device_bytes / MIB:.0f} MiB planned, {on_gpu / MIB:.0f} MiB measured by "
            f"NVML; host part {plan.host_bytes / MIB:.0f} MiB on cpu"
        )
