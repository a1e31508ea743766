"""Strict tensor decoding: every element has its datatype's type, or the request is a 400.

Unit tables over the three decoders (REST JSON, the binary-tensor extension, gRPC), then
a real server with the ``types`` model (one input of every datatype) over REST, and
NaN/infinity carried through JSON answers as strings, never as ``null``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from modelyard.errors import InvalidInputError
from modelyard.frontends.grpc.convert import request_from_proto
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.http.codec import HEADER_LENGTH, decode_request, encode_response
from modelyard.protocol.json_tensors import NONFINITE_STRINGS
from modelyard.protocol.tensors import output_from_array
from modelyard.protocol.types import InferResponse
from tests.integration.conftest import TYPES
from tests.servers import running_server, write_config


@dataclass(frozen=True)
class Bad:
    id: str
    datatype: str
    data: Any
    error: str
    shape: tuple[int, ...] | None = None


BAD = [
    Bad("null-in-fp32", "FP32", [1.0, None], "got null"),
    Bad("true-in-fp32", "FP32", [1.0, True], "got a boolean"),
    Bad("false-in-fp64", "FP64", [False, 2.0], "got a boolean"),
    Bad("number-string-in-fp32", "FP32", [1.0, "2.5"], "got the string '2.5'"),
    Bad("lowercase-nan-in-fp32", "FP32", [1.0, "nan"], "got the string 'nan'"),
    Bad("null-in-fp16", "FP16", [None, 1.0], "got null"),
    Bad("string-in-fp16", "FP16", ["x", 1.0], "got the string 'x'"),
    Bad("fp32-overflow", "FP32", [1.0, 1e39], "out of range for FP32"),
    Bad("fp16-overflow", "FP16", [1.0, 70000], "out of range for FP16"),
    # Past 64 elements the range check runs in numpy instead: the same rule.
    Bad("fp32-overflow-large", "FP32", [1.0] * 100 + [3.5e38], "out of range for FP32"),
    Bad("fp16-edge-large", "FP16", [1.0] * 100 + [-65520], "out of range for FP16"),
    Bad("fp16-edge-small", "FP16", [1.0, 65520], "out of range for FP16"),
    Bad("null-in-large-fp32", "FP32", [1.0] * 100 + [None], "got null"),
    Bad("fp16-overflow-beside-nan", "FP16", ["NaN", 70000.0], "out of range for FP16"),
    Bad("object-in-fp64", "FP64", [{}, 1.0], "got an object"),
    # Before: only the first 16 elements were checked for floats, for speed.
    Bad("fraction-after-16th-int64", "INT64", [1] * 20 + [1.5], "got a fraction"),
    Bad("fraction-in-uint8", "UINT8", [0.5, 1], "got a fraction"),
    Bad("true-in-int32", "INT32", [1, True], "got a boolean"),
    Bad("null-in-int8", "INT8", [None, 1], "got null"),
    Bad("string-in-int64", "INT64", ["1", 2], "got a string"),
    Bad("int8-over", "INT8", [127, 128], "[-128, 127]"),
    Bad("int8-under-as-float", "INT8", [-129.0, 1], "[-128, 127]"),
    Bad("uint8-negative", "UINT8", [-1, 1], "[0, 255]"),
    Bad("uint16-over", "UINT16", [65536, 1], "[0, 65535]"),
    Bad("int32-over", "INT32", [2**31, 1], "[-2147483648, 2147483647]"),
    Bad("int64-over-as-float", "INT64", [9.3e18, 1], "9223372036854775807]"),
    Bad("uint64-negative", "UINT64", [-1, 1], "[0, 18446744073709551615]"),
    # Found by the fuzzer: orjson reads an integer past 64 bits as the nearest double
    # (-2**63 exactly), which used to pass as INT64's minimum.
    Bad("int64-under-min-literal", "INT64", [-(2**63) - 1, 1], "beyond 2**53"),
    Bad("integral-float-past-2-53", "INT64", [2.0**53 + 2, 1], "beyond 2**53"),
    Bad("uint64-over-2-64", "UINT64", [2.0**64, 1], "[0, 18446744073709551615]"),
    Bad("int-for-bool", "BOOL", [True, 1], "true or false, got an integer"),
    Bad("null-for-bool", "BOOL", [None, False], "got null"),
    Bad("string-for-bool", "BOOL", ["true", False], "got a string"),
    Bad("number-for-bytes", "BYTES", ["a", 1], "strings, got an integer"),
    Bad("null-for-bytes", "BYTES", [None, "a"], "got null"),
    # orjson refuses a lone surrogate while parsing; BYTES never sees one.
    Bad("lone-surrogate-bytes", "BYTES", ["\ud800", "a"], "not valid JSON"),
    Bad("ragged-nested", "FP32", [[1.0, 2.0], [3.0]], "rectangular", (1, 3)),
    Bad("mixed-depth", "FP32", [[1.0, 2.0], 3.0, 4.0], "rectangular", (2, 2)),
    Bad("scalar-then-list", "FP32", [1.0, [2.0]], "rectangular"),
    Bad("count-mismatch-nested", "FP32", [[1.0], [2.0]], "needs 4 elements, got 2", (2, 2)),
]


def _body(datatype: str, data: Any, shape: tuple[int, ...] | None = None) -> bytes:
    dims = list(shape) if shape is not None else [len(data)]
    tensor = {"name": "x", "datatype": datatype, "shape": dims, "data": data}
    # The standard library, not orjson: it writes lone surrogates (as escapes).
    return json.dumps({"inputs": [tensor]}).encode()


@pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
def test_json_decoder_refuses(case: Bad) -> None:
    with pytest.raises(InvalidInputError) as info:
        decode_request(_body(case.datatype, case.data, case.shape), None, "m", None)
    assert case.error in info.value.message, info.value.message


def _int64_body(literal: str) -> bytes:
    """A request whose INT64 data holds ``literal`` as written (json.dumps would round it)."""
    data = '{"name": "x", "datatype": "INT64", "shape": [2], "data": [' + literal + ", 1]}"
    return ('{"inputs": [' + data + "]}").encode()


@pytest.mark.parametrize(
    "literal", ["9007199254740993.0", "9007199254740992.0", "-9.007199254740993e15"]
)
def test_integral_float_literals_from_2_53_are_refused(literal: str) -> None:
    """``9007199254740993.0`` parses as the double 2**53 (...992): accepting any integral
    float from 2**53 on would silently change the value the client wrote."""
    with pytest.raises(InvalidInputError, match="beyond 2"):
        decode_request(_int64_body(literal), None, "m", None)
    # Just below, an integral float is still exact and accepted.
    ok = decode_request(_int64_body("9007199254740991.0"), None, "m", None)
    assert ok.inputs[0].array[0] == 2**53 - 1


GOOD: list[tuple[str, str, Any, np.ndarray]] = [
    ("ints-in-fp32", "FP32", [1, -2], np.array([1.0, -2.0], np.float32)),
    ("integral-float-in-int64", "INT64", [2.0, 3], np.array([2, 3], np.int64)),
    ("int64-extremes", "INT64", [-(2**63), 2**63 - 1], np.array([-(2**63), 2**63 - 1], np.int64)),
    ("uint64-max", "UINT64", [0, 2**64 - 1], np.array([0, 2**64 - 1], np.uint64)),
    ("int8-edges-as-floats", "INT8", [-128.0, 127.0], np.array([-128, 127], np.int8)),
    ("fp16-max", "FP16", [65504.0, -65504], np.array([65504, -65504], np.float16)),
    # Below the rounding edge a value rounds to the largest finite one, as numpy does.
    ("fp16-below-edge", "FP16", [65519.0] * 70, np.full(70, 65504, np.float16)),
    ("fp32-below-edge", "FP32", [3.4028235e38], np.array([3.4028235e38], np.float32)),
    (
        "nonfinite-strings",
        "FP64",
        ["NaN", "Infinity", "-Infinity", 0.5],
        np.array([np.nan, np.inf, -np.inf, 0.5]),
    ),
    ("bools", "BOOL", [True, False], np.array([True, False])),
    ("utf8-bytes", "BYTES", ["café", ""], np.array(["café".encode(), b""], dtype=object)),
    ("nested", "INT32", [[1, 2], [3, 4]], np.array([1, 2, 3, 4], np.int32)),
]


@pytest.mark.parametrize(
    ("datatype", "data", "expected"), [g[1:] for g in GOOD], ids=[g[0] for g in GOOD]
)
def test_json_decoder_accepts_exact_values(datatype: str, data: Any, expected: np.ndarray) -> None:
    shape = (expected.size,)
    arr = decode_request(_body(datatype, data, shape), None, "m", None).inputs[0].array
    assert arr.dtype == expected.dtype
    np.testing.assert_array_equal(arr, expected)


def _binary_request(datatype: str, shape: list[int], raw: bytes) -> tuple[bytes, str]:
    header = orjson.dumps(
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


def test_binary_bool_bytes_must_be_zero_or_one() -> None:
    body, n = _binary_request("BOOL", [3], b"\x01\x00\x02")
    with pytest.raises(InvalidInputError, match="BOOL bytes must be 0 or 1"):
        decode_request(body, n, "m", None)
    body, n = _binary_request("BOOL", [3], b"\x01\x00\x01")
    arr = decode_request(body, n, "m", None).inputs[0].array
    assert arr.tolist() == [True, False, True]


@pytest.mark.parametrize(
    "field", ["binary_data_size", "priority", "timeout"], ids=["size", "priority", "timeout"]
)
def test_booleans_are_not_numbers_in_parameters(field: str) -> None:
    if field == "binary_data_size":
        body = orjson.dumps(
            {
                "inputs": [
                    {"name": "x", "datatype": "BOOL", "shape": [1], "parameters": {field: True}}
                ]
            }
        )
        with pytest.raises(InvalidInputError, match="binary_data_size"):
            decode_request(body + b"\x01", str(len(body)), "m", None)
        return
    doc = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}],
        "parameters": {field: True},
    }
    with pytest.raises(InvalidInputError, match=field):
        decode_request(orjson.dumps(doc), None, "m", None)


@pytest.mark.parametrize(
    ("shape", "error"),
    [([1] * 33, "at most 32"), ([0, 2**62, 2**62], "too large"), ([1, -1], "non-negative")],
    ids=["rank-33", "huge-empty", "negative"],
)
def test_shapes_numpy_cannot_hold_are_refused(shape: list[int], error: str) -> None:
    doc = {"inputs": [{"name": "x", "datatype": "FP16", "shape": shape, "data": []}]}
    with pytest.raises(InvalidInputError, match=error):
        decode_request(orjson.dumps(doc), None, "m", None)
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="x", datatype="FP16", shape=shape)
    with pytest.raises(InvalidInputError, match=error):
        request_from_proto(msg)


def test_grpc_raw_bool_bytes_must_be_zero_or_one() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="x", datatype="BOOL", shape=[2])
    msg.raw_input_contents.append(b"\x01\x07")
    with pytest.raises(InvalidInputError, match="BOOL bytes must be 0 or 1"):
        request_from_proto(msg)


def test_grpc_typed_narrow_ints_are_range_checked() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="x", datatype="UINT8", shape=[2])
    t.contents.uint_contents.extend([1, 256])
    with pytest.raises(InvalidInputError, match=r"\[0, 255\]"):
        request_from_proto(msg)


@pytest.mark.parametrize(
    "dtype", [np.float16, np.float32, np.float64], ids=["fp16", "fp32", "fp64"]
)
def test_nonfinite_outputs_are_spelled_and_read_back(dtype: type[np.floating[Any]]) -> None:
    arr = np.array([np.nan, np.inf, -np.inf, 1.5], dtype=dtype)
    out = output_from_array("y", arr)
    body, _ = encode_response(
        InferResponse("m", "1", [out]),
        decode_request(
            b'{"inputs":[{"name":"x","datatype":"BOOL","shape":[0],"data":[]}]}', None, "m", None
        ),
    )
    data = orjson.loads(body)["outputs"][0]["data"]
    assert data == ["NaN", "Infinity", "-Infinity", 1.5]
    assert None not in data
    # What the server writes, it reads back (and so does numpy, as tritonclient parses).
    again = decode_request(_body(out.datatype, data), None, "m", None).inputs[0].array
    np.testing.assert_array_equal(again, arr)
    np.testing.assert_array_equal(np.array(data, dtype=dtype), arr)
    assert set(NONFINITE_STRINGS) == {"NaN", "Infinity", "-Infinity"}


# ---------------------------------------------------------------- a real server

TYPES_MODEL = [{"name": "types", "path": "types", "preload": True, "isolation": "inline"}]
GOOD_ROWS: dict[str, list[Any]] = {
    "f32": [1.5, -2.0],
    "f16": [0.5, 1.0],
    "f64": [1e-300, 2.0],
    "i8": [-128, 127],
    "i32": [-(2**31), 2**31 - 1],
    "i64": [-(2**63), 2**63 - 1],
    "u8": [0, 255],
    "b": [True, False],
    "s": ["hello", "café"],
}
"""One valid [1, 2] row per input of the ``types`` model."""

BAD_ROWS: dict[str, list[Any]] = {
    "f32": [None, 1.0],
    "f16": [True, 1.0],
    "f64": ["1.0", 1.0],
    "i8": [1, 128],
    "i32": [1, 2.5],
    "i64": [False, 1],
    "u8": [-1, 1],
    "b": [1, 0],
    "s": [1, "a"],
}
"""One invalid row per input: every datatype checked, each in its own way."""


def _types_request(rows: dict[str, list[Any]]) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": n, "datatype": TYPES[n][0], "shape": [1, 2], "data": rows[n]} for n in TYPES
        ]
    }


@pytest.fixture
def config_file(model_root: Path, tmp_path: Path) -> Path:
    return write_config(tmp_path, TYPES_MODEL, model_repository=str(model_root))


async def test_every_datatype_is_checked_on_a_real_server(config_file: Path) -> None:
    async with running_server(config_file) as (_, client):
        for name in TYPES:
            rows = dict(GOOD_ROWS, **{name: BAD_ROWS[name]})
            r = await client.post("/v2/models/types/infer", json=_types_request(rows))
            assert r.status_code == 400, (name, r.text)
            assert set(r.json()) == {"error"}
            assert f"input {name!r}" in r.json()["error"], r.text
        good = await client.post("/v2/models/types/infer", json=_types_request(GOOD_ROWS))
        assert good.status_code == 200, good.text
        outs = {o["name"]: o["data"] for o in good.json()["outputs"]}
        for name, row in GOOD_ROWS.items():
            assert outs[f"{name}_out"] == row, name


async def test_nan_and_infinity_travel_as_strings_through_a_real_model(config_file: Path) -> None:
    rows = dict(GOOD_ROWS, f32=["NaN", "Infinity"], f16=["-Infinity", 1.0], f64=["NaN", 2.0])
    async with running_server(config_file) as (_, client):
        r = await client.post("/v2/models/types/infer", json=_types_request(rows))
        assert r.status_code == 200, r.text
        outs = {o["name"]: o["data"] for o in r.json()["outputs"]}
        assert outs["f32_out"] == ["NaN", "Infinity"]
        assert outs["f16_out"] == ["-Infinity", 1.0]
        assert outs["f64_out"] == ["NaN", 2.0]
        # /predict decodes with the same rules and answers the same way.
        predict = {"model": "types", "inputs": {n: [rows[n]] for n in TYPES}}
        p = await client.post("/predict", json=predict)
        assert p.status_code == 200, p.text
        assert p.json()["outputs"]["f32_out"] == [["NaN", "Infinity"]]
        predict["inputs"]["f32"] = [[None, 1.0]]  # type: ignore[index]
        bad = await client.post("/predict", json=predict)
        assert bad.status_code == 400
        assert "got null" in bad.json()["error"]
        predict["inputs"]["f32"] = [[1.0, 2.0], [3.0]]  # type: ignore[index]
        ragged = await client.post("/predict", json=predict)
        assert ragged.status_code == 400
        assert "rectangular" in ragged.json()["error"]
        binary, n = _binary_request("BOOL", [1, 2], b"\x01\x05")
        r = await client.post("/v2/models/types/infer", content=binary, headers={HEADER_LENGTH: n})
        assert r.status_code == 400
        assert "0 or 1" in r.json()["error"]
