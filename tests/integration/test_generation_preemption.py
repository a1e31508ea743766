"""Preemption of generation by priority, on a real GGUF model in a real worker.

``parallel: 1``: a long priority-3 stream holds the only sequence slot; a priority-1
request arrives. With ``preempt`` (the default) the long stream pauses, the urgent one
runs to its end, then the long one resumes, and its greedy output is token for token
the output of the same request run alone. With ``preempt: false`` the urgent request
waits for the long stream to end.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from modelyard.app import App
from modelyard.protocol.generate import GenerateChunk, GenerateRequest
from tests.integration.llm_models import N_TOKENS, greedy_request, llm_model
from tests.polling import wait_until
from tests.servers import running_server, write_config

pytest.importorskip("llama_cpp", reason="the llm extra runs GGUF models")
pytest.importorskip("gguf", reason="the llm extra writes the test models")

LONG_TOKENS = 160
URGENT_TOKENS = 8


def _config(root: Path, *, preempt: bool) -> Path:
    model = llm_model("llama-a", generation={"parallel": 1, "preempt": preempt})
    return write_config(root, [model], devices=[{"name": "cpu", "memory_budget_mb": 1024}])


async def _all_ids(app: App, request: GenerateRequest) -> tuple[list[int], GenerateChunk]:
    ids: list[int] = []
    async for chunk in app.dataplane.generate(request):
        ids += chunk.token_ids
    return ids, chunk


async def _race(app: App) -> tuple[list[str], list[int], GenerateChunk]:
    """The long stream, paused after a few chunks until the urgent request is queued;
    returns the order the two finished in, and the long stream's ids and last chunk."""
    finished: list[str] = []
    long_request = replace(greedy_request(LONG_TOKENS), priority=3)
    urgent_request = replace(greedy_request(URGENT_TOKENS), priority=1)

    async def urgent() -> None:
        await _all_ids(app, urgent_request)
        finished.append("urgent")

    ids: list[int] = []
    urgent_task: asyncio.Task[None] | None = None
    async for chunk in app.dataplane.generate(long_request):
        ids += chunk.token_ids
        if urgent_task is None and len(ids) >= 4:
            urgent_task = asyncio.create_task(urgent())
            gate = app.dataplane.generation.generation_gate("llama-a", "1")
            assert gate is not None
            await wait_until(lambda g=gate: g.queued == 1, timeout_s=10)  # type: ignore[misc]
        last = chunk
    finished.append("long")
    assert urgent_task is not None
    await urgent_task
    return finished, ids, last


async def test_a_priority_request_pauses_a_long_stream_which_resumes_unchanged(
    llm_root: Path, expected: list[int]
) -> None:
    async with running_server(_config(llm_root, preempt=True)) as (app, client):
        alone, _ = await _all_ids(app, replace(greedy_request(LONG_TOKENS), priority=3))
        assert alone[:N_TOKENS] == expected  # llama-cpp-python's own greedy tokens
        order, ids, last = await _race(app)
        assert order == ["urgent", "long"], "the urgent request ran while the long one paused"
        assert ids == alone, "the resumed stream continues with identical output"
        assert last.completion_tokens == len(alone)
        assert last.prompt_tokens == (await _all_ids(app, greedy_request(1)))[1].prompt_tokens
        gate = app.dataplane.generation.generation_gate("llama-a", "1")
        assert gate is not None
        assert gate.preemptions == 1
        metrics = (await client.get("/metrics")).text
        assert 'modelyard_generation_preemptions_total{model="llama-a"} 1.0' in metrics


async def test_without_preempt_the_priority_request_waits(llm_root: Path) -> None:
    async with running_server(_config(llm_root, preempt=False)) as (app, _client):
        order, ids, _ = await _race(app)
        assert order == ["long", "urgent"]
        assert len(ids) == LONG_TOKENS
