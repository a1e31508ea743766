"""OpenAI parity for generative models, through the stock ``openai`` client on a real server.

A tiny random-weight GGUF (written here) cannot say anything meaningful, so each test
asserts structure and determinism: a schema-constrained answer parses and validates; a
required tool call names a tool and its arguments match the tool's schema; logprobs
have the right shape and are <= 0; ``n`` gives that many choices; penalties and
``logit_bias`` change greedy output deterministically; tokenize and detokenize
round-trip; what is not supported is a 400 naming the field.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio

from modelyard.app import App
from tests.servers import running_server, write_config

pytest.importorskip("llama_cpp", reason="the llm extra installs llama-cpp-python")
pytest.importorskip("gguf", reason="the llm extra installs gguf")
pytest.importorskip("openai", reason="the test extra installs the openai client")
pytest.importorskip("jsonschema", reason="validates the constrained answers")
import jsonschema  # type: ignore[import-untyped]
import openai
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from modelyard.examples.gguf_llama import SHAPES, write_llama_gguf

MODEL = "tiny-llama"
PROMPT = "Once upon a time there was a little model that"
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are a model server."},
    {"role": "user", "content": "What is the capital of France?"},
]
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Lyon", "Nice"]},
        "population": {"type": "integer"},
        "capital": {"type": "boolean"},
    },
    "required": ["city", "population", "capital"],
    "additionalProperties": False,
}
WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer"}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


@dataclass(frozen=True)
class Served:
    """A running server with one tiny GGUF model."""

    app: App
    client: httpx.AsyncClient
    stock: openai.AsyncOpenAI


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    repo = tmp_path_factory.mktemp("llm-repo")
    write_llama_gguf(repo / MODEL / "1" / "model.gguf", SHAPES["tiny"])
    models = [
        {
            "name": MODEL,
            "path": MODEL,
            "runtime": "llama_cpp",
            "generation": {"n_ctx": 1024, "n_threads": 2, "parallel": 2},
            "timeout_s": 60,
        }
    ]
    cfg = write_config(tmp_path_factory.mktemp("llm-cfg"), models, model_repository=str(repo))
    async with running_server(cfg) as (app, client):
        stock = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{app.http_port}/v1", api_key="unused", max_retries=0
        )
        try:
            yield Served(app, client, stock)
        finally:
            await stock.close()


async def _greedy_text(served: Served, max_tokens: int = 12, **extra: Any) -> str:
    got = await served.stock.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=max_tokens, temperature=0, **extra
    )
    return str(got.choices[0].text)


async def _tokens(served: Served, text: str) -> list[int]:
    answer = await served.client.post("/tokenize", json={"model": MODEL, "content": text})
    assert answer.status_code == 200, answer.text
    tokens = answer.json()["tokens"]
    assert all(isinstance(t, int) for t in tokens)
    return list(tokens)


@pytest.mark.asyncio(loop_scope="module")
async def test_json_schema_answers_parse_and_validate(served: Served) -> None:
    for seed in (1, 2):
        got = await served.stock.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=200,
            temperature=0.8,
            seed=seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": SCHEMA, "strict": True},
            },
        )
        choice = got.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert choice.message.content is not None
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    # Without the constraint the same random model writes no JSON at all.
    free = await served.stock.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=40, temperature=0
    )
    with pytest.raises(json.JSONDecodeError):
        json.loads(free.choices[0].message.content or "")


@pytest.mark.asyncio(loop_scope="module")
async def test_json_object_answers_are_json_objects_streamed_too(served: Served) -> None:
    stream = await served.stock.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_object"},
        logit_bias={"2": 0},  # harmless: exercises the chain with the grammar
        stream=True,
    )
    pieces: list[str] = []
    finish = None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    text = "".join(pieces)
    if finish == "stop":  # a random model may still be inside a string at the limit
        assert isinstance(json.loads(text), dict)
    assert text.lstrip().startswith("{"), text


@pytest.mark.asyncio(loop_scope="module")
async def test_a_bad_schema_is_a_400_naming_response_format(served: Served) -> None:
    schemas: list[dict[str, Any]] = [
        {"type": "array", "minItems": 10**9},
        {"$ref": "https://example.com/x"},
    ]
    for schema in schemas:
        with pytest.raises(openai.BadRequestError) as info:
            await served.stock.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                max_tokens=8,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": schema},
                },
            )
        assert "response_format" in str(info.value)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_required_tool_call_names_a_tool_with_valid_arguments(served: Served) -> None:
    tools = [WEATHER, TIME]
    got = await served.stock.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=100,
        temperature=0,
        tools=tools,
        tool_choice="required",
    )
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None
    assert len(calls) == 1
    call = calls[0]
    assert call.type == "function"
    assert call.id.startswith("call_")
    schemas = {t["function"]["name"]: t["function"].get("parameters") for t in tools}
    assert call.function.name in schemas
    jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])

    named = await served.stock.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=100,
        temperature=0,
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        stream=True,
    )
    deltas = [c async for c in named if c.choices]
    streamed = [tc for c in deltas for tc in c.choices[0].delta.tool_calls or []]
    assert [tc.function.name for tc in streamed if tc.function] == ["get_time"]
    assert deltas[-1].choices[0].finish_reason == "tool_calls"
    arguments = streamed[0].function.arguments if streamed[0].function else None
    jsonschema.validate(json.loads(arguments or ""), TIME["function"]["parameters"])

    # The call goes back with its result; the model answers in text (auto, no call).
    follow = await served.stock.chat.completions.create(
        model=MODEL,
        messages=[
            *MESSAGES,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": call.function.arguments,
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
        ],
        max_tokens=8,
        temperature=0,
        tools=tools,
    )
    assert follow.choices[0].message.role == "assistant"
    assert follow.choices[0].finish_reason in ("stop", "length")


@pytest.mark.asyncio(loop_scope="module")
async def test_chat_logprobs_have_the_asked_shape(served: Served) -> None:
    got = await served.stock.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    choice = got.choices[0]
    assert choice.logprobs is not None
    assert choice.logprobs.content is not None
    content = choice.logprobs.content
    assert got.usage is not None
    assert len(content) == got.usage.completion_tokens
    assert "".join(t.token for t in content) == choice.message.content
    for entry in content:
        assert entry.logprob <= 0.0
        assert len(entry.top_logprobs) == 3
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert all(t <= 0 for t in tops)
        # Greedy: the chosen token is the most likely one.
        assert entry.logprob == pytest.approx(tops[0], abs=1e-5)
        assert bytes(entry.bytes or []) == entry.token.encode()
    assert got.system_fingerprint
    assert got.system_fingerprint.startswith("fp_")

    plain = await served.stock.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0
    )
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == choice.message.content


@pytest.mark.asyncio(loop_scope="module")
async def test_completion_logprobs_and_echo(served: Served) -> None:
    got = await served.stock.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2
    )
    lp = got.choices[0].logprobs
    assert lp is not None
    assert lp.tokens
    assert lp.token_logprobs
    assert lp.top_logprobs
    assert lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(x <= 0 for x in lp.token_logprobs)
    assert all(1 <= len(top) <= 2 for top in lp.top_logprobs)
    assert lp.text_offset[0] == 0
    assert "".join(lp.tokens) == got.choices[0].text

    echoed = await served.stock.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, echo=True
    )
    assert echoed.choices[0].text == PROMPT + got.choices[0].text
    stream = await served.stock.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, echo=True, stream=True
    )
    assert "".join([c.choices[0].text async for c in stream]) == PROMPT + got.choices[0].text


@pytest.mark.asyncio(loop_scope="module")
async def test_n_choices_are_separate_sequences(served: Served) -> None:
    got = await served.stock.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=7, n=3
    )
    assert [c.index for c in got.choices] == [0, 1, 2]
    texts = [c.text for c in got.choices]
    assert len(set(texts)) > 1, "three seeds drew the same text"
    assert got.usage is not None
    assert got.usage.completion_tokens == 24
    again = await served.stock.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=7, n=3
    )
    assert [c.text for c in again.choices] == texts  # seeded: the same draws

    stream = await served.stock.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0, n=2, stream=True
    )
    by_index: dict[int, str] = {0: "", 1: ""}
    finished: set[int] = set()
    async for chunk in stream:
        for c in chunk.choices:
            by_index[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1}
    assert by_index[0] == by_index[1] != ""  # greedy twice: the same text


@pytest.mark.asyncio(loop_scope="module")
async def test_logit_bias_and_penalties_change_greedy_output(served: Served) -> None:
    base = await served.stock.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, logprobs=0
    )
    text = base.choices[0].text
    assert text
    first = (await _tokens(served, PROMPT + text))[len(await _tokens(served, PROMPT))]
    banned = await _greedy_text(served, logit_bias={str(first): -100})
    assert banned != text
    assert banned == await _greedy_text(served, logit_bias={str(first): -100})  # deterministic
    assert await _greedy_text(served, logit_bias={str(first): 0}) == text

    base_long = await _greedy_text(served, max_tokens=40)
    penalised = await _greedy_text(served, max_tokens=40, frequency_penalty=2.0)
    assert penalised != base_long
    assert penalised == await _greedy_text(served, max_tokens=40, frequency_penalty=2.0)
    present = await _greedy_text(served, max_tokens=40, presence_penalty=2.0)
    assert present != base_long

    with pytest.raises(openai.BadRequestError) as info:
        await _greedy_text(served, logit_bias={"999999": -100})
    assert "logit_bias" in str(info.value)


@pytest.mark.asyncio(loop_scope="module")
async def test_tokenize_and_detokenize_round_trip(served: Served) -> None:
    text = "Hello world! How are you today?"
    tokens = await _tokens(served, text)
    assert len(tokens) > 1
    answer = await served.client.post("/detokenize", json={"model": MODEL, "tokens": tokens})
    assert answer.status_code == 200
    assert answer.json() == {"content": text}
    with_bos = await served.client.post(
        "/tokenize",
        json={"model": MODEL, "content": text, "add_special": True, "with_pieces": True},
    )
    pieces = with_bos.json()["tokens"]
    assert [p["id"] for p in pieces[1:]] == tokens
    assert "".join(p["piece"] for p in pieces[1:]) == text
    empty = await served.client.post("/tokenize", json={"model": MODEL, "content": ""})
    assert empty.json() == {"tokens": []}
    # As llama.cpp's one-model server: without 'model', the only generative model.
    implicit = await served.client.post("/tokenize", json={"content": text})
    assert implicit.json() == {"tokens": tokens}
    bad = await served.client.post("/detokenize", json={"model": MODEL, "tokens": [10**8]})
    assert bad.status_code == 400
    assert "tokens" in bad.json()["error"]["message"]


@pytest.mark.asyncio(loop_scope="module")
async def test_refusals_name_their_field(served: Served) -> None:
    async def refused(path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = await served.client.post(path, json=body)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert isinstance(error, dict)
        return error

    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    error = await refused("/v1/chat/completions", {**chat, "stream_options": {}})
    assert error["param"] == "stream_options"
    error = await refused(
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "stream": False, "stream_options": {"include_usage": True}},
    )
    assert error["param"] == "stream_options"
    error = await refused("/v1/chat/completions", {**chat, "top_logprobs": 2})
    assert error["param"] == "top_logprobs"
    error = await refused("/v1/completions", {"model": MODEL, "prompt": "x", "best_of": 2})
    assert error["param"] == "best_of"
    error = await refused(
        "/v1/completions", {"model": MODEL, "prompt": "x", "echo": True, "logprobs": 1}
    )
    assert error["param"] == "echo"
    error = await refused("/v1/chat/completions", {**chat, "n": 17})
    assert error["param"] == "n"
