"""Tensor (de)serialisation for the protocol's JSON and binary forms.

Arrays are built straight from the request's lists or binary buffers with one numpy
call each; there is no per-element validation model on the hot path. The JSON form's
typing rules live in :mod:`modelyard.protocol.json_tensors`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from modelyard.errors import InvalidInputError
from modelyard.protocol.datatypes import element_size, numpy_dtype, v2_datatype
from modelyard.protocol.json_tensors import array_from_json, json_list
from modelyard.protocol.types import InferInput, InferOutput

__all__ = [
    "array_from_binary",
    "array_from_json",
    "binary_bytes",
    "check_shape",
    "decode_input",
    "json_data",
    "output_from_array",
]

_LEN = struct.Struct("<I")
MAX_RANK = 32
"""Most dimensions a tensor may have (numpy allows 64, older numpy 32)."""
MAX_SHAPE_ELEMENTS = 2**56
"""A shape may describe at most this many elements, zero dimensions aside, so that
numpy can always represent it; real requests are bounded far below by the body limit."""


def check_shape(name: str, shape: object) -> tuple[int, ...]:
    """Validate a shape field: a list of at most :data:`MAX_RANK` non-negative integers."""
    # Plain loops: generator expressions in all() and math.prod() cost more than the
    # checks themselves on the short shapes every request carries.
    size = 1
    if isinstance(shape, list):
        for d in shape:
            if type(d) is not int or d < 0:
                break
            if d:
                size *= d
        else:
            if len(shape) > MAX_RANK:
                raise InvalidInputError(
                    f"input {name!r}: 'shape' has {len(shape)} dimensions; at most {MAX_RANK} "
                    "are allowed"
                )
            if size > MAX_SHAPE_ELEMENTS:
                raise InvalidInputError(f"input {name!r}: shape {shape} is too large")
            return tuple(shape)
    raise InvalidInputError(
        f"input {name!r}: 'shape' must be a list of non-negative integers, got {shape!r}"
    )


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
    if datatype == "BOOL" and expected and np.frombuffer(raw, dtype=np.uint8).max() > 1:
        # numpy would keep any other byte as a "true" that compares unequal to True.
        raise InvalidInputError(f"input {name!r}: BOOL bytes must be 0 or 1")
    # Copy once: the request buffer does not outlive the request.
    return np.frombuffer(raw, dtype=numpy_dtype(datatype)).reshape(shape).copy()


def decode_input(
    spec: Mapping[str, Any],
    binary: memoryview | None,
    offset: int,
    shape: tuple[int, ...] | None = None,
) -> tuple[InferInput, int]:
    """Decode one entry of ``inputs``; returns the tensor and the new binary offset.

    ``shape``: the entry's shape as :func:`check_shape` returned it already (None: check
    it here)."""
    # type() first: JSON objects are plain dicts, and an ABC isinstance costs more.
    if type(spec) is not dict and not isinstance(spec, Mapping):
        raise InvalidInputError("each entry of 'inputs' must be an object")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInputError("every input needs a non-empty string 'name'")
    datatype = spec.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidInputError(f"input {name!r}: missing 'datatype'")
    dtype = numpy_dtype(datatype)  # checks the name; passed on, not looked up again
    if shape is None:
        shape = check_shape(name, spec.get("shape"))
    params = spec.get("parameters")
    if params is None:
        params = {}
    elif not isinstance(params, Mapping):
        raise InvalidInputError(f"input {name!r}: 'parameters' must be an object")
    bsize = params.get("binary_data_size")
    if bsize is not None:
        if binary is None:
            raise InvalidInputError(
                f"input {name!r}: binary_data_size given but the request has no binary part"
            )
        if type(bsize) is not int or bsize < 0 or offset + bsize > len(binary):
            raise InvalidInputError(f"input {name!r}: binary_data_size {bsize!r} is out of range")
        arr = array_from_binary(name, datatype, shape, binary[offset : offset + bsize])
        offset += bsize
    else:
        if "data" not in spec:
            raise InvalidInputError(f"input {name!r}: missing 'data'")
        arr = array_from_json(name, datatype, shape, spec["data"], dtype)
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
    # ndarray.shape is a tuple of Python ints already: no conversion per output.
    return InferOutput(name, v2_datatype(array.dtype), array.shape, array)


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
    return json_list(arr)


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
