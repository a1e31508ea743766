"""LoRA adapters over a shared base: real GGUF files and adapters written here, real
workers, a real server.

An adapter (``base:`` in the YAML) runs as a context of its own inside its base's
worker process: named like any model on every API, it answers with the text a
separate llama.cpp context with that adapter applied gives; the base is loaded (and
charged) once, each adapter's bytes and KV cache on its own record; unloading or
evicting an adapter leaves the base serving; a base in use is never an eviction
candidate, and unloading it takes its adapters first; a bad adapter is a typed load
error, the base serving on.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import psutil
import pytest

from modelyard.app import App
from modelyard.manager.records import ModelRecord
from modelyard.manager.states import ModelState
from modelyard.workers.adapter_instance import AdapterInstance
from modelyard.workers.footprint import MappedFile
from tests.integration.llm_models import (
    N_TOKENS,
    OTHER,
    PROMPT,
    TINY,
    greedy_ids,
    llm_model,
    reference_tokens,
)
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
    write_llama_gguf(root / "llama-b" / "1" / "model.gguf", OTHER, seed=2)
    for i, name in enumerate(ADAPTERS):
        write_lora_gguf(root / name / "1" / "adapter.gguf", TINY, seed=10 + i)
    # Made for another model (three blocks, not two): llama.cpp refuses it over llama-a.
    write_lora_gguf(root / "lora-other" / "1" / "adapter.gguf", OTHER, seed=20)
    corrupt = root / "lora-corrupt" / "1" / "adapter.gguf"
    corrupt.parent.mkdir(parents=True)
    good = (root / "lora-1" / "1" / "adapter.gguf").read_bytes()
    corrupt.write_bytes(good[: len(good) // 3])  # a header whose tensors are cut off
    return root


def _config(root: Path, *extra: str) -> Path:
    models = [llm_model("llama-a"), llm_model("llama-b")]
    models += [llm_model(n, base="llama-a") for n in (*ADAPTERS, *extra)]
    return write_config(root, models, devices=[{"name": "cpu", "memory_budget_mb": 1024}])


async def _completion(client: httpx.AsyncClient, model: str) -> str:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    text: str = r.json()["choices"][0]["text"]
    return text


def _record(app: App, name: str) -> ModelRecord:
    return next(r for r in app.manager.records() if r.key.name == name)


def _pid(app: App, name: str) -> int | None:
    instance = _record(app, name).instance
    assert instance is not None
    pid = getattr(instance, "pid", None)
    assert isinstance(pid, int)
    return pid


async def test_adapters_answer_with_their_own_text_on_every_api(lora_root: Path) -> None:
    async with running_server(_config(lora_root)) as (_app, client):
        texts = {m: await _completion(client, m) for m in ("llama-a", *ADAPTERS)}
        assert len(set(texts.values())) == 3, texts  # each adapter changes the output
        # The same adapter, the same greedy text, through the generate extension.
        body = {"text_input": PROMPT, "parameters": {"max_tokens": 12, "temperature": 0}}
        r = await client.post("/v2/models/lora-1/generate", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["text_output"] == texts["lora-1"]
        predict = {"model": "lora-2", "text": PROMPT, "max_tokens": 12, "temperature": 0}
        r = await client.post("/predict", json=predict)
        assert r.status_code == 200, r.text
        assert r.json()["text"] == texts["lora-2"]
        chat = {"model": "lora-2", "messages": [{"role": "user", "content": "hi"}]}
        r = await client.post("/v1/chat/completions", json={**chat, "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "lora-2"


async def test_adapters_run_in_the_base_worker_as_separate_contexts_would(
    lora_root: Path,
) -> None:
    base_file = lora_root / "llama-a" / "1" / "model.gguf"
    expected = {
        "llama-a": reference_tokens(base_file, PROMPT, N_TOKENS),
        **{
            n: reference_tokens(
                base_file, PROMPT, N_TOKENS, lora=lora_root / n / "1" / "adapter.gguf"
            )
            for n in ADAPTERS
        },
    }
    assert len({tuple(v) for v in expected.values()}) == 3
    async with running_server(_config(lora_root)) as (app, client):
        await _completion(client, "llama-a")
        base_pid = _pid(app, "llama-a")
        for name in ADAPTERS:
            await _completion(client, name)
            instance = _record(app, name).instance
            assert isinstance(instance, AdapterInstance)
            assert instance.pid == base_pid  # a context in the base's worker
        # No worker of theirs maps the base again: the base's is the only one.
        assert _mapping(base_file) == {base_pid}
        # The base and both adapters at once, twice each, in the one worker.
        names = ["llama-a", *ADAPTERS] * 2
        instances = [_record(app, n).instance for n in names]
        got = await asyncio.gather(*(greedy_ids(i) for i in instances))  # type: ignore[arg-type]
        for name, ids in zip(names, got, strict=True):
            assert ids == expected[name], name


def _mapping(path: Path) -> set[int]:
    """The server's child processes that map ``path`` (spare workers map no model)."""
    pids = set()
    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if any(m.path == str(path) for m in child.memory_maps(grouped=True)):
                pids.add(child.pid)
        except psutil.Error:  # a spare that exited meanwhile
            continue
    return pids


async def test_the_base_is_charged_once_and_each_adapter_on_its_own(lora_root: Path) -> None:
    base = MappedFile.of(lora_root / "llama-a" / "1" / "model.gguf")
    adapter_bytes = (lora_root / "lora-1" / "1" / "adapter.gguf").stat().st_size
    async with running_server(_config(lora_root)) as (app, client):
        for model in ("llama-a", *ADAPTERS):
            await _completion(client, model)
        await settled(app)
        dev = app.manager.budget.device("cpu")
        assert list(dev.shared) == [base]
        assert dev.shared[base].users == {_record(app, "llama-a").key}
        assert dev.reserved_bytes == sum(dev.reservations.values()) + base.size
        for name in ADAPTERS:  # its tensors and its context's KV cache, its own
            record = _record(app, name)
            info = record.info
            assert info is not None
            kv = info.details["kv_cache_bytes"]
            assert isinstance(kv, int)
            assert kv > 0
            assert record.reserved_bytes >= adapter_bytes + kv
            assert dev.reservations[record.key] == record.reserved_bytes

        # An adapter goes: the base and the other adapter serve on, in the same worker.
        pid = _pid(app, "llama-a")
        await app.manager.unload("lora-1")
        assert _record(app, "lora-1").key not in dev.reservations
        assert _record(app, "llama-a").is_ready
        assert _pid(app, "llama-a") == pid
        await _completion(client, "llama-a")
        await _completion(client, "lora-2")
        assert list(dev.shared) == [base]
        # The base goes: its adapter first, then the base; nothing stays charged.
        await app.manager.unload("llama-a")
        assert _record(app, "lora-2").state is ModelState.UNLOADED
        assert dev.shared == {}
        assert dev.reserved_bytes == 0
        events = reversed(app.manager.events.recent())  # oldest first
        order = [e.model for e in events if e.kind == "unloaded"]
        assert order.index("lora-2") < order.index("llama-a")


async def test_a_base_in_use_is_never_evicted_its_adapters_are(lora_root: Path) -> None:
    async with running_server(_config(lora_root)) as (app, client):
        for model in ("llama-a", "lora-1"):
            await _completion(client, model)
        await settled(app)
        other = _record(app, "llama-b")
        candidates = {r.key.name for r in app.manager.admission.candidates(other)}
        assert candidates == {"lora-1"}  # not the base lora-1 uses
        await app.manager.unload("lora-1")
        candidates = {r.key.name for r in app.manager.admission.candidates(other)}
        assert candidates == {"llama-a"}  # no adapter uses it now

        # Evicting the base takes its adapters first, each its own reservation back.
        await _completion(client, "lora-2")
        dev = app.manager.budget.device("cpu")
        await app.manager.evict(_record(app, "llama-a"), reason="a test's eviction")
        assert _record(app, "lora-2").state is ModelState.UNLOADED
        assert dev.reserved_bytes == 0
        assert dev.shared == {}
        # Both come back on the next request for the adapter.
        await _completion(client, "lora-2")
        assert _record(app, "llama-a").is_ready


@pytest.mark.parametrize("bad", ["lora-corrupt", "lora-other"])
async def test_a_bad_adapter_is_a_typed_load_error_and_the_base_serves_on(
    lora_root: Path, bad: str
) -> None:
    async with running_server(_config(lora_root, bad)) as (app, client):
        before = await _completion(client, "llama-a")
        pid = _pid(app, "llama-a")
        body = {"model": bad, "prompt": PROMPT, "max_tokens": 4}
        r = await client.post("/v1/completions", json=body)
        assert r.status_code == 503, r.text
        assert "failed to load" in r.text
        assert bad in r.text
        r = await client.post(f"/v2/repository/models/{bad}/load", json={})
        assert r.status_code == 503, r.text
        assert _record(app, bad).state is ModelState.FAILED
        assert _record(app, bad).key not in app.manager.budget.device("cpu").reservations
        # The base's worker neither died nor restarted, and answers as before.
        assert await _completion(client, "llama-a") == before
        assert _pid(app, "llama-a") == pid
        await _completion(client, "lora-1")


async def test_adapters_come_back_with_their_base_after_its_worker_dies(lora_root: Path) -> None:
    from tests.polling import wait_until

    async with running_server(_config(lora_root)) as (app, client):
        before = {m: await _completion(client, m) for m in ("llama-a", "lora-1")}
        pid = _pid(app, "llama-a")
        assert pid is not None
        os.kill(pid, 9)  # the fault: the base's worker is killed

        def back() -> bool:
            records = [_record(app, m) for m in ("llama-a", "lora-1")]
            # Both ready (each with a live instance) before their pids are read.
            return all(r.is_ready for r in records) and _pid(app, "llama-a") != pid

        await wait_until(back, timeout_s=30)
        assert _pid(app, "lora-1") == _pid(app, "llama-a")
        assert {m: await _completion(client, m) for m in before} == before


async def test_memory_pressure_takes_the_adapters_before_their_base(lora_root: Path) -> None:
    # llama-b declares nearly the whole budget: its load must evict the base and both
    # adapters; the adapters go first, and the base only once none uses it.
    models = [llm_model("llama-a"), llm_model("llama-b", memory_mb=240)]
    models += [llm_model(n, base="llama-a") for n in ADAPTERS]
    config = write_config(lora_root, models, devices=[{"name": "cpu", "memory_budget_mb": 256}])
    async with running_server(config) as (app, client):
        for model in ("llama-a", *ADAPTERS):
            await _completion(client, model)
        await settled(app)
        await _completion(client, "llama-b")
        await settled(app)
        assert _record(app, "llama-b").is_ready
        gone = [_record(app, m) for m in ("llama-a", *ADAPTERS)]
        assert all(r.state is ModelState.UNLOADED for r in gone)
        events = list(reversed(app.manager.events.recent()))  # oldest first
        unloaded = [e.model for e in events if e.kind == "unloaded"]
        assert set(unloaded) == {"llama-a", *ADAPTERS}
        assert unloaded[-1] == "llama-a"  # after both of its adapters
        dev = app.manager.budget.device("cpu")
        b = _record(app, "llama-b")
        assert set(dev.reservations) == {b.key}
        assert dev.reserved_bytes <= dev.budget_bytes
