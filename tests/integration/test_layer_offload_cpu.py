"""``n_gpu_layers: auto`` on a CPU device: a real GGUF model in a real worker loads with
no layer offloaded, generates, and its stats say where its layers are and why.

The GPU half of layer offload is ``tests/gpu/test_llm_offload.py`` (``scripts/gpu-check.sh``)
and, on a fake NVML, ``tests/unit/manager/test_layer_offload.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.examples.gguf_llama import write_llama_gguf
from tests.integration.llm_models import PROMPT, TINY, llm_model
from tests.servers import running_server, write_config

pytest.importorskip("llama_cpp", reason="the llm extra runs GGUF models")
pytest.importorskip("gguf", reason="the llm extra writes the test models")


async def test_auto_on_a_cpu_device_offloads_no_layer_and_says_so(tmp_path: Path) -> None:
    root = tmp_path
    write_llama_gguf(root / "llama-a" / "1" / "model.gguf", TINY, seed=1)
    model = llm_model("llama-a", generation={"n_gpu_layers": "auto"})
    config = write_config(root, [model], devices=[{"name": "cpu", "memory_budget_mb": 1024}])
    async with running_server(config) as (app, client):
        body = {"text_input": PROMPT, "parameters": {"max_tokens": 4, "temperature": 0.0}}
        r = await client.post("/v2/models/llama-a/generate", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["text_output"]
        stats = (await client.get("/v2/stats")).json()
        [view] = [m for m in stats["models"] if m["name"] == "llama-a"]
        offload = view["offload"]
        assert offload["device"] == "cpu"
        assert offload["gpu_layers"] == 0
        assert offload["layers"] == 2
        assert "n_gpu_layers auto on cpu: 0 of 3 offloaded" in offload["reason"]
        record = app.manager.resolve("llama-a", None)
        # The file stays charged once, as a mapped file, on the CPU's budget.
        assert (
            app.manager.budget.device("cpu").shared_bytes
            == (root / "llama-a" / "1" / "model.gguf").stat().st_size
        )
        assert record.reserved_bytes > 0
