"""ModelInferRequest/Response ⇄ InferRequest/Response, for every datatype and both forms."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from modelyard.errors import InternalError, InvalidInputError
from modelyard.frontends.grpc.convert import (
    TYPED_FIELD,
    parameters_from_proto,
    parameters_to_proto,
    request_from_proto,
    request_to_proto,
    response_from_proto,
    response_to_proto,
)
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.protocol.datatypes import DATATYPES
from modelyard.protocol.types import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    RequestedOutput,
)


def _bytes_array(*items: bytes) -> np.ndarray:
    arr = np.empty(len(items), dtype=object)
    arr[:] = list(items)
    return arr.reshape(len(items), 1)


# One 2-D sample per datatype, with each type's extreme values.
SAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False], [False, True]]),
    "UINT8": np.array([[0, 255]], dtype=np.uint8),
    "UINT16": np.array([[0, 65535]], dtype=np.uint16),
    "UINT32": np.array([[0, 2**32 - 1]], dtype=np.uint32),
    "UINT64": np.array([[0, 2**64 - 1]], dtype=np.uint64),
    "INT8": np.array([[-128, 127]], dtype=np.int8),
    "INT16": np.array([[-(2**15), 2**15 - 1]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 2**31 - 1]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 2**63 - 1]], dtype=np.int64),
    "FP16": np.array([[0.5, -65504.0, np.inf]], dtype=np.float16),
    "FP32": np.array([[1.5, -3.25, np.inf]], dtype=np.float32),
    "FP64": np.array([[1e300, -2.5, 1e-300]], dtype=np.float64),
    "BYTES": _bytes_array(b"abc", b"", b"\xff\x00binary", "héllo".encode()),
}
TYPED_DATATYPES = sorted(TYPED_FIELD)


def _request(datatype: str, **kwargs: Any) -> InferRequest:
    arr = SAMPLES[datatype]
    return InferRequest(
        model_name="m",
        model_version=None,
        inputs=[InferInput("x", datatype, arr.shape, arr)],
        **kwargs,
    )


def _wire(msg: pb.ModelInferRequest) -> pb.ModelInferRequest:
    """Through the wire format, as the server would receive it."""
    return pb.ModelInferRequest.FromString(msg.SerializeToString())


def _assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert actual.tolist() == expected.tolist()


def test_samples_cover_every_datatype() -> None:
    assert set(SAMPLES) == DATATYPES
    assert set(TYPED_FIELD) == DATATYPES - {"FP16"}


# ---------------------------------------------------------------------- requests


@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_request_round_trip_raw(datatype: str) -> None:
    msg = _wire(request_to_proto(_request(datatype), raw=True))
    assert len(msg.raw_input_contents) == 1
    assert not msg.inputs[0].contents.ListFields()
    req = request_from_proto(msg)
    assert (req.model_name, req.model_version, req.id) == ("m", None, None)
    (tensor,) = req.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, SAMPLES[datatype].shape)
    _assert_same(tensor.array, SAMPLES[datatype])


@pytest.mark.parametrize("datatype", TYPED_DATATYPES)
def test_request_round_trip_typed(datatype: str) -> None:
    msg = _wire(request_to_proto(_request(datatype), raw=False))
    assert not msg.raw_input_contents
    fields = [f.name for f, _ in msg.inputs[0].contents.ListFields()]
    assert fields == [TYPED_FIELD[datatype]]
    (tensor,) = request_from_proto(msg).inputs
    _assert_same(tensor.array, SAMPLES[datatype])


def test_raw_contents_are_little_endian_and_bytes_length_prefixed() -> None:
    arr = np.array([1, -2], dtype=np.int32)
    msg = request_to_proto(InferRequest("m", None, [InferInput("x", "INT32", (2,), arr)]))
    assert msg.raw_input_contents[0] == struct.pack("<ii", 1, -2)
    msg = request_to_proto(_request("BYTES"))
    assert msg.raw_input_contents[0] == (
        b"\x03\x00\x00\x00abc" + b"\x00\x00\x00\x00" + b"\x08\x00\x00\x00\xff\x00binary"
        b"\x06\x00\x00\x00" + "héllo".encode()
    )


def test_fp16_always_travels_raw() -> None:
    msg = request_to_proto(_request("FP16"), raw=False)
    assert len(msg.raw_input_contents) == 1
    assert not msg.inputs[0].contents.ListFields()


def test_fp16_in_typed_contents_is_refused() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="x", datatype="FP16", shape=[2]).contents.fp32_contents.extend([1, 2])
    with pytest.raises(InvalidInputError, match=r"FP16 has no typed contents.*raw_input_contents"):
        request_from_proto(msg)


def test_fp16_without_any_data_is_refused() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="x", datatype="FP16", shape=[2])
    with pytest.raises(InvalidInputError, match="raw_input_contents"):
        request_from_proto(msg)


def test_empty_fp16_tensor_needs_no_data() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="x", datatype="FP16", shape=[0, 3])
    (tensor,) = request_from_proto(msg).inputs
    assert tensor.array.shape == (0, 3)
    assert tensor.array.dtype == np.float16


def _typed_request(
    datatype: str, shape: list[int], field: str, values: list[Any]
) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m")
    tensor = msg.inputs.add(name="x", datatype=datatype, shape=shape)
    getattr(tensor.contents, field).extend(values)
    return msg


BAD_TYPED = {
    "wrong-field": (
        _typed_request("INT32", [2], "fp32_contents", [1.0, 2.0]),
        "takes its data in int_contents",
    ),
    "too-few": (
        _typed_request("FP32", [3], "fp32_contents", [1.0, 2.0]),
        "needs 3 elements, got 2",
    ),
    "too-many": (
        _typed_request("BOOL", [1], "bool_contents", [True, False]),
        "needs 1 elements, got 2",
    ),
    "int8-range": (_typed_request("INT8", [1], "int_contents", [128]), r"\[-128, 127\] for INT8"),
    "uint16-range": (_typed_request("UINT16", [1], "uint_contents", [65536]), "for UINT16"),
    "unknown-datatype": (
        _typed_request("FP8", [1], "fp32_contents", [1.0]),
        "unknown datatype 'FP8'",
    ),
    "negative-dim": (_typed_request("FP32", [-1], "fp32_contents", [1.0]), "non-negative integers"),
}


@pytest.mark.parametrize(("msg", "match"), list(BAD_TYPED.values()), ids=list(BAD_TYPED))
def test_bad_typed_contents(msg: pb.ModelInferRequest, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        request_from_proto(msg)


def test_raw_entry_count_must_match_inputs() -> None:
    msg = request_to_proto(_request("FP32"))
    msg.raw_input_contents.append(b"")
    with pytest.raises(InvalidInputError, match="2 entries for 1 inputs"):
        request_from_proto(msg)


def test_raw_and_typed_contents_do_not_mix() -> None:
    msg = request_to_proto(_request("FP32"))
    msg.inputs.add(name="y", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    msg.raw_input_contents.append(b"\x00\x00\x80\x3f")
    with pytest.raises(InvalidInputError, match="both typed contents and raw_input_contents"):
        request_from_proto(msg)


def test_raw_size_must_match_shape() -> None:
    msg = request_to_proto(_request("FP32"))
    msg.raw_input_contents[0] = b"\x00" * 8
    with pytest.raises(InvalidInputError, match="binary data is 8 bytes"):
        request_from_proto(msg)


def test_truncated_raw_bytes_element() -> None:
    msg = request_to_proto(_request("BYTES"))
    msg.raw_input_contents[0] = b"\x05\x00\x00\x00ab"
    with pytest.raises(InvalidInputError, match="truncated BYTES element"):
        request_from_proto(msg)


def test_request_needs_a_model_name_and_inputs() -> None:
    with pytest.raises(InvalidInputError, match="model_name"):
        request_from_proto(pb.ModelInferRequest())
    with pytest.raises(InvalidInputError, match="at least one input"):
        request_from_proto(pb.ModelInferRequest(model_name="m"))


def test_request_fields_parameters_and_requested_outputs() -> None:
    req = _request(
        "INT64",
        id="req-1",
        parameters={"flag": True, "name": "v", "ratio": 0.5, "count": 3},
        outputs=[RequestedOutput("y", {"classification": 2})],
        priority=2,
        timeout_s=0.25,
    )
    req.model_version = "3"
    req.inputs[0].parameters = {"note": "n"}
    msg = _wire(request_to_proto(req))
    assert msg.parameters["priority"].WhichOneof("parameter_choice") == "uint64_param"
    assert msg.parameters["timeout"].int64_param == 250_000
    back = request_from_proto(msg)
    assert (back.model_version, back.id) == ("3", "req-1")
    assert back.priority == 2
    assert back.timeout_s == pytest.approx(0.25)
    assert back.parameters == {
        "flag": True,
        "name": "v",
        "ratio": 0.5,
        "count": 3,
        "priority": 2,
        "timeout": 250_000,
    }
    assert back.inputs[0].parameters == {"note": "n"}
    assert back.outputs == [RequestedOutput("y", {"classification": 2})]


def _with_parameter(key: str, **choice: Any) -> pb.ModelInferRequest:
    msg = request_to_proto(_request("FP32"))
    for field, value in choice.items():
        setattr(msg.parameters[key], field, value)
    return msg


GOOD_PARAMETERS = {
    "priority-int64": (_with_parameter("priority", int64_param=1), 1, None),
    "priority-uint64": (_with_parameter("priority", uint64_param=7), 7, None),
    "timeout-int64": (_with_parameter("timeout", int64_param=1_500_000), None, 1.5),
    "timeout-double": (_with_parameter("timeout", double_param=500.0), None, 0.0005),
}


@pytest.mark.parametrize(
    ("msg", "priority", "timeout_s"), list(GOOD_PARAMETERS.values()), ids=list(GOOD_PARAMETERS)
)
def test_priority_and_timeout_parameters(
    msg: pb.ModelInferRequest, priority: int | None, timeout_s: float | None
) -> None:
    req = request_from_proto(msg)
    assert req.priority == priority
    assert req.timeout_s == (None if timeout_s is None else pytest.approx(timeout_s))


BAD_PARAMETERS = {
    "priority-negative": (_with_parameter("priority", int64_param=-1), "'priority'"),
    "priority-string": (_with_parameter("priority", string_param="high"), "'priority'"),
    "priority-bool": (_with_parameter("priority", bool_param=True), "'priority'"),
    "timeout-negative": (_with_parameter("timeout", int64_param=-5), "'timeout'"),
    "timeout-string": (_with_parameter("timeout", string_param="1s"), "'timeout'"),
}


@pytest.mark.parametrize(("msg", "match"), list(BAD_PARAMETERS.values()), ids=list(BAD_PARAMETERS))
def test_bad_priority_and_timeout(msg: pb.ModelInferRequest, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        request_from_proto(msg)


def test_priority_and_timeout_zero_are_the_defaults() -> None:
    """As in Triton: tritonclient sends 0 for "not set"."""
    request = request_from_proto(_with_parameter("priority", uint64_param=0))
    assert request.priority is None
    request = request_from_proto(_with_parameter("timeout", int64_param=0))
    assert request.timeout_s is None


# ---------------------------------------------------------------------- responses


def _response(*datatypes: str) -> InferResponse:
    outputs = [
        InferOutput(f"out_{dt.lower()}", dt, SAMPLES[dt].shape, SAMPLES[dt]) for dt in datatypes
    ]
    return InferResponse("m", "1", outputs, id="r")


def _wire_response(msg: pb.ModelInferResponse) -> pb.ModelInferResponse:
    return pb.ModelInferResponse.FromString(msg.SerializeToString())


def test_response_is_raw_by_default() -> None:
    msg = response_to_proto(_response(*sorted(SAMPLES)))
    assert len(msg.raw_output_contents) == len(SAMPLES)
    assert not any(o.contents.ListFields() for o in msg.outputs)


@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_response_round_trip_raw(datatype: str) -> None:
    msg = _wire_response(response_to_proto(_response(datatype)))
    back = response_from_proto(msg)
    assert (back.model_name, back.model_version, back.id) == ("m", "1", "r")
    (out,) = back.outputs
    assert (out.datatype, out.shape) == (datatype, SAMPLES[datatype].shape)
    _assert_same(out.array, SAMPLES[datatype])


@pytest.mark.parametrize("datatype", TYPED_DATATYPES)
def test_response_round_trip_typed(datatype: str) -> None:
    msg = _wire_response(response_to_proto(_response(datatype), raw=False))
    assert not msg.raw_output_contents
    (out,) = response_from_proto(msg).outputs
    _assert_same(out.array, SAMPLES[datatype])


def test_fp16_output_makes_the_whole_response_raw() -> None:
    msg = response_to_proto(_response("FP32", "FP16"), raw=False)
    assert len(msg.raw_output_contents) == 2
    assert not any(o.contents.ListFields() for o in msg.outputs)


def test_response_parameters_round_trip() -> None:
    resp = _response("FP32")
    resp.parameters = {"b": False, "i": -3, "u": 2**64 - 1, "f": 0.25, "s": "x"}
    resp.outputs[0].parameters = {"classification": 2}
    msg = _wire_response(response_to_proto(resp))
    assert msg.parameters["u"].WhichOneof("parameter_choice") == "uint64_param"
    back = response_from_proto(msg)
    assert back.parameters == resp.parameters
    assert back.outputs[0].parameters == {"classification": 2}


def test_output_array_is_cast_to_its_declared_datatype() -> None:
    arr = np.array([1.0, 2.0], dtype=np.float64)
    msg = response_to_proto(InferResponse("m", "1", [InferOutput("y", "FP32", (2,), arr)]))
    assert msg.raw_output_contents[0] == np.array([1.0, 2.0], dtype="<f4").tobytes()


def test_output_shape_must_match_its_array() -> None:
    arr = np.zeros(3, dtype=np.float32)
    with pytest.raises(InternalError, match="does not match its 3 elements"):
        response_to_proto(InferResponse("m", "1", [InferOutput("y", "FP32", (2,), arr)]))


def test_unsupported_parameter_type_is_an_internal_error() -> None:
    target = pb.ModelInferResponse().parameters
    with pytest.raises(InternalError, match="'bad' is a list"):
        parameters_to_proto({"bad": [1, 2]}, target)
    with pytest.raises(InternalError, match="does not fit in 64 bits"):
        parameters_to_proto({"big": 2**64}, target)


def test_unset_parameters_are_skipped() -> None:
    msg = pb.ModelInferRequest()
    msg.parameters["empty"].SetInParent()
    msg.parameters["set"].string_param = "v"
    assert parameters_from_proto(msg.parameters) == {"set": "v"}


def test_output_with_unknown_datatype_is_an_internal_error() -> None:
    arr = np.zeros(2, dtype=np.float32)
    with pytest.raises(InternalError, match="unknown datatype 'FP8'"):
        response_to_proto(InferResponse("m", "1", [InferOutput("y", "FP8", (2,), arr)]))
