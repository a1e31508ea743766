"""LoRA adapters over a shared base: real GGUF files and adapters written here, real
workers, a real server.

An adapter (``base:`` in the YAML) is named like any model on every API and answers
with its own text; the base's file is charged once in the budget however many adapters
map it, each adapter's own bytes are in its private part, and unloading an adapter or the
base leaves the others serving, the file charged until its last user goes.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from modelyard.app import App
from modelyard.manager.records import ModelRecord
from modelyard.workers.footprint import MappedFile
from tests.integration.llm_models import PROMPT, TINY, llm_model
from tests.servers import running_server, settled, write_config

pytest.importorskip("llama_cpp", reason="the llm extra runs GGUF models")
pytest.importorskip("gguf", reason="the llm extra writes the test models")

ADAPTERS = ("lora-1", "lora-2")


@pytest.fixture(scope="module")
def lora_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from modelyard.examples.gguf_llama import write_llama_gguf
    from modelyard.examples.gguf_lora import write_lora_gguf

    root = tmp_path_factory.mktemp("lora-repo")
    write_llama_gguf(root / "llama-a" / "1" / "model.gguf", TINY, seed=1)
    for i, name in enumerate(ADAPTERS):
        write_lora_gguf(root / name / "1" / "adapter.gguf", TINY, seed=10 + i)
    return root


def _config(root: Path) -> Path:
    models = [llm_model("llama-a")] + [llm_model(n, base="llama-a") for n in ADAPTERS]
    return write_config(root, models, devices=[{"name": "cpu", "memory_budget_mb": 1024}])


async def _completion(client: httpx.AsyncClient, model: str) -> str:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    text: str = r.json()["choices"][0]["text"]
    return text


async def test_adapters_answer_with_their_own_text_on_every_api(lora_root: Path) -> None:
    async with running_server(_config(lora_root)) as (_app, client):
        texts = {m: await _completion(client, m) for m in ("llama-a", *ADAPTERS)}
        assert len(set(texts.values())) == 3, texts  # each adapter changes the output
        # The same adapter, the same greedy text, through the generate extension.
        body = {"text_input": PROMPT, "parameters": {"max_tokens": 12, "temperature": 0}}
        r = await client.post("/v2/models/lora-1/generate", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["text_output"] == texts["lora-1"]
        chat = {"model": "lora-2", "messages": [{"role": "user", "content": "hi"}]}
        r = await client.post("/v1/chat/completions", json={**chat, "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "lora-2"


async def test_the_base_file_is_charged_once_and_outlives_any_one_user(lora_root: Path) -> None:
    base = MappedFile.of(lora_root / "llama-a" / "1" / "model.gguf")
    adapter_bytes = (lora_root / "lora-1" / "1" / "adapter.gguf").stat().st_size
    async with running_server(_config(lora_root)) as (app, client):
        for model in ("llama-a", *ADAPTERS):
            await _completion(client, model)
        await settled(app)
        dev = app.manager.budget.device("cpu")
        assert list(dev.shared) == [base]
        keys = {r.key for r in app.manager.records()}
        assert dev.shared[base].users == keys
        assert dev.reserved_bytes == sum(dev.reservations.values()) + base.size
        for name in ADAPTERS:  # the adapter's own tensors are read into its worker
            assert _record(app, name).reserved_bytes >= adapter_bytes

        # An adapter goes: the base and the other adapter keep serving, the file stays.
        await app.manager.unload("lora-1")
        assert _record(app, "llama-a").is_ready
        assert list(dev.shared) == [base]
        # The base goes too: the remaining adapter maps the file, still charged.
        await app.manager.unload("llama-a")
        assert list(dev.shared) == [base]
        assert dev.shared[base].users == {_record(app, "lora-2").key}
        await _completion(client, "lora-2")
        await app.manager.unload("lora-2")
        assert dev.shared == {}
        assert dev.reserved_bytes == 0


def _record(app: App, name: str) -> ModelRecord:
    return next(r for r in app.manager.records() if r.key.name == name)
