"""REST bodies ⇄ protocol objects: JSON tensors and the binary-tensor extension."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from modelyard.errors import InvalidInputError
from modelyard.protocol.limits import count_elements
from modelyard.protocol.tensors import binary_bytes, check_shape, decode_input, json_data
from modelyard.protocol.types import (
    InferRequest,
    InferResponse,
    RequestedOutput,
    priority_param,
    timeout_param_s,
)

HEADER_LENGTH = "inference-header-content-length"


def _parameters(value: object, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"{where}: 'parameters' must be an object")
    return dict(value)


def _header_length(header_length: str, body_bytes: int) -> int:
    """``Inference-Header-Content-Length`` checked against the body's size."""
    try:
        n = int(header_length)
    except ValueError:
        raise InvalidInputError(
            f"Inference-Header-Content-Length must be an integer, got {header_length!r}"
        ) from None
    if n < 0 or n > body_bytes:
        raise InvalidInputError(
            f"Inference-Header-Content-Length {n} is outside the {body_bytes}-byte body"
        )
    return n


def _checked_shapes(
    raw_inputs: list[Any], max_elements: int | None
) -> list[tuple[int, ...] | None]:
    """Each input's declared shape, counted against ``max_elements`` before any array is
    built (None: not counted here, ``decode_input`` checks it)."""
    shapes: list[tuple[int, ...] | None] = [None] * len(raw_inputs)
    if max_elements is None:
        return shapes
    total = 0
    for i, spec in enumerate(raw_inputs):
        if type(spec) is dict or isinstance(spec, Mapping):
            name = str(spec.get("name"))
            shape = check_shape(name, spec.get("shape"))
            total = count_elements(name, shape, total, max_elements)
            shapes[i] = shape  # checked: decode_input need not check it again
    return shapes


def _requested_outputs(raw_outputs: object) -> list[RequestedOutput] | None:
    """The request's ``outputs`` list (None: it named none)."""
    if raw_outputs is None:
        return None
    if not isinstance(raw_outputs, list):
        raise InvalidInputError("'outputs' must be a list")
    outputs = []
    for o in raw_outputs:
        if not isinstance(o, Mapping) or not isinstance(o.get("name"), str):
            raise InvalidInputError("each entry of 'outputs' needs a string 'name'")
        outputs.append(RequestedOutput(o["name"], _parameters(o.get("parameters"), o["name"])))
    return outputs


def decode_request(
    body: bytes,
    header_length: str | None,
    model_name: str,
    model_version: str | None,
    max_elements: int | None = None,
) -> InferRequest:
    """Parse a v2 infer body (JSON, JSON header plus binary tensors, or with a header
    length of 0 the raw data of the model's single input: Triton's raw binary request).

    With ``max_elements``, the inputs' declared shapes are counted first, so a request
    over that budget is refused before any array is built.
    """
    binary: memoryview | None = None
    raw_json: bytes | memoryview = body
    if header_length is not None:
        n = _header_length(header_length, len(body))
        if n == 0:  # a raw binary request: the body is the single input's data
            return InferRequest(model_name, model_version, [], raw_input=bytes(body))
        view = memoryview(body)
        raw_json, binary = view[:n], view[n:]
    try:
        doc = orjson.loads(raw_json)
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInputError("request body must be a JSON object")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInputError("request needs a non-empty 'inputs' list")
    shapes = _checked_shapes(raw_inputs, max_elements)
    offset = 0
    inputs = []
    for spec, known in zip(raw_inputs, shapes, strict=True):
        tensor, offset = decode_input(spec, binary, offset, known)
        inputs.append(tensor)
    if binary is not None and offset != len(binary):
        raise InvalidInputError(
            f"binary part has {len(binary) - offset} bytes not claimed by any input"
        )
    params = _parameters(doc.get("parameters"), "request")
    outputs = _requested_outputs(doc.get("outputs"))
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInputError("'id' must be a string")
    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        inputs=inputs,
        id=request_id,
        outputs=outputs,
        parameters=params,
        priority=priority_param(params.get("priority")),
        timeout_s=timeout_param_s(params.get("timeout")),
    )


def encode_response(response: InferResponse, request: InferRequest) -> tuple[bytes, int | None]:
    """The response body, and the JSON header length when binary outputs follow it."""
    binary_default = bool(request.parameters.get("binary_data_output", False))
    outputs_json: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for out in response.outputs:
        entry: dict[str, Any] = {
            "name": out.name,
            "datatype": out.datatype,
            "shape": list(out.shape),
        }
        out_params = out.parameters
        params = {k: v for k, v in out_params.items() if k != "binary_data"} if out_params else {}
        if out_params.get("binary_data", binary_default):
            raw = binary_bytes(out)
            params["binary_data_size"] = len(raw)
            chunks.append(raw)
        else:
            entry["data"] = json_data(out)
        if params:
            entry["parameters"] = params
        outputs_json.append(entry)
    doc: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": outputs_json,
    }
    if response.id is not None:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    header = orjson.dumps(doc)
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)
