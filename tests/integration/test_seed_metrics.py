"""The design notes' metric names on ``/metrics`` (``metrics.seed_names: true``).

A real server, a real ONNX model loaded by its first request: the notes' latency
histogram (milliseconds, their buckets), their memory gauge and the switch latency
appear beside the native families, with the notes' labels; off by default.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from modelyard.examples.mlp import build_add_onnx
from tests.servers import running_server, write_config

BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}
SEED_FAMILIES = {"model_inference_latency", "gpu_mem_usage", "model_switch_latency"}


def _config(tmp_path: Path, **server: object) -> Path:
    build_add_onnx(tmp_path / "add" / "1" / "model.onnx", 1.0)
    return write_config(tmp_path, [{"name": "add", "path": "add"}], **server)


async def _families(
    client: httpx.AsyncClient,
) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    text = (await client.get("/metrics")).text
    return {
        fam.name: [(s.name, s.labels, s.value) for s in fam.samples]
        for fam in text_string_to_metric_families(text)
    }


async def test_seed_names_are_exported_beside_the_native_ones(tmp_path: Path) -> None:
    cfg = _config(tmp_path, metrics={"seed_names": True})
    async with running_server(cfg) as (_app, client):
        for _ in range(3):
            r = await client.post("/v2/models/add/infer", json=BODY)
            assert r.status_code == 200, r.text
        fams = await _families(client)
        assert "modelyard_inference_request_duration_seconds" in fams  # native ones stay
        latency = fams["model_inference_latency"]
        buckets = {
            s[1]["le"]: s[2]
            for s in latency
            if s[0].endswith("_bucket") and s[1]["model_type"] == "add" and s[1]["version"] == "1"
        }
        assert list(buckets) == ["50.0", "100.0", "200.0", "500.0", "1000.0", "+Inf"]
        assert buckets["+Inf"] == 3
        count = next(s for s in latency if s[0].endswith("_count"))
        total = next(s for s in latency if s[0].endswith("_sum"))
        native = fams["modelyard_inference_request_duration_seconds"]
        native_sum = next(s[2] for s in native if s[0].endswith("_sum"))
        assert count[2] == 3
        assert abs(total[2] - native_sum * 1000) < 1e-6, "the same requests, in milliseconds"
        switch = fams["model_switch_latency"]
        assert next(s[2] for s in switch if s[0].endswith("_count")) == 1  # one cold start
        assert next(s[1] for s in switch if s[0].endswith("_count")) == {"model_id": "add"}
        memory = [(labels, value) for _, labels, value in fams["gpu_mem_usage"]]
        assert memory
        assert memory[0][0] == {"device_id": "cpu", "model_id": "add"}
        assert memory[0][1] > 0


async def test_seed_names_are_off_by_default(tmp_path: Path) -> None:
    async with running_server(_config(tmp_path)) as (_app, client):
        r = await client.post("/v2/models/add/infer", json=BODY)
        assert r.status_code == 200
        assert not SEED_FAMILIES & set(await _families(client))
