"""Property-based fuzzing of the three request decoders (REST JSON, binary extension, gRPC).

Whatever arrives, a decoder returns a well-formed request or raises InvalidInputError:
never another exception (which the front ends would answer with a 500). Valid tensors
of every datatype round-trip exactly through each form, NaN and infinities included.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import orjson
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from modelyard.errors import InvalidInputError
from modelyard.frontends.grpc.convert import TYPED_FIELD, request_from_proto, request_to_proto
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.http.codec import decode_request
from modelyard.protocol.datatypes import DATATYPES, numpy_dtype
from modelyard.protocol.tensors import binary_bytes, json_data, output_from_array
from modelyard.protocol.types import InferInput, InferOutput, InferRequest

FUZZ = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
"""Fixed examples (derandomised) so that CI runs are repeatable."""
ROUND_TRIP = settings(FUZZ, max_examples=60)

DATATYPE_NAMES = sorted(DATATYPES)
NONFINITE_STRINGS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""The JSON spelling of non-finite floats (docs/decisions/0010-protocol-surface.md),
restated independently."""

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.sampled_from(["NaN", "Infinity", "-Infinity"])
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=24,
)
dims = st.integers(min_value=-2, max_value=6) | st.sampled_from([0, 2**31, 2**62, 2**63 - 1])
shapes = st.lists(dims, max_size=4) | st.lists(st.just(1), min_size=60, max_size=70)


_DATATYPES_OF: dict[type, list[str]] = {
    int: [d for d in DATATYPE_NAMES if d.startswith(("INT", "UINT", "FP"))],
    float: ["FP16", "FP32", "FP64", "INT8", "UINT64"],
    bool: ["BOOL"],
    str: ["BYTES", "FP32"],
}


def _leaves(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    return (
        [leaf for item in data for leaf in _leaves(item)]
        if any(isinstance(v, list) for v in data)
        else list(data)
    )


@st.composite
def tensor_specs(draw: st.DrawFn) -> dict[str, Any]:
    """An ``inputs`` entry: mostly well-formed fields, with any of them possibly wrong."""
    spec: dict[str, Any] = {
        "name": draw(st.text(min_size=1, max_size=6) | json_scalars),
        "datatype": draw(st.sampled_from(DATATYPE_NAMES) | json_scalars),
        "shape": draw(shapes | json_values),
    }
    if draw(st.booleans()):
        data = draw(
            st.lists(json_scalars, max_size=12)
            | st.lists(st.lists(json_scalars, max_size=3), max_size=4)
            | json_values
        )
        spec["data"] = data
        if isinstance(data, list) and draw(st.booleans()):
            # Often consistent, so that element checks (not only counts) are reached.
            leaves = _leaves(data)
            spec["shape"] = [1] * draw(st.sampled_from([0, 0, 0, 40, 70])) + [len(leaves)]
            kind = draw(st.sampled_from([int, float, bool, str]))
            if draw(st.booleans()) and all(type(v) is kind for v in leaves):
                spec["datatype"] = draw(st.sampled_from(_DATATYPES_OF[kind]))
    if draw(st.booleans()):
        spec["parameters"] = draw(
            st.fixed_dictionaries(
                {}, optional={"binary_data_size": st.integers(-2, 40) | json_scalars}
            )
            | json_values
        )
    return spec


@st.composite
def infer_documents(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {"inputs": draw(st.lists(tensor_specs(), max_size=3) | json_values)}
    optional = {
        "id": json_scalars,
        "parameters": json_values,
        "outputs": st.lists(
            st.fixed_dictionaries({"name": json_scalars}, optional={"parameters": json_values}),
            max_size=2,
        )
        | json_values,
    }
    for key, strategy in optional.items():
        if draw(st.booleans()):
            doc[key] = draw(strategy)
    return doc


def _dumps(doc: object) -> bytes:
    # The standard library writes what orjson will not (integers past 64 bits, lone
    # surrogates), so the decoder sees those too.
    return json.dumps(doc).encode()


def _check_request(req: InferRequest) -> None:
    """What a decoded request promises the rest of the server."""
    assert req.inputs
    for t in req.inputs:
        assert t.datatype in DATATYPES
        assert t.array.dtype == numpy_dtype(t.datatype)
        assert t.array.shape == t.shape
        assert all(isinstance(d, int) and d >= 0 for d in t.shape)
        if t.datatype == "BYTES":
            assert all(isinstance(v, bytes) for v in t.array.reshape(-1))
        if t.datatype == "BOOL":
            assert set(t.array.view(np.uint8).reshape(-1).tolist()) <= {0, 1}
    assert req.priority is None or (type(req.priority) is int and req.priority >= 1)
    assert req.timeout_s is None or req.timeout_s > 0


def _decode_rest(body: bytes, header_length: str | None) -> None:
    try:
        req = decode_request(body, header_length, "m", None)
    except InvalidInputError:
        return
    _check_request(req)


@FUZZ
@given(body=st.binary(max_size=200), header=st.none() | st.text(max_size=6))
def test_json_decoder_on_arbitrary_bytes(body: bytes, header: str | None) -> None:
    _decode_rest(body, header)


def _element_ok(datatype: str, value: Any, decoded: Any) -> bool:
    """The decoder's answer for one JSON element, decided independently, element by element."""
    dtype = numpy_dtype(datatype)
    if datatype == "BOOL":
        return type(value) is bool and decoded == value
    if datatype == "BYTES":
        return type(value) is str and decoded == value.encode("utf-8")
    if dtype.kind == "f":
        if type(value) is str:
            return value in NONFINITE_STRINGS and np.array_equal(
                decoded, NONFINITE_STRINGS[value], equal_nan=True
            )
        if type(value) not in (int, float):
            return False
        want = float(value)
        return math.isfinite(decoded) and decoded == dtype.type(want)
    info = np.iinfo(dtype)
    if type(value) is float and not value.is_integer():
        return False
    return type(value) in (int, float) and info.min <= value <= info.max and int(decoded) == value


def _good_elements(datatype: str) -> st.SearchStrategy[Any]:
    dtype = numpy_dtype(datatype)
    if datatype == "BOOL":
        return st.booleans()
    if datatype == "BYTES":
        return st.text(max_size=5)
    if dtype.kind == "f":
        return (
            st.floats(allow_nan=False, allow_infinity=False)
            | st.integers(-(2**70), 2**70)
            | st.sampled_from(sorted(NONFINITE_STRINGS))
        )
    info = np.iinfo(dtype)
    near = st.integers(int(info.min) - 2, int(info.min) + 2) | st.integers(
        int(info.max) - 2, int(info.max) + 2
    )
    return st.integers(int(info.min), int(info.max)) | near | st.floats(-1e20, 1e20)


@st.composite
def near_valid_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A well-formed input whose elements are mostly, not always, of its datatype."""
    datatype = draw(st.sampled_from(DATATYPE_NAMES))
    element = _good_elements(datatype)
    elements = st.one_of(element, element, element, element, json_scalars)
    rows, cols = draw(st.integers(0, 3)), draw(st.integers(0, 4))
    if draw(st.booleans()):
        data: list[Any] = draw(st.lists(elements, min_size=rows * cols, max_size=rows * cols))
        shape = [rows, cols]
    else:
        data = draw(
            st.lists(st.lists(elements, min_size=cols, max_size=cols), min_size=rows, max_size=rows)
        )
        shape = [rows, cols]
    return {
        "name": draw(st.sampled_from(["x", "y"])),
        "datatype": datatype,
        "shape": shape,
        "data": data,
    }


documents = infer_documents() | st.fixed_dictionaries(
    {"inputs": st.lists(near_valid_specs(), min_size=1, max_size=2)}
)


@FUZZ
@given(doc=documents)
def test_json_decoder_on_arbitrary_documents(doc: dict[str, Any]) -> None:
    try:
        req = decode_request(_dumps(doc), None, "m", None)
    except InvalidInputError as exc:
        event(f"refused: {exc.message.split(':')[-1][:30]}")
        return
    event("decoded")
    _check_request(req)
    for spec, t in zip(doc["inputs"], req.inputs, strict=True):
        values = _leaves(spec["data"])
        decoded = t.array.reshape(-1).tolist()
        assert len(values) == len(decoded)
        for value, got in zip(values, decoded, strict=True):
            assert _element_ok(t.datatype, value, got), (t.datatype, value, got)


@st.composite
def binary_tensors(draw: st.DrawFn) -> tuple[bytes, str]:
    """Consistent binary-extension requests with arbitrary tensor bytes."""
    datatype = draw(st.sampled_from([d for d in DATATYPE_NAMES if d != "BYTES"]))
    n = draw(st.integers(0, 6))
    raw = draw(
        st.binary(
            min_size=n * numpy_dtype(datatype).itemsize, max_size=n * numpy_dtype(datatype).itemsize
        )
    )
    shape = [1] * draw(st.sampled_from([0, 40, 70])) + [n]
    header = _dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": datatype,
                    "shape": shape,
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    )
    return header + raw, str(len(header))


@FUZZ
@given(request=binary_tensors())
def test_binary_decoder_on_arbitrary_tensor_bytes(request: tuple[bytes, str]) -> None:
    _decode_rest(*request)


@FUZZ
@given(
    doc=infer_documents(),
    tail=st.binary(max_size=64),
    header_delta=st.sampled_from([0, 0, 0, -1, 1]) | st.integers(-50, 50),
)
def test_binary_decoder_on_arbitrary_parts(
    doc: dict[str, Any], tail: bytes, header_delta: int
) -> None:
    header = _dumps(doc)
    _decode_rest(header + tail, str(len(header) + header_delta))


# ---------------------------------------------------------------- gRPC

_FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1),
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=6),
}
proto_params = st.dictionaries(
    st.sampled_from(["priority", "timeout", "binary_data", "x"]),
    st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(max_size=4),
    max_size=3,
)


def _set_params(target: Any, params: dict[str, Any]) -> None:
    for key, value in params.items():
        p = target[key]
        if isinstance(value, bool):
            p.bool_param = value
        elif isinstance(value, int):
            p.int64_param = value
        elif isinstance(value, float):
            p.double_param = value
        else:
            p.string_param = value


@st.composite
def grpc_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(
        model_name=draw(st.sampled_from(["m", ""])), id=draw(st.text(max_size=4))
    )
    _set_params(msg.parameters, draw(proto_params))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        t = msg.inputs.add(
            name=draw(st.sampled_from(["x", "y", ""])),
            datatype=draw(st.sampled_from([*DATATYPE_NAMES, "FP8", ""])),
            shape=draw(
                st.lists(st.integers(-1, 4) | st.sampled_from([2**62, 2**63 - 1]), max_size=3)
            ),
        )
        _set_params(t.parameters, draw(proto_params))
        for field in draw(st.lists(st.sampled_from(sorted(_FIELD_VALUES)), max_size=2)):
            getattr(t.contents, field).extend(draw(st.lists(_FIELD_VALUES[field], max_size=8)))
        if raw:
            size = draw(st.binary(max_size=40))
            if (
                t.datatype in DATATYPES
                and t.datatype != "BYTES"
                and all(0 <= d < 5 for d in t.shape)
            ):
                # Often the right size, so that the bytes themselves are checked.
                n = math.prod(t.shape) * numpy_dtype(t.datatype).itemsize
                size = draw(st.sampled_from([size, draw(st.binary(min_size=n, max_size=n))]))
            msg.raw_input_contents.append(size)
    if draw(st.booleans()):
        msg.raw_input_contents.append(draw(st.binary(max_size=8)))
    for _ in range(draw(st.integers(0, 2))):
        o = msg.outputs.add(name=draw(st.sampled_from(["out", ""])))
        _set_params(o.parameters, draw(proto_params))
    return msg


def _decode_grpc(msg: pb.ModelInferRequest) -> None:
    try:
        req = request_from_proto(msg)
    except InvalidInputError:
        return
    _check_request(req)


@FUZZ
@given(msg=grpc_requests())
def test_grpc_decoder_on_arbitrary_messages(msg: pb.ModelInferRequest) -> None:
    _decode_grpc(msg)


@FUZZ
@given(wire=st.binary(max_size=200))
def test_grpc_decoder_on_arbitrary_wire_bytes(wire: bytes) -> None:
    try:
        msg = pb.ModelInferRequest.FromString(wire)
    except DecodeError:
        return  # grpc's own deserialiser answers this before modelyard sees it
    _decode_grpc(msg)


# ---------------------------------------------------------------- round trips


@st.composite
def valid_tensors(draw: st.DrawFn) -> tuple[str, np.ndarray]:
    datatype = draw(st.sampled_from(DATATYPE_NAMES))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4))
    if datatype == "BYTES":
        texts = draw(
            st.lists(st.text(max_size=6), min_size=math.prod(shape), max_size=math.prod(shape))
        )
        arr = np.empty(len(texts), dtype=object)
        arr[:] = [t.encode("utf-8") for t in texts]
        return datatype, arr.reshape(shape)
    # Every value of the dtype: NaN, infinities and the integer extremes included.
    return datatype, draw(hnp.arrays(numpy_dtype(datatype), shape))


def _same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype
    assert a.shape == b.shape
    if a.dtype.kind == "f":
        # Bit-exact, NaN payloads aside (JSON has one NaN).
        assert np.array_equal(a, b, equal_nan=True)
        assert (np.signbit(a) == np.signbit(b))[~np.isnan(a)].all()
    else:
        assert a.tolist() == b.tolist()


@ROUND_TRIP
@given(tensor=valid_tensors())
def test_json_round_trip_is_exact(tensor: tuple[str, np.ndarray]) -> None:
    datatype, arr = tensor
    out = InferOutput("x", datatype, arr.shape, arr)
    doc = {
        "inputs": [
            {"name": "x", "datatype": datatype, "shape": list(arr.shape), "data": json_data(out)}
        ]
    }
    got = decode_request(orjson.dumps(doc), None, "m", None).inputs[0].array
    _same(arr, got)


@ROUND_TRIP
@given(tensor=valid_tensors())
def test_binary_round_trip_is_exact(tensor: tuple[str, np.ndarray]) -> None:
    datatype, arr = tensor
    raw = binary_bytes(
        output_from_array("x", arr)
        if datatype != "BYTES"
        else InferOutput("x", datatype, arr.shape, arr)
    )
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": datatype,
                    "shape": list(arr.shape),
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    )
    got = decode_request(header + raw, str(len(header)), "m", None).inputs[0].array
    _same(arr, got)


@ROUND_TRIP
@given(tensor=valid_tensors(), raw=st.booleans())
def test_grpc_round_trip_is_exact(tensor: tuple[str, np.ndarray], raw: bool) -> None:
    datatype, arr = tensor
    req = InferRequest("m", None, [InferInput("x", datatype, arr.shape, arr)])
    msg = pb.ModelInferRequest.FromString(request_to_proto(req, raw=raw).SerializeToString())
    assert bool(msg.raw_input_contents) == (raw or datatype not in TYPED_FIELD)
    _same(arr, request_from_proto(msg).inputs[0].array)


@pytest.mark.parametrize("datatype", DATATYPE_NAMES)
def test_every_datatype_is_generated(datatype: str) -> None:
    # The round trips draw from this list; a datatype added later is fuzzed too.
    assert datatype in DATATYPES
