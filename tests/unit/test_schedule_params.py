"""One check of ``priority`` and ``timeout`` for every route (REST infer, /predict, gRPC)."""

from __future__ import annotations

import math

import orjson
import pytest

from modelyard.errors import InvalidInputError
from modelyard.frontends.grpc.convert import request_from_proto
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.http.codec import decode_request
from modelyard.protocol.predict import predict_call
from modelyard.protocol.types import priority_param, timeout_param_s

INPUT = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}


def _grpc(key: str, **value: object) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m")
    tensor = msg.inputs.add(name="x", datatype="FP32", shape=[1])
    tensor.contents.fp32_contents.append(1.0)
    for field, v in value.items():
        setattr(msg.parameters[key], field, v)
    return msg


@pytest.mark.parametrize("value", [True, -1, "1", 1.0])
def test_every_route_reads_priority_alike(value: object) -> None:
    """REST infer, /predict and gRPC share one check: ``true`` is no priority anywhere."""
    with pytest.raises(InvalidInputError, match="'priority' must be a positive integer"):
        priority_param(value)
    with pytest.raises(InvalidInputError, match="'priority' must be a positive integer"):
        decode_request(
            orjson.dumps({"inputs": [INPUT], "parameters": {"priority": value}}), None, "m", None
        )
    with pytest.raises(InvalidInputError, match="'priority' must be a positive integer"):
        predict_call({"model": "m", "priority": value})


@pytest.mark.parametrize(
    "param", [{"bool_param": True}, {"int64_param": -1}, {"string_param": "1"}]
)
def test_grpc_reads_priority_as_rest_does(param: dict[str, object]) -> None:
    with pytest.raises(InvalidInputError, match="'priority' must be a positive integer"):
        request_from_proto(_grpc("priority", **param))


@pytest.mark.parametrize("value", [True, -5, "1s"])
def test_every_route_reads_timeout_alike(value: object) -> None:
    with pytest.raises(InvalidInputError, match="'timeout' must be a positive number"):
        timeout_param_s(value)
    with pytest.raises(InvalidInputError, match="'timeout' must be a positive number"):
        decode_request(
            orjson.dumps({"inputs": [INPUT], "parameters": {"timeout": value}}), None, "m", None
        )
    with pytest.raises(InvalidInputError, match="'timeout' must be a positive number"):
        predict_call({"model": "m", "timeout": value})


def test_nan_is_no_timeout() -> None:
    # gRPC's double_param can carry NaN, which JSON cannot.
    with pytest.raises(InvalidInputError, match="'timeout' must be a positive number"):
        request_from_proto(_grpc("timeout", double_param=math.nan))


def test_good_values_pass_through() -> None:
    assert priority_param(None) is None
    assert priority_param(3) == 3
    assert timeout_param_s(None) is None
    assert timeout_param_s(250_000) == 0.25
    assert predict_call({"model": "m", "priority": 2, "timeout": 1000}).timeout_s == 0.001


def test_zero_means_the_default_on_every_route() -> None:
    """Triton's clients send ``priority: 0`` and ``timeout: 0`` for "not set"."""
    assert priority_param(0) is None
    assert timeout_param_s(0) is None
    body = {"inputs": [INPUT], "parameters": {"priority": 0, "timeout": 0}}
    rest = decode_request(orjson.dumps(body), None, "m", None)
    assert (rest.priority, rest.timeout_s) == (None, None)
    msg = _grpc("priority", uint64_param=0)
    msg.parameters["timeout"].int64_param = 0
    grpc = request_from_proto(msg)
    assert (grpc.priority, grpc.timeout_s) == (None, None)
    call = predict_call({"model": "m", "priority": 0, "timeout": 0})
    assert (call.priority, call.timeout_s) == (None, None)
