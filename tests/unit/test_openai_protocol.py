"""OpenAI-compatible bodies: what is honoured, what is accepted as harmless, what is refused."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest

from modelyard.errors import (
    InvalidInputError,
    ModelNotFoundError,
    OverloadedError,
    UnauthenticatedError,
)
from modelyard.frontends.openai_plane import COMPLETION_MAX_TOKENS, generate_request
from modelyard.protocol.generate import MAX_PROMPT_CHARS
from modelyard.protocol.openai import (
    ChatCompletionBody,
    CompletionBody,
    EmbeddingBody,
    OpenAIRequestError,
    parse_body,
    split_model,
)
from modelyard.protocol.openai_answers import embeddings_answer, error_object
from modelyard.protocol.openai_tools import read_calls

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _refused(kind: type[Any], doc: dict[str, Any]) -> OpenAIRequestError:
    with pytest.raises(OpenAIRequestError) as info:
        parse_body(kind, doc)
    return info.value


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("n", 0, "greater than or equal to 1"),
        ("n", 17, "less than or equal to 16"),
        ("logprobs", 21, "less than or equal to 20"),
        ("logprobs", True, "valid integer"),
        ("best_of", 3, "best_of"),
        ("frequency_penalty", 2.5, "less than or equal to 2"),
        ("presence_penalty", -3, "greater than or equal to -2"),
        ("logit_bias", {"word": -100}, "token ids"),
        ("logit_bias", {"-5": 1}, "token ids"),
        ("logit_bias", {"5": -101}, "greater than or equal to -100"),
        ("suffix", "tail", "suffix"),
        ("stream_options", {"include_usage": True}, "only allowed with 'stream': true"),
        ("functions_whatever", 1, "unsupported field"),
        ("temperature", 2.5, "less than or equal to 2"),
        ("max_tokens", 0, "greater than or equal to 1"),
        ("max_tokens", "8", "valid integer"),
        ("seed", -1, "greater than or equal to 0"),
        ("stop", ["a", "b", "c", "d", "e"], "at most 4"),
        ("stop", "", "1 to 256"),
        ("prompt", ["one", "two"], "one text prompt"),
        ("prompt", [1, 2, 3], "token-id prompts"),
        ("prompt", "x" * (MAX_PROMPT_CHARS + 1), "more than"),
    ],
)
def test_completion_fields_out_of_range_or_unsupported_are_refused_by_name(
    field: str, value: object, words: str
) -> None:
    error = _refused(CompletionBody, {"model": "m", "prompt": "p", field: value})
    assert error.param == field
    assert words in error.message
    assert isinstance(error, InvalidInputError)  # a 400 like every malformed request


def test_echo_with_logprobs_is_refused_naming_echo() -> None:
    error = _refused(CompletionBody, {"model": "m", "prompt": "p", "echo": True, "logprobs": 1})
    assert error.param == "echo"
    assert "prompt's log probabilities" in error.message


WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        ({"messages": []}, "messages", "at least 1"),
        ({"messages": "hi"}, "messages", "valid list"),
        ({"messages": [{"role": "user"}]}, "messages", "'content' is required"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "tool_call_id"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages", "role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages",
            "only text content",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
            "messages",
            "only an assistant",
        ),
        ({"tools": [{"type": "function"}]}, "tools", "function"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "pattern"),
        ({"tool_choice": "auto"}, "tool_choice", "needs 'tools'"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
            "no tool is named 'x'",
        ),
        (
            {
                "tools": [WEATHER],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "response_format",
            "cannot be combined",
        ),
        ({"top_logprobs": 2}, "top_logprobs", "needs 'logprobs': true"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
        ({"response_format": {"type": "yaml"}}, "response_format", "json_object"),
        ({"stream_options": {"include_usage": "yes"}}, "stream_options", "valid boolean"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "stream"),
    ],
)
def test_malformed_or_unsupported_chat_bodies_are_refused(
    change: dict[str, Any], param: str, words: str
) -> None:
    error = _refused(ChatCompletionBody, {**CHAT, **change})
    assert error.param == param
    assert words in error.message


def test_harmless_fields_are_accepted_and_change_nothing() -> None:
    body = parse_body(
        ChatCompletionBody,
        {
            **CHAT,
            "n": 1,
            "user": "u-1",
            "logprobs": False,
            "frequency_penalty": 0,
            "presence_penalty": 0.0,
            "logit_bias": {},
            "tools": [],
            "tool_choice": "none",
            "parallel_tool_calls": False,
            "response_format": {"type": "text"},
        },
    )
    assert generate_request(body, None) == generate_request(
        parse_body(ChatCompletionBody, CHAT), None
    )


def test_sampling_fields_reach_the_protocol_neutral_request() -> None:
    body = parse_body(
        CompletionBody,
        {
            "model": "m",
            "prompt": "p",
            "n": 3,
            "seed": 9,
            "frequency_penalty": 0.5,
            "presence_penalty": -1,
            "logit_bias": {"17": -100, "3": 2.5},
            "logprobs": 2,
        },
    )
    requests = [generate_request(body, None, i) for i in range(body.choices)]
    assert [r.sampling.seed for r in requests] == [9, 10, 11]  # one draw per choice
    s = requests[0].sampling
    assert (s.frequency_penalty, s.presence_penalty) == (0.5, -1.0)
    assert s.logit_bias == ((17, -100.0), (3, 2.5))
    assert s.logprobs == 2
    assert s.json_schema is None


def test_response_format_and_required_tools_become_a_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    body = parse_body(ChatCompletionBody, {**CHAT, "response_format": fmt})
    assert generate_request(body, None).sampling.json_schema == json.dumps(schema)
    body = parse_body(ChatCompletionBody, {**CHAT, "response_format": {"type": "json_object"}})
    assert json.loads(generate_request(body, None).sampling.json_schema or "") == {"type": "object"}
    # llama.cpp's server's forms: json_object with a schema, json_schema without a name.
    for fmt in (
        {"type": "json_object", "schema": schema},
        {"type": "json_schema", "json_schema": {"schema": schema}},
    ):
        body = parse_body(ChatCompletionBody, {**CHAT, "response_format": fmt})
        assert generate_request(body, None).sampling.json_schema == json.dumps(schema)
    for bad in ({"type": "json_object", "schema": 123}, {"type": "text", "schema": schema}):
        assert _refused(ChatCompletionBody, {**CHAT, "response_format": bad}).param == (
            "response_format"
        )
    chat = {**CHAT, "logprobs": True, "top_logprobs": 4, "tools": [WEATHER]}
    auto = generate_request(parse_body(ChatCompletionBody, chat), None)
    assert auto.sampling.json_schema is None  # auto: free text, calls read afterwards
    assert auto.sampling.logprobs == 4
    assert json.loads(auto.chat_context or "")["tools"] == [WEATHER]
    required = generate_request(
        parse_body(ChatCompletionBody, {**chat, "tool_choice": "required"}), None
    )
    call = json.loads(required.sampling.json_schema or "")
    assert call["properties"]["name"] == {"const": "weather"}
    assert call["required"] == ["name", "arguments"]


def test_tool_calls_are_read_from_hermes_blocks_or_a_bare_call() -> None:
    tools = parse_body(ChatCompletionBody, {**CHAT, "tools": [WEATHER]}).tools or []
    content, calls = read_calls(
        '<tool_call>{"name": "weather", "arguments": {"c": 1}}</tool_call>', tools
    )
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("weather", {"c": 1})]
    content, calls = read_calls('{"name": "weather", "arguments": {}}', tools)
    assert [c.name for c in calls] == ["weather"]
    for text in ('{"name": "other", "arguments": {}}', "<tool_call>not json</tool_call>", "hi"):
        assert read_calls(text, tools) == (text, [])


def test_a_completion_maps_to_the_protocol_neutral_request_with_openai_defaults() -> None:
    body = parse_body(
        CompletionBody,
        {"model": "tiny:2", "prompt": ["Once"], "temperature": 0, "stop": "\n", "seed": 7},
    )
    request = generate_request(body, 1.5)
    assert (request.model, request.version, request.prompt, request.messages) == (
        "tiny",
        "2",
        "Once",
        None,
    )
    assert request.sampling.max_tokens == COMPLETION_MAX_TOKENS  # OpenAI's default
    assert request.sampling.temperature == 0.0
    assert request.sampling.stop == ("\n",)
    assert request.sampling.seed == 7
    assert request.timeout_s == 1.5
    defaults = generate_request(parse_body(CompletionBody, {"model": "m", "prompt": "p"}), None)
    assert (defaults.sampling.temperature, defaults.sampling.top_p) == (1.0, 1.0)


def test_a_chat_maps_developer_to_system_and_text_parts_to_one_string() -> None:
    body = parse_body(
        ChatCompletionBody,
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "max_completion_tokens": 5,
            "top_k": 40,
        },
    )
    request = generate_request(body, None)
    assert request.prompt is None
    assert request.messages is not None
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "Be brief."),
        ("user", "ab"),
    ]
    assert (request.sampling.max_tokens, request.sampling.top_k) == (5, 40)
    chat_default = generate_request(parse_body(ChatCompletionBody, CHAT), None)
    assert chat_default.sampling.max_tokens is None  # the rest of the context, as OpenAI


def test_max_tokens_and_max_completion_tokens_together_are_refused() -> None:
    body = parse_body(ChatCompletionBody, {**CHAT, "max_tokens": 3, "max_completion_tokens": 4})
    with pytest.raises(OpenAIRequestError, match="not both"):
        generate_request(body, None)


def test_model_names_may_carry_a_version() -> None:
    assert split_model("tiny") == ("tiny", None)
    assert split_model("tiny:3") == ("tiny", "3")
    with pytest.raises(OpenAIRequestError):
        split_model("tiny:")


def test_embedding_inputs_are_text_only_and_bounded() -> None:
    assert parse_body(EmbeddingBody, {"model": "e", "input": "a"}).texts() == ["a"]
    assert parse_body(EmbeddingBody, {"model": "e", "input": ["a", "b"]}).texts() == ["a", "b"]
    assert "token-id" in _refused(EmbeddingBody, {"model": "e", "input": [[1, 2]]}).message
    assert _refused(EmbeddingBody, {"model": "e", "input": []}).param == "input"
    assert _refused(
        EmbeddingBody, {"model": "e", "input": "a", "encoding_format": "int8"}
    ).param == ("encoding_format")


def test_base64_embeddings_are_little_endian_float32() -> None:
    vectors = np.array([[0.5, -1.25, 3.0], [1e-3, 2.0, -0.0]], dtype=np.float32)
    answer = embeddings_answer("e", vectors, 9, "base64")
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in answer["data"]]
    np.testing.assert_array_equal(np.stack(decoded), vectors)
    assert answer["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    assert (
        embeddings_answer("e", vectors, 0, "float")["data"][1]["embedding"] == vectors[1].tolist()
    )


def test_error_objects_have_openai_types_and_modelyard_codes() -> None:
    unknown = error_object(ModelNotFoundError("no model 'x'"))["error"]
    assert unknown == {
        "message": "no model 'x'",
        "type": "invalid_request_error",
        "param": None,
        "code": "model_not_found",
    }
    assert error_object(OpenAIRequestError("bad", "stop"))["error"]["param"] == "stop"
    assert error_object(OverloadedError("full"))["error"]["type"] == "rate_limit_error"
    assert error_object(UnauthenticatedError("who"))["error"]["type"] == "authentication_error"
