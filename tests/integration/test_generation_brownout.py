"""Brownout end to end: under overload a generation's ``max_tokens`` is capped and marked.

With ``parallel: 1`` one stream holds the model's only slot (its first chunk taken, the
rest not yet read, so the slot stays held however fast the worker is); requests that
arrive meanwhile find the model overloaded and run, once the slot frees, capped at
``brownout_max_tokens``: their greedy text is the first tokens of the uncapped answer,
and every API says so (a key, the ``X-Modelyard-Brownout`` header, every SSE event, the
``modelyard_generation_brownouts_total`` counter). Without overload nothing is capped.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelyard.protocol.generate import GenerateChunk
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

CAP = 6
ASKED = 200
"""What the overloaded requests ask for: far more than the cap, within the context."""


def _body(max_tokens: int) -> dict[str, Any]:
    return {"text_input": PROMPT, "parameters": {"max_tokens": max_tokens, "temperature": 0}}


async def _chunks(stream: Any) -> list[GenerateChunk]:
    return [chunk async for chunk in stream]


async def _sse(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[httpx.Headers, list[Any]]:
    events = []
    async with client.stream("POST", "/v2/models/llama-a/generate_stream", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
        return resp.headers, events


def _text(llm_root: Path, tokens: list[int]) -> str:
    from llama_cpp import Llama

    ref = Llama(
        model_path=str(llm_root / "llama-a" / "1" / "model.gguf"),
        n_ctx=N_CTX,
        verbose=False,
        vocab_only=True,
    )
    try:
        text: str = ref.detokenize(tokens).decode()
        return text
    finally:
        ref.close()


@pytest.mark.slow
async def test_overloaded_generations_are_capped_and_marked(
    llm_root: Path, expected: list[int]
) -> None:
    model = llm_model("llama-a", generation={"parallel": 1, "brownout_max_tokens": CAP})
    config = write_config(llm_root, [model], devices=[{"name": "cpu", "memory_budget_mb": 1024}])
    capped_text = _text(llm_root, expected[:CAP])
    async with running_server(config) as (app, client):
        # No overload: the whole answer, no mark.
        r = await client.post("/v2/models/llama-a/generate", json=_body(N_TOKENS))
        assert r.status_code == 200, r.text
        assert "max_tokens_capped_to" not in r.json()
        assert "x-modelyard-brownout" not in r.headers
        assert r.json()["completion_tokens"] == N_TOKENS
        assert r.json()["text_output"].startswith(capped_text)

        # Hold the only slot: the stream's first chunk taken, the rest left unread.
        holder = app.dataplane.generate(greedy_request(N_TOKENS))
        first = await anext(holder)
        gate = app.dataplane.generation.generation_gate("llama-a", "1")
        assert gate is not None
        await wait_until(lambda: gate.running == 1, what="the holder owns the slot")

        generate = asyncio.create_task(
            client.post("/v2/models/llama-a/generate", json=_body(ASKED))
        )
        predict = asyncio.create_task(
            client.post(
                "/predict",
                json={"model": "llama-a", "text": PROMPT, "max_tokens": ASKED, "temperature": 0},
            )
        )
        stream = asyncio.create_task(_sse(client, _body(ASKED)))
        direct = asyncio.create_task(_chunks(app.dataplane.generate(greedy_request(None))))
        await wait_until(lambda: gate.queued == 4, what="four requests queued behind it")

        # The holder arrived at an idle model: uncapped, unmarked.
        rest = await _chunks(holder)
        held = [first, *rest]
        assert [t for c in held for t in c.token_ids] == expected
        assert all(c.max_tokens_capped_to is None for c in held)

        r = await generate
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["max_tokens_capped_to"] == CAP
        assert r.headers["x-modelyard-brownout"] == f"max_tokens={CAP}"
        assert doc["completion_tokens"] == CAP
        assert doc["finish_reason"] == "length"
        assert doc["text_output"] == capped_text

        r = await predict
        assert r.status_code == 200, r.text
        assert r.json()["max_tokens_capped_to"] == CAP
        assert r.headers["x-modelyard-brownout"] == f"max_tokens={CAP}"
        assert r.json()["usage"]["completion_tokens"] == CAP
        assert r.json()["text"] == capped_text

        headers, events = await stream
        assert headers["x-modelyard-brownout"] == f"max_tokens={CAP}"
        assert events
        assert all(e["max_tokens_capped_to"] == CAP for e in events)
        assert "".join(e["text_output"] for e in events) == capped_text
        assert events[-1]["completion_tokens"] == CAP

        # max_tokens unset ("until the context is full") is capped too.
        chunks = await direct
        assert [t for c in chunks for t in c.token_ids] == expected[:CAP]
        assert all(c.max_tokens_capped_to == CAP for c in chunks)

        metrics = (await client.get("/metrics")).text
        assert 'modelyard_generation_brownouts_total{model="llama-a"} 4.0' in metrics

        # The burst over, a request runs as asked again.
        r = await client.post(
            "/predict",
            json={"model": "llama-a", "text": PROMPT, "max_tokens": N_TOKENS, "temperature": 0},
        )
        assert r.status_code == 200, r.text
        assert "max_tokens_capped_to" not in r.json()
        assert "x-modelyard-brownout" not in r.headers
        assert r.json()["usage"]["completion_tokens"] == N_TOKENS
