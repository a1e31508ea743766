"""Tensor (de)serialisation for the protocol's JSON and binary forms.

Arrays are built straight from the request's lists or binary buffers with one numpy
call each; there is no per-element validation model on the hot path.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from modelyard.errors import InvalidInputError
from modelyard.protocol.datatypes import element_size, numpy_dtype, v2_datatype
from modelyard.protocol.types import InferInput, InferOutput

_LEN = struct.Struct("<I")


def check_shape(name: str, shape: object) -> tuple[int, ...]:
    """Validate a shape field: a list of non-negative integers."""
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise InvalidInputError(
            f"input {name!r}: 'shape' must be a list of non-negative integers, got {shape!r}"
        )
    return tuple(shape)


def _bytes_element(name: str, value: object) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes):
        return value
    raise InvalidInputError(
        f"input {name!r}: BYTES data must be strings, got {type(value).__name__}"
    )


def _flatten(data: Sequence[Any]) -> list[Any]:
    # Nested lists are allowed by the protocol ("row-major, flattened or not").
    if data and isinstance(data[0], list):
        out: list[Any] = []
        stack = [data]
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                stack.extend(reversed(item))
            else:
                out.append(item)
        return out
    return list(data) if not isinstance(data, list) else data


def array_from_json(name: str, datatype: str, shape: tuple[int, ...], data: object) -> np.ndarray:
    """Build the array of one JSON input tensor, checking count against ``shape``."""
    if not isinstance(data, list):
        raise InvalidInputError(f"input {name!r}: 'data' must be a list, got {type(data).__name__}")
    dtype = numpy_dtype(datatype)
    expected = math.prod(shape)
    flat = _flatten(data)
    if len(flat) != expected:
        raise InvalidInputError(
            f"input {name!r}: shape {list(shape)} needs {expected} elements, got {len(flat)}"
        )
    if datatype == "BYTES":
        arr = np.empty(expected, dtype=object)
        for i, v in enumerate(flat):
            arr[i] = _bytes_element(name, v)
        return arr.reshape(shape)
    if datatype == "BOOL" and not all(isinstance(v, bool) for v in flat):
        raise InvalidInputError(f"input {name!r}: BOOL data must be true/false")
    try:
        arr = np.asarray(flat, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInputError(
            f"input {name!r}: data does not fit datatype {datatype}: {exc}"
        ) from None
    if dtype.kind in "iu" and flat and any(isinstance(v, float) for v in flat[:16]):
        raise InvalidInputError(f"input {name!r}: {datatype} data must be integers")
    return arr.reshape(shape)


def array_from_binary(
    name: str, datatype: str, shape: tuple[int, ...], raw: bytes | memoryview
) -> np.ndarray:
    """Build the array of one binary input tensor (the binary-tensor extension)."""
    expected = math.prod(shape)
    if datatype == "BYTES":
        items: list[bytes] = []
        view = memoryview(raw)
        pos = 0
        while pos < len(view):
            if pos + 4 > len(view):
                raise InvalidInputError(f"input {name!r}: truncated BYTES element length")
            (n,) = _LEN.unpack_from(view, pos)
            pos += 4
            if pos + n > len(view):
                raise InvalidInputError(f"input {name!r}: truncated BYTES element")
            items.append(bytes(view[pos : pos + n]))
            pos += n
        if len(items) != expected:
            raise InvalidInputError(
                f"input {name!r}: shape {list(shape)} needs {expected} elements, got {len(items)}"
            )
        arr = np.empty(expected, dtype=object)
        arr[:] = items
        return arr.reshape(shape)
    size = element_size(datatype)
    if len(raw) != expected * size:
        raise InvalidInputError(
            f"input {name!r}: binary data is {len(raw)} bytes, shape {list(shape)} of "
            f"{datatype} needs {expected * size}"
        )
    # Copy once: the request buffer does not outlive the request.
    return np.frombuffer(raw, dtype=numpy_dtype(datatype)).reshape(shape).copy()


def decode_input(
    spec: Mapping[str, Any], binary: memoryview | None, offset: int
) -> tuple[InferInput, int]:
    """Decode one entry of ``inputs``; returns the tensor and the new binary offset."""
    if not isinstance(spec, Mapping):
        raise InvalidInputError("each entry of 'inputs' must be an object")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInputError("every input needs a non-empty string 'name'")
    datatype = spec.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidInputError(f"input {name!r}: missing 'datatype'")
    numpy_dtype(datatype)
    shape = check_shape(name, spec.get("shape"))
    params = spec.get("parameters") or {}
    if not isinstance(params, Mapping):
        raise InvalidInputError(f"input {name!r}: 'parameters' must be an object")
    bsize = params.get("binary_data_size")
    if bsize is not None:
        if binary is None:
            raise InvalidInputError(
                f"input {name!r}: binary_data_size given but the request has no binary part"
            )
        if not isinstance(bsize, int) or bsize < 0 or offset + bsize > len(binary):
            raise InvalidInputError(f"input {name!r}: binary_data_size {bsize!r} is out of range")
        arr = array_from_binary(name, datatype, shape, binary[offset : offset + bsize])
        offset += bsize
    else:
        if "data" not in spec:
            raise InvalidInputError(f"input {name!r}: missing 'data'")
        arr = array_from_json(name, datatype, shape, spec["data"])
    return InferInput(name, datatype, shape, arr, dict(params)), offset


def output_from_array(name: str, array: np.ndarray) -> InferOutput:
    """Wrap a runtime output array as a protocol output."""
    if array.dtype.kind in ("U", "S"):
        array = (
            np.vectorize(
                lambda v: v.encode("utf-8") if isinstance(v, str) else bytes(v), otypes=[object]
            )(array)
            if array.size
            else array.astype(object)
        )
    return InferOutput(name, v2_datatype(array.dtype), tuple(int(d) for d in array.shape), array)


def json_data(out: InferOutput) -> list[Any]:
    """Flat row-major data of an output for the JSON form."""
    arr = out.array
    if out.datatype == "BYTES":
        result: list[Any] = []
        for v in arr.reshape(-1):
            if isinstance(v, bytes):
                try:
                    result.append(v.decode("utf-8"))
                except UnicodeDecodeError:
                    result.append(v.decode("latin-1"))
            else:
                result.append(str(v))
        return result
    if out.datatype == "FP16":
        arr = arr.astype(np.float32)
    flat: list[Any] = arr.reshape(-1).tolist()
    return flat


def binary_bytes(out: InferOutput) -> bytes:
    """Raw bytes of an output for the binary form (BYTES: 4-byte length prefixes)."""
    if out.datatype == "BYTES":
        parts: list[bytes] = []
        for v in out.array.reshape(-1):
            b = v if isinstance(v, bytes) else str(v).encode("utf-8")
            parts.append(_LEN.pack(len(b)))
            parts.append(b)
        return b"".join(parts)
    return np.ascontiguousarray(out.array).tobytes()
