"""Generation over the OpenAI-compatible API, through the stock ``openai`` client.

Greedy output (streamed and not, completion and chat) equals llama-cpp-python run in
this process on the same GGUF file and prompt, token for token; usage counts match;
requests the model cannot serve are refused with OpenAI's error object and a 4xx.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from modelyard.app import App
from tests.polling import wait_until
from tests.servers import running_server, write_config

pytest.importorskip("llama_cpp", reason="the llm extra installs llama-cpp-python")
pytest.importorskip("gguf", reason="the llm extra installs gguf")
pytest.importorskip("openai", reason="the test extra installs the openai client")
import llama_cpp
import openai
from openai.types.chat import ChatCompletionMessageParam

from modelyard.examples.gguf_llama import SHAPES, write_llama_gguf

N_CTX = 256
PROMPT = "Once upon a time there was a little model that"
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are a model server."},
    {"role": "user", "content": "What is the capital of France?"},
]
MAX_TOKENS = 24


@dataclass(frozen=True)
class Served:
    """A running server with one tiny GGUF model, and the file it serves."""

    app: App
    client: httpx.AsyncClient
    stock: openai.AsyncOpenAI
    gguf: Path


@pytest.fixture(scope="module")
def reference(served_file: Path) -> llama_cpp.Llama:
    """llama-cpp-python in this process, on the same file, with the same context."""
    return llama_cpp.Llama(
        model_path=str(served_file), n_ctx=N_CTX, n_threads=2, verbose=False, seed=0
    )


@pytest.fixture(scope="module")
def served_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("llm-repo")
    return write_llama_gguf(root / "tiny-llama" / "1" / "model.gguf", SHAPES["tiny"])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(
    served_file: Path, model_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Served]:
    repo = served_file.parents[2]
    (repo / "add").symlink_to(model_root / "add", target_is_directory=True)
    (repo / "tiny-long").symlink_to(repo / "tiny-llama", target_is_directory=True)
    models = [
        {
            "name": "tiny-llama",
            "path": "tiny-llama",
            "runtime": "llama_cpp",
            "generation": {"n_ctx": N_CTX, "n_threads": 2},
            "timeout_s": 60,
        },
        {
            # The same file with a long context and a queue of one: long streams hold
            # its one sequence while a second request waits and a third is refused.
            "name": "tiny-long",
            "path": "tiny-long",
            "runtime": "llama_cpp",
            "generation": {"n_ctx": 2048, "n_threads": 2, "parallel": 1},
            "max_queue_size": 1,
            "timeout_s": 60,
        },
        {"name": "add", "path": "add", "isolation": "inline"},
    ]
    cfg = write_config(tmp_path_factory.mktemp("llm-cfg"), models, model_repository=str(repo))
    async with running_server(cfg) as (app, client):
        stock = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{app.http_port}/v1", api_key="unused", max_retries=0
        )
        try:
            yield Served(app, client, stock, served_file)
        finally:
            await stock.close()


def _reference_completion(llm: llama_cpp.Llama, **kwargs: Any) -> dict[str, Any]:
    answer: Any = llm.create_completion(PROMPT, max_tokens=MAX_TOKENS, temperature=0.0, **kwargs)
    assert isinstance(answer, dict)
    return answer


def _reference_chat(llm: llama_cpp.Llama) -> dict[str, Any]:
    messages: Any = MESSAGES  # plain dicts, as a client sends them
    answer: Any = llm.create_chat_completion(
        messages=messages, max_tokens=MAX_TOKENS, temperature=0.0
    )
    assert isinstance(answer, dict)
    return answer


@pytest.mark.slow  # loads the reference model in this process too
@pytest.mark.asyncio(loop_scope="module")
async def test_greedy_completion_equals_llama_cpp_in_process(
    served: Served, reference: llama_cpp.Llama
) -> None:
    expected = _reference_completion(reference)
    want = expected["choices"][0]["text"]
    assert want, "the reference generated nothing: the comparison would be empty"
    got = await served.stock.completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0
    )
    assert got.choices[0].text == want
    assert reference.tokenize(got.choices[0].text.encode(), add_bos=False) == reference.tokenize(
        want.encode(), add_bos=False
    )
    assert got.usage is not None
    assert got.usage.prompt_tokens == expected["usage"]["prompt_tokens"]
    assert got.usage.completion_tokens == expected["usage"]["completion_tokens"]
    assert got.choices[0].finish_reason == expected["choices"][0]["finish_reason"]
    assert got.object == "text_completion"
    assert got.model == "tiny-llama"

    stream = await served.stock.completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    pieces, finishes = [], []
    async for chunk in stream:
        pieces.append(chunk.choices[0].text)
        finishes.append(chunk.choices[0].finish_reason)
    assert "".join(pieces) == want
    assert len(pieces) > 1, "the answer came in one piece: it was not streamed"
    assert finishes[-1] == expected["choices"][0]["finish_reason"]
    assert all(f is None for f in finishes[:-1])


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_greedy_chat_equals_llama_cpp_in_process_streamed_and_not(
    served: Served, reference: llama_cpp.Llama
) -> None:
    expected = _reference_chat(reference)
    want = expected["choices"][0]["message"]["content"]
    assert want
    got = await served.stock.chat.completions.create(
        model="tiny-llama",
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert got.choices[0].message.content == want
    assert got.choices[0].message.role == "assistant"
    assert got.usage is not None
    assert got.usage.prompt_tokens == expected["usage"]["prompt_tokens"]
    assert got.usage.completion_tokens == expected["usage"]["completion_tokens"]

    stream = await served.stock.chat.completions.create(
        model="tiny-llama",
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want
    assert len({c.id for c in chunks}) == 1
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (
        expected["usage"]["prompt_tokens"],
        expected["usage"]["completion_tokens"],
    )
    assert all(c.usage is None for c in chunks[:-1])
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == expected["choices"][0]["finish_reason"]


@pytest.mark.asyncio(loop_scope="module")
async def test_raw_stream_is_server_sent_events_ending_with_done(served: Served) -> None:
    body = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 4, "stream": True}
    async with served.client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line async for line in r.aiter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"


@pytest.mark.asyncio(loop_scope="module")
async def test_requests_the_model_cannot_serve_get_openai_errors(served: Served) -> None:
    stock = served.stock
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            await stock.completions.create(
                model="tiny-llama", prompt=PROMPT, max_tokens=N_CTX * 4, stream=stream
            )
        assert info.value.status_code == 400
        assert info.value.type == "invalid_request_error"
        assert str(N_CTX) in info.value.message  # the arithmetic is in the message
    with pytest.raises(openai.BadRequestError):
        await stock.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": PROMPT * 200}]
        )
    with pytest.raises(openai.BadRequestError) as info:
        await stock.completions.create(model="add", prompt=PROMPT)  # not a generative model
    assert info.value.code == "invalid_input"
    with pytest.raises(openai.BadRequestError) as info:
        await stock.embeddings.create(model="tiny-llama", input="x")
    assert info.value.param == "model"
    with pytest.raises(openai.NotFoundError):
        await stock.chat.completions.create(
            model="tiny-llama:7", messages=[{"role": "user", "content": "hi"}]
        )
    # Still serving, and a stream closed early leaves the model serving the next one.
    early = await stock.completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=64, stream=True
    )
    async for _ in early:
        break
    await early.close()
    again = await stock.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=2)
    assert again.usage is not None
    assert again.usage.completion_tokens == 2
    listed = [m.id for m in (await stock.models.list()).data]
    assert listed == ["add", "tiny-llama", "tiny-long"]


@pytest.mark.asyncio(loop_scope="module")
async def test_a_full_queue_is_a_429_rate_limit_error(served: Served) -> None:
    stock = served.stock

    async def long_stream() -> Any:
        return await stock.completions.create(
            model="tiny-long", prompt=PROMPT, max_tokens=2000, temperature=0, stream=True
        )

    running = await long_stream()  # headers come with its first text: it holds the slot
    queued = asyncio.create_task(long_stream())
    try:
        gate = served.app.dataplane.generation.generation_gate("tiny-long", "1")
        assert gate is not None
        await wait_until(lambda: gate.queued == 1, 30.0, what="the second request is queued")
        assert not queued.done()
        with pytest.raises(openai.RateLimitError) as info:
            await stock.completions.create(model="tiny-long", prompt=PROMPT, max_tokens=4)
        assert info.value.status_code == 429
        assert info.value.code == "overloaded"
        assert info.value.response.headers["retry-after"]
    finally:
        await running.close()  # the slot passes to the queued request
        second = await asyncio.wait_for(queued, 60)
        await second.close()
    done = await stock.completions.create(model="tiny-long", prompt=PROMPT, max_tokens=3)
    assert done.usage is not None
    assert done.usage.completion_tokens == 3
