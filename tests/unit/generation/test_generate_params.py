"""Generate requests: one meaning of every sampling parameter, typed errors for bad ones."""

from __future__ import annotations

import pytest

from modelyard.errors import InvalidInputError
from modelyard.frontends.http.generate import generate_request
from modelyard.protocol.generate import (
    ChatMessage,
    GenerateRequest,
    SamplingParams,
    check_generate_request,
    sampling_from_params,
)


def test_triton_names_and_top_level_parameters() -> None:
    req = generate_request(
        {"text_input": "hi", "max_tokens": 5, "parameters": {"random_seed": 3, "stop_words": "x"}},
        "m",
        "2",
        "1500",
    )
    assert req.prompt == "hi"
    assert req.version == "2"
    assert req.sampling == SamplingParams(max_tokens=5, seed=3, stop=("x",))
    assert req.timeout_s == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"seed": 1.5}, "seed"),
        ({"stop": [1]}, "stop"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_bad_sampling_parameters(params: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidInputError, match=words):
        sampling_from_params(params)


def test_bad_generate_bodies() -> None:
    with pytest.raises(InvalidInputError, match="text_input"):
        generate_request({"text_input": ["a"]}, "m", None, None)
    with pytest.raises(InvalidInputError, match="unknown generate parameter"):
        generate_request({"text_input": "a", "parameters": {"beam": 2}}, "m", None, None)
    with pytest.raises(InvalidInputError, match="stream"):
        generate_request({"text_input": "a", "stream": "yes"}, "m", None, None)


def test_prompt_or_messages_exactly_one() -> None:
    def req(prompt: str | None, messages: tuple[ChatMessage, ...] | None) -> GenerateRequest:
        return GenerateRequest("m", None, prompt, messages, SamplingParams())

    check_generate_request(req("hi", None))
    check_generate_request(req(None, (ChatMessage("user", "hi"),)))
    with pytest.raises(InvalidInputError, match="exactly one"):
        check_generate_request(req("hi", (ChatMessage("user", "hi"),)))
    with pytest.raises(InvalidInputError, match="exactly one"):
        check_generate_request(req(None, None))
    with pytest.raises(InvalidInputError, match="at least one"):
        check_generate_request(req(None, ()))
    with pytest.raises(InvalidInputError, match="no role"):
        check_generate_request(req(None, (ChatMessage("", "hi"),)))
    with pytest.raises(InvalidInputError, match="characters"):
        check_generate_request(req("x" * (200 * 1024), None))
