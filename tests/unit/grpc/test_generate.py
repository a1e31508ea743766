"""A ModelInferRequest for a generative model → GenerateRequest, and chunks → responses."""

from __future__ import annotations

import numpy as np
import pytest

from modelyard.errors import InvalidInputError
from modelyard.frontends.grpc.convert import request_to_proto, response_from_proto
from modelyard.frontends.grpc.generate import (
    FINAL_RESPONSE,
    TEXT_OUTPUT,
    chunk_response,
    generate_request,
)
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.protocol.generate import GenerateChunk
from modelyard.protocol.types import InferInput, InferRequest

MAX_ELEMENTS = 1 << 16


def _request(*inputs: InferInput, **parameters: object) -> pb.ModelInferRequest:
    msg = request_to_proto(InferRequest("llm", None, list(inputs)))
    for key, value in parameters.items():
        if isinstance(value, str):
            msg.parameters[key].string_param = value
        elif isinstance(value, float):
            msg.parameters[key].double_param = value
        else:
            assert isinstance(value, int)
            msg.parameters[key].int64_param = value
    return msg


def _text(name: str, *values: str) -> InferInput:
    array = np.array([v.encode() for v in values], dtype=object)
    return InferInput(name, "BYTES", (len(values),), array)


def test_prompt_and_sampling_from_parameters_and_tensors() -> None:
    max_tokens = InferInput("max_tokens", "INT32", (1,), np.array([7], dtype=np.int32))
    msg = _request(
        _text("text_input", "Once upon"),
        max_tokens,
        _text("stop_words", "\n", "END"),
        temperature=0.5,
        timeout=2_000_000,
    )
    request = generate_request(msg, MAX_ELEMENTS, timeout_s=5.0)
    assert request.prompt == "Once upon"
    assert request.sampling.max_tokens == 7
    assert request.sampling.temperature == 0.5
    assert request.sampling.stop == ("\n", "END")
    assert request.timeout_s == 2.0  # the shorter of the parameter and the call's budget


@pytest.mark.parametrize(
    ("msg", "match"),
    [
        (_request(_text("prompt", "hi")), "unknown input 'prompt'"),
        (
            _request(InferInput("max_tokens", "INT32", (1,), np.array([3], dtype=np.int32))),
            "needs the BYTES input 'text_input'",
        ),
        (_request(_text("text_input", "a", "b")), "exactly one element"),
        (_request(_text("text_input", "hi"), beam_width=2), "unknown generate parameter"),
    ],
)
def test_malformed_requests_are_invalid_input(msg: pb.ModelInferRequest, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        generate_request(msg, MAX_ELEMENTS, timeout_s=None)


def test_a_chunk_is_a_text_output_flagged_final_on_the_last() -> None:
    chunk = GenerateChunk("tail", (1, 2), "length", 5, 9, "1")
    msg = chunk_response(chunk, "llm", "id-1", final=True)
    response = response_from_proto(msg)
    [output] = response.outputs
    assert output.name == TEXT_OUTPUT
    assert output.array.tolist() == [b"tail"]
    assert response.id == "id-1"
    assert response.parameters[FINAL_RESPONSE] is True
    assert response.parameters["finish_reason"] == "length"
    assert response.parameters["completion_tokens"] == 9
    middle = chunk_response(GenerateChunk("x", (3,)), "llm", "", final=False)
    assert response_from_proto(middle).parameters == {FINAL_RESPONSE: False}
