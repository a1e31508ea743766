"""The design notes' own configuration, served as written once its files exist.

The notes start the server with ``device_id``, ``max_total_memory_mb`` and
``model_config_path`` and list models without a ``runtime:``; the model file's kind
decides the runtime. Their ``.om`` (Ascend) is refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelyard.config.settings import ConfigError, load_settings
from tests.integration.llm_models import TINY
from tests.servers import running_server

pytest.importorskip("llama_cpp", reason="the llm extra runs GGUF models")
pytest.importorskip("gguf", reason="the llm extra writes the test models")

SEED_MODELS = """\
models:
- name: "llama2-7b"
  path: "{root}/models/llama2/7b/model.{suffix}"
  memory_mb: 14000
  preload: true # 服务启动时加载
  max_batch_size: 8
  priority: 1 # 抢占式调度优先级
"""
"""The notes' model config (section 3.2), its root moved to a temporary folder."""

SEED_SERVER = """\
device_id: 0
max_total_memory_mb: 32000
model_config_path: "model_config.yaml"
"""
"""The notes' ``ModelManagerConfig`` fields (section 3.3), as YAML."""


def _write_seed(root: Path, suffix: str) -> Path:
    (root / "model_config.yaml").write_text(
        SEED_MODELS.format(root=root, suffix=suffix), encoding="utf-8"
    )
    server = root / "server.yaml"
    server.write_text(SEED_SERVER, encoding="utf-8")
    return server


async def test_the_seed_config_serves_its_gguf_model(tmp_path: Path) -> None:
    from modelyard.examples.gguf_llama import write_llama_gguf

    write_llama_gguf(tmp_path / "models" / "llama2" / "7b" / "model.gguf", TINY, seed=1)
    server = _write_seed(tmp_path, "gguf")
    settings = load_settings(server)
    (model,) = settings.models
    assert model.runtime == "llama_cpp"  # inferred: the YAML names no runtime
    assert model.device == "cpu"  # device_id 0: the first configured device
    assert settings.devices[0].memory_budget_mb == 32000
    async with running_server(server) as (app, client):
        assert app.manager.resolve("llama2-7b", None).is_ready  # preload: true
        resp = await client.post(
            "/predict",
            json={"model": "llama2-7b", "text": "The quick brown fox", "max_tokens": 4},
        )
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["model"] == "llama2-7b"
        assert body["usage"]["completion_tokens"] == 4


def test_the_seed_config_with_its_om_file_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "models" / "llama2" / "7b").mkdir(parents=True)
    (tmp_path / "models" / "llama2" / "7b" / "model.om").write_bytes(b"\0" * 64)
    with pytest.raises(ConfigError, match=r"llama2-7b.*not supported: Ascend \.om"):
        load_settings(_write_seed(tmp_path, "om"))


def test_seed_fields_that_cannot_apply_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("device_id: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="device_id 3: only 1 device"):
        load_settings(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("model_config_path: missing.yaml\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"model_config_path.*cannot read"):
        load_settings(tmp_path / "b.yaml")
    (tmp_path / "c.yaml").write_text(
        "max_total_memory_mb: 100\ndevices: [{name: cpu, memory_budget_mb: 50}]\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match="not both"):
        load_settings(tmp_path / "c.yaml")


async def test_the_seed_predict_request_reaches_version_1_3(tmp_path: Path) -> None:
    from modelyard.examples.gguf_llama import write_llama_gguf

    write_llama_gguf(tmp_path / "claude" / "1.2" / "model.gguf", TINY, seed=2)
    write_llama_gguf(tmp_path / "claude" / "1.3" / "model.gguf", TINY, seed=1)
    model = {
        "name": "claude",
        "path": "claude",
        "version_policy": {"all": True},
        "generation": {"n_ctx": 48, "n_threads": 1},
    }
    (tmp_path / "server.yaml").write_text(
        f"model_repository: {tmp_path}\nmodels: [{json.dumps(model)}]\n", encoding="utf-8"
    )
    async with running_server(tmp_path / "server.yaml") as (_app, client):
        # The notes' curl, byte for byte.
        resp = await client.post(
            "/predict",
            content='{"model":"claude","version":"1.3","text":" 你好 "}'.encode(),
            headers={"Content-Type": "application/json"},
        )
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["version"] == "1.3"
        assert body["usage"]["completion_tokens"] >= 1
        older = await client.post(
            "/predict", json={"model": "claude", "version": "1.2", "text": " 你好 "}
        )
        assert older.json()["version"] == "1.2"
        newest = await client.post("/predict", json={"model": "claude", "text": " 你好 "})
        assert newest.json()["version"] == "1.3"  # 1.3 > 1.2: the default
