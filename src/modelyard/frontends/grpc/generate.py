"""Generative models over gRPC, in the form Triton's LLM backends (vLLM, TensorRT-LLM) use.

The request is an ordinary ``ModelInferRequest``: the prompt is the BYTES input
``text_input`` (one element); sampling settings (``max_tokens``, ``temperature``,
``top_p``, ``top_k``, ``seed``/``random_seed``, ``stop``/``stop_words``) come as request
parameters or as one-element input tensors of the same names, as Triton's models take
them. ``priority`` and ``timeout`` (µs) parameters mean what they mean on ``ModelInfer``.

Each answer is a ``ModelInferResponse`` with the BYTES output ``text_output``: the whole
text for ``ModelInfer``; one piece per response for ``ModelStreamInfer``, Triton's
decoupled way, every response carrying the ``triton_final_response`` parameter (true on
the last, which also carries ``finish_reason`` and the token counts).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from modelyard.errors import InvalidInputError
from modelyard.frontends.grpc.convert import request_from_proto, response_to_proto
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.protocol.generate import (
    BROWNOUT_KEY,
    SAMPLING_KEYS,
    GenerateChunk,
    GenerateRequest,
    sampling_from_params,
)
from modelyard.protocol.types import InferOutput, InferResponse

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
FINAL_RESPONSE = "triton_final_response"
"""The parameter Triton sets on a decoupled model's responses: true on the last one."""
_CALL_KEYS = frozenset({"priority", "timeout", "stream", "triton_enable_empty_final_response"})
"""Request parameters that are not sampling settings but are allowed (read elsewhere or
Triton client flags modelyard has no use for)."""
_STOP_KEYS = frozenset({"stop", "stop_words"})


def _scalar(name: str, array: np.ndarray) -> Any:
    """The one element of an input tensor, as a plain Python value (bytes as text)."""
    if name in _STOP_KEYS:
        return [_text(name, v) for v in array.reshape(-1)]
    if array.size != 1:
        raise InvalidInputError(f"input {name!r} must hold exactly one element")
    value = array.reshape(-1)[0]
    if isinstance(value, bytes):
        return _text(name, value)
    return value.item() if isinstance(value, np.generic) else value


def _text(name: str, value: object) -> str:
    if not isinstance(value, bytes):
        raise InvalidInputError(f"input {name!r} must be BYTES (UTF-8 text)")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInputError(f"input {name!r} is not valid UTF-8") from None


def generate_request(
    msg: pb.ModelInferRequest, max_elements: int, timeout_s: float | None
) -> GenerateRequest:
    """A :class:`GenerateRequest` from a ``ModelInferRequest`` for a generative model;
    InvalidInputError naming what is wrong. ``timeout_s`` is the call's own deadline
    budget (RPC deadline, metadata), shortened further by the ``timeout`` parameter."""
    request = request_from_proto(msg, max_elements)
    values: dict[str, Any] = {}
    for tensor in request.inputs:
        if tensor.name != TEXT_INPUT and tensor.name not in SAMPLING_KEYS:
            raise InvalidInputError(
                f"unknown input {tensor.name!r} for a generative model; known: "
                f"{', '.join(sorted({TEXT_INPUT} | SAMPLING_KEYS))}"
            )
        values[tensor.name] = _scalar(tensor.name, tensor.array)
    prompt = values.pop(TEXT_INPUT, None)
    if not isinstance(prompt, str):
        raise InvalidInputError(f"a generative model needs the BYTES input {TEXT_INPUT!r}")
    params: Mapping[str, Any] = request.parameters
    unknown = sorted(set(params) - SAMPLING_KEYS - _CALL_KEYS)
    if unknown:
        raise InvalidInputError(
            f"unknown generate parameter(s): {', '.join(unknown)}; known: "
            f"{', '.join(sorted(SAMPLING_KEYS | _CALL_KEYS))}"
        )
    sampling = {k: v for k, v in params.items() if k in SAMPLING_KEYS} | values
    budget = request.timeout_s
    if timeout_s is not None:
        budget = timeout_s if budget is None else min(budget, timeout_s)
    return GenerateRequest(
        model=request.model_name,
        version=request.model_version,
        prompt=prompt,
        messages=None,
        sampling=sampling_from_params(sampling),
        priority=request.priority,
        timeout_s=budget,
    )


def text_response(
    model: str,
    version: str,
    request_id: str,
    text: str,
    parameters: dict[str, Any],
) -> pb.ModelInferResponse:
    """One ``ModelInferResponse`` carrying ``text`` as the BYTES output ``text_output``."""
    output = InferOutput(TEXT_OUTPUT, "BYTES", (1,), np.array([text.encode("utf-8")], dtype=object))
    response = InferResponse(model, version, [output], request_id or None, parameters)
    return response_to_proto(response)


def chunk_response(
    chunk: GenerateChunk, model: str, request_id: str, *, final: bool
) -> pb.ModelInferResponse:
    """One streamed piece of text, flagged final (with the finish reason and token
    counts) on the last response of the request."""
    params: dict[str, Any] = {FINAL_RESPONSE: final}
    if chunk.max_tokens_capped_to is not None:
        params[BROWNOUT_KEY] = chunk.max_tokens_capped_to
    if chunk.finish_reason is not None:
        params["finish_reason"] = chunk.finish_reason
        params["prompt_tokens"] = chunk.prompt_tokens
        params["completion_tokens"] = chunk.completion_tokens
    return text_response(model, chunk.model_version, request_id, chunk.text, params)


def answer_response(answer: Mapping[str, Any], request_id: str) -> pb.ModelInferResponse:
    """A whole generation (``DataPlane.generate_text``'s answer) as one response."""
    usage = answer.get("usage") or {}
    params: dict[str, Any] = {
        "finish_reason": str(answer.get("finish_reason") or ""),
        "prompt_tokens": int(usage.get("prompt_tokens", 0)),
        "completion_tokens": int(usage.get("completion_tokens", 0)),
    }
    if BROWNOUT_KEY in answer:
        params[BROWNOUT_KEY] = int(answer[BROWNOUT_KEY])
    return text_response(
        str(answer["model"]), str(answer["version"]), request_id, str(answer["text"]), params
    )
