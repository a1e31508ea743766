"""Text generation end to end: real GGUF files, real worker processes, real servers.

Greedy output over ``/predict`` and the KServe generate extension (streamed and not)
equals, token for token, llama-cpp-python run in-process on the same file and prompt; a
client that disconnects stops generation in the worker (the worker's own token counter
stops); a worker killed mid-stream ends the stream with an error event; a context too
big for the budget is refused with the arithmetic; two GGUF models under a budget that
fits one evict each other.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import httpx
import pytest

from modelyard.app import App
from modelyard.errors import InvalidInputError, WorkerCrashedError
from modelyard.protocol.generate import (
    ChatMessage,
    GenerateChunk,
    GenerateRequest,
    SamplingParams,
)
from tests.integration.llm_models import (
    N_CTX,
    N_TOKENS,
    PROMPT,
    greedy_request,
    llm_model,
)
from tests.polling import wait_until
from tests.servers import running_server, write_config

pytest.importorskip("llama_cpp", reason="the llm extra runs GGUF models")
pytest.importorskip("gguf", reason="the llm extra writes the test models")


def _config(root: Path, *models: dict[str, object], budget_mb: float = 1024) -> Path:
    return write_config(
        root, list(models), devices=[{"name": "cpu", "memory_budget_mb": budget_mb}]
    )


async def test_greedy_output_equals_llama_cpp_in_process(
    llm_root: Path, expected: list[int]
) -> None:
    assert len(expected) == N_TOKENS  # the test model emits no end-of-sequence token
    async with running_server(_config(llm_root, llm_model("llama-a"))) as (app, client):
        # The data plane: token ids, streamed as produced.
        ids: list[int] = []
        chunks = 0
        async for chunk in app.dataplane.generate(greedy_request(N_TOKENS)):
            ids += chunk.token_ids
            chunks += 1
            last = chunk
        assert ids == expected
        assert chunks > 1
        assert last.finish_reason == "length"
        assert last.completion_tokens == N_TOKENS
        assert last.model_version == "1"

        # /predict with "text"
        r = await client.post(
            "/predict",
            json={"model": "llama-a", "text": PROMPT, "max_tokens": N_TOKENS, "temperature": 0},
        )
        assert r.status_code == 200, r.text
        predicted = r.json()
        assert predicted["finish_reason"] == "length"
        assert predicted["usage"]["completion_tokens"] == N_TOKENS

        # The generate extension, one answer.
        body = {"text_input": PROMPT, "parameters": {"max_tokens": N_TOKENS, "temperature": 0}}
        r = await client.post("/v2/models/llama-a/generate", json=body)
        assert r.status_code == 200, r.text
        whole = r.json()
        assert whole["model_name"] == "llama-a"
        assert whole["model_version"] == "1"
        assert whole["text_output"] == predicted["text"]

        # The generate extension, streamed: the same text, in several events.
        events = []
        async with client.stream(
            "POST", "/v2/models/llama-a/versions/1/generate_stream", json=body
        ) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
        assert len(events) > 1
        assert "".join(e["text_output"] for e in events) == whole["text_output"]
        assert events[-1]["finish_reason"] == "length"

        from llama_cpp import Llama

        ref = Llama(
            model_path=str(llm_root / "llama-a" / "1" / "model.gguf"),
            n_ctx=N_CTX,
            verbose=False,
            vocab_only=True,
        )
        try:
            assert whole["text_output"] == ref.detokenize(expected).decode()
        finally:
            ref.close()

        # Chat: the template from the file's metadata, as llama-cpp-python's own chat
        # completion renders it (no BOS added: the template owns it).
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the capital of France?"},
        ]
        chat = GenerateRequest(
            model="llama-a",
            version=None,
            prompt=None,
            messages=tuple(ChatMessage(m["role"], m["content"]) for m in messages),
            sampling=SamplingParams(max_tokens=12, temperature=0.0),
        )
        answer = await app.dataplane.generate_text(chat)
        peer = Llama(
            model_path=str(llm_root / "llama-a" / "1" / "model.gguf"),
            n_ctx=N_CTX,
            n_threads=1,
            n_batch=64,
            verbose=False,
        )
        try:
            ref_chat = peer.create_chat_completion(
                messages=messages,  # type: ignore[arg-type,unused-ignore]
                max_tokens=12,
                temperature=0.0,
            )
        finally:
            peer.close()
        assert isinstance(ref_chat, dict)
        assert answer["text"] == ref_chat["choices"][0]["message"]["content"]
        assert answer["usage"] == ref_chat["usage"]

        metrics = (await client.get("/metrics")).text
        assert 'modelyard_generation_generated_tokens_total{model="llama-a",version="1"}' in metrics
        assert "modelyard_generation_time_to_first_token_seconds_bucket" in metrics


async def test_bad_generate_requests_get_typed_errors(llm_root: Path) -> None:
    async with running_server(_config(llm_root, llm_model("llama-a"))) as (app, client):
        cases = [
            ("/v2/models/nope/generate", {"text_input": "hi"}, 404),
            ("/v2/models/llama-a/generate", {"text_input": 3}, 400),
            ("/v2/models/llama-a/generate", {"text_input": "hi", "max_tokens": 0}, 400),
            ("/v2/models/llama-a/generate", {"text_input": "hi", "temperature": -1}, 400),
            ("/v2/models/llama-a/generate", {"text_input": "hi", "bogus": 1}, 400),
            ("/v2/models/llama-a/generate_stream", {"text_input": "hi", "top_p": 0}, 400),
        ]
        for path, body, status in cases:
            r = await client.post(path, json=body)
            assert r.status_code == status, (path, body, r.text)
            assert "error" in r.json()
        # max_tokens beyond the context: refused with the arithmetic.
        r = await client.post(
            "/v2/models/llama-a/generate", json={"text_input": PROMPT, "max_tokens": N_CTX - 5}
        )
        assert r.status_code == 400
        assert f"more than the context of {N_CTX} tokens" in r.json()["error"]
        with pytest.raises(InvalidInputError, match="tokens per sequence"):
            async for _ in app.dataplane.generate(greedy_request(N_CTX)):
                pass
        # The server kept serving.
        r = await client.post(
            "/v2/models/llama-a/generate", json={"text_input": PROMPT, "max_tokens": 3}
        )
        assert r.status_code == 200


@pytest.mark.slow
async def test_stop_strings_and_seeded_sampling(llm_root: Path) -> None:
    async with running_server(_config(llm_root, llm_model("llama-a"))) as (_, client):
        body = {"text_input": PROMPT, "max_tokens": N_TOKENS, "temperature": 0}
        full = (await client.post("/v2/models/llama-a/generate", json=body)).json()["text_output"]
        stop = full[len(full) // 2 : len(full) // 2 + 3]
        cut = full[: full.index(stop)]
        r = await client.post("/v2/models/llama-a/generate", json={**body, "stop": [stop]})
        assert r.json()["text_output"] == cut
        assert r.json()["finish_reason"] == "stop"
        sampled = {**body, "temperature": 0.9, "top_k": 20, "top_p": 0.9, "seed": 7}
        a = (await client.post("/v2/models/llama-a/generate", json=sampled)).json()
        b = (await client.post("/v2/models/llama-a/generate", json=sampled)).json()
        assert a["text_output"] == b["text_output"]


async def _counter(app: App, name: str) -> int:
    counters = await app.dataplane.generation_counters(name)
    return counters.generated_tokens


@pytest.mark.slow
async def test_disconnect_stops_generation_in_the_worker(llm_root: Path) -> None:
    model = llm_model("llama-a", generation={"n_ctx": 4096})
    async with running_server(_config(llm_root, model)) as (app, client):
        body = {"text_input": PROMPT, "max_tokens": 4000, "temperature": 0}
        seen = 0
        async with client.stream("POST", "/v2/models/llama-a/generate_stream", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    seen += 1
                    if seen == 5:
                        break  # the client goes away mid-stream
        # The server notices the disconnect and cancels the job; from then on the
        # worker's own counter must not move (it would run to 4000 tokens otherwise).

        async def no_active_sequence() -> bool:
            return (await app.dataplane.generation_counters("llama-a")).active == 0

        await wait_until(no_active_sequence, what="the worker dropped the sequence")
        before = await _counter(app, "llama-a")
        await asyncio.sleep(0.5)
        after = await _counter(app, "llama-a")
        assert after == before, "the worker kept generating for a client that left"
        assert before < 1000
        # The slot was given back: the next request is served.
        r2 = await client.post(
            "/v2/models/llama-a/generate", json={"text_input": PROMPT, "max_tokens": 4}
        )
        assert r2.status_code == 200


@pytest.mark.slow
async def test_worker_killed_mid_stream_ends_with_error_event(llm_root: Path) -> None:
    model = llm_model("llama-a", generation={"n_ctx": 4096})
    async with running_server(_config(llm_root, model)) as (app, client):
        body = {"text_input": PROMPT, "max_tokens": 4000, "temperature": 0}
        events: list[dict[str, object]] = []
        async with client.stream("POST", "/v2/models/llama-a/generate_stream", json=body) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(json.loads(line[6:]))
                if len(events) == 3:
                    record = app.manager.resolve("llama-a", None)
                    pid = record.info.pid if record.info else None
                    assert pid is not None
                    os.kill(pid, signal.SIGKILL)
        assert events[-1].get("code") == "worker_crashed", events[-1]
        assert "error" in events[-1]
        # Over the data plane the same failure is the typed error.
        await app.manager.ensure_ready(app.manager.resolve("llama-a", None), deadline=None)
        with pytest.raises(WorkerCrashedError):
            await _kill_after_first_chunk(app)
        record = app.manager.resolve("llama-a", None)
        await wait_until(lambda: record.is_ready, what="the restarted worker")


async def _kill_after_first_chunk(app: App) -> None:
    killed = False
    async for _ in app.dataplane.generate(greedy_request(4000)):
        # Once: chunks already on their way still arrive after the kill.
        if not killed:
            record = app.manager.resolve("llama-a", None)
            assert record.info is not None
            assert record.info.pid is not None
            os.kill(record.info.pid, signal.SIGKILL)
            killed = True


@pytest.mark.slow
async def test_context_too_big_for_the_budget_is_refused_with_the_arithmetic(
    llm_root: Path,
) -> None:
    model = llm_model("llama-a", generation={"n_ctx": 2048, "parallel": 64})
    async with running_server(_config(llm_root, model, budget_mb=64)) as (_, client):
        r = await client.post(
            "/v2/models/llama-a/generate", json={"text_input": PROMPT, "max_tokens": 2}
        )
        assert r.status_code == 503
        error = r.json()["error"]
        assert "KV cache" in error
        assert "n_ctx 2048 x parallel 64 x 2 layers x 2 KV heads" in error
        assert "lower n_ctx or parallel" in error


@pytest.mark.slow
async def test_two_gguf_models_evict_each_other_under_a_budget_for_one(llm_root: Path) -> None:
    # Each reserves its file plus its KV cache and buffers before it loads (25.5 MiB,
    # estimated), then measures about 12 MiB (the fork server holds llama-cpp-python's
    # modules, so they are not a worker's own pages): 30 fit one and the other's
    # reservation, never both.
    a = llm_model("llama-a", generation={"n_ctx": 256, "parallel": 1})
    b = llm_model("llama-b", generation={"n_ctx": 256, "parallel": 1})
    async with running_server(_config(llm_root, a, b, budget_mb=30)) as (app, client):
        for name in ("llama-a", "llama-b", "llama-a"):
            r = await client.post(
                f"/v2/models/{name}/generate", json={"text_input": PROMPT, "max_tokens": 3}
            )
            assert r.status_code == 200, r.text
            ready = {row["name"] for row in app.dataplane.repository_index(ready_only=True)}
            assert ready == {name}
        events = [e.kind for e in app.manager.events.recent()]
        assert events.count("evicted") >= 2


async def test_evictions_let_the_victims_streams_finish(llm_root: Path) -> None:
    # Two models under a budget that holds one, sixteen streams at once asking them in
    # turn: each load evicts the other model while it still has streams running or
    # queued for a slot. The eviction drains them (every stream gets all its tokens);
    # it used to stop the worker under them (503 "this replica was stopped").
    gen = {"n_ctx": 64, "parallel": 4}
    a, b = llm_model("llama-a", generation=gen), llm_model("llama-b", generation=gen)
    async with running_server(_config(llm_root, a, b, budget_mb=31)) as (app, _):

        async def one(model: str) -> GenerateChunk:
            request = GenerateRequest(
                model, None, PROMPT, None, SamplingParams(max_tokens=8, temperature=0.0)
            )
            async for chunk in app.dataplane.generate(request):
                last = chunk
            return last

        for _ in range(2):
            names = ["llama-a" if i % 2 == 0 else "llama-b" for i in range(16)]
            lasts = await asyncio.gather(*(one(name) for name in names))
            assert [c.completion_tokens for c in lasts] == [8] * 16
        events = [e.kind for e in app.manager.events.recent()]
        assert events.count("evicted") >= 2


@pytest.mark.slow
async def test_parallel_streams_share_the_model(llm_root: Path, expected: list[int]) -> None:
    async with running_server(_config(llm_root, llm_model("llama-a"))) as (app, _):

        async def one() -> list[int]:
            ids: list[int] = []
            async for chunk in app.dataplane.generate(greedy_request(N_TOKENS)):
                ids += chunk.token_ids
            return ids

        results = await asyncio.gather(*(one() for _ in range(4)))
        # Two sequences decode together, two queue; each still gets the greedy answer.
        for ids in results:
            assert ids == expected


@pytest.mark.slow
async def test_generative_models_are_listed(llm_root: Path) -> None:
    async with running_server(_config(llm_root, llm_model("llama-a"))) as (app, client):
        listed = app.dataplane.generative_models()
        assert [m.name for m in listed] == ["llama-a"]
        assert listed[0].context_length == N_CTX
        r = await client.get("/v2/models/llama-a")
        assert r.json()["generative"] is True


async def test_a_generative_model_on_a_core_set_runs_pinned_to_it(
    llm_root: Path, expected: list[int]
) -> None:
    if 1 not in os.sched_getaffinity(0):
        pytest.skip("needs CPU 1 for the core set cpu:1")
    model = {**llm_model("llama-a"), "device": "cpu:1"}
    cfg = write_config(llm_root, [model], devices=[{"name": "cpu:1", "memory_budget_mb": 1024}])
    async with running_server(cfg) as (app, _):
        ids = [
            i
            async for chunk in app.dataplane.generate(greedy_request(N_TOKENS))
            for i in chunk.token_ids
        ]
        assert ids == expected
        record = app.manager.resolve("llama-a", None)
        assert record.info is not None
        assert record.info.pid is not None
        assert os.sched_getaffinity(record.info.pid) == {1}


async def test_a_load_a_request_waits_for_leaves_the_warm_up_decode_to_its_prompt(
    llm_root: Path,
) -> None:
    a = llm_model("llama-a", generation={"n_ctx": 256, "parallel": 1})
    b = llm_model("llama-b", generation={"n_ctx": 256, "parallel": 1})

    async def warm_up_s(client: httpx.AsyncClient, name: str) -> float:
        r = await client.get("/v2/stats")
        row = next(m for m in r.json()["models"] if m["name"] == name)
        return float(row["last_load"]["warmup_s"])

    async with running_server(_config(llm_root, a, b)) as (_app, client):
        r = await client.post("/v2/repository/models/llama-a/load")
        assert r.status_code == 200, r.text
        assert await warm_up_s(client, "llama-a") > 0, "nobody waited: it warmed up"
        r = await client.post(
            "/v2/models/llama-b/generate", json={"text_input": PROMPT, "max_tokens": 3}
        )
        assert r.status_code == 200, r.text
        assert await warm_up_s(client, "llama-b") == 0, "the request's prompt came first"
