"""KServe v2 protobuf messages ⇄ the protocol-neutral request and response objects.

Tensor data travels either as typed contents (``InferTensorContents``, one repeated
field per datatype family) or as ``raw_input_contents`` / ``raw_output_contents``:
little-endian, row-major bytes, BYTES elements each prefixed by a 4-byte little-endian
length. FP16 has no typed field in the specification, so it only travels raw.

The server side is :func:`request_from_proto` and :func:`response_to_proto`; the client
side (:func:`request_to_proto`, :func:`response_from_proto`) serves tests and tools.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np

from modelyard.errors import InternalError, InvalidInputError
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.protocol.datatypes import DATATYPES, numpy_dtype
from modelyard.protocol.limits import count_elements
from modelyard.protocol.tensors import array_from_binary, binary_bytes, check_shape
from modelyard.protocol.types import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    RequestedOutput,
    priority_param,
    timeout_param_s,
)

# NOTE: raw contents are little-endian by the specification, and numpy's native
# byte order is used for them (tensors.py does the same); every supported host is
# little-endian.

TYPED_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""The ``InferTensorContents`` field of each datatype; FP16 has none (raw only)."""

# Narrow integer types share a 32-bit wire field; values are range-checked on decode.
_WIRE_DTYPE: dict[str, np.dtype] = {
    "INT8": np.dtype(np.int32),
    "INT16": np.dtype(np.int32),
    "UINT8": np.dtype(np.uint32),
    "UINT16": np.dtype(np.uint32),
}

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UINT64_MAX = 2**64 - 1

# ---------------------------------------------------------------------- parameters


def parameters_from_proto(params: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """An ``InferParameter`` map as plain Python values (unset values are skipped)."""
    result: dict[str, Any] = {}
    for key, param in params.items():
        choice = param.WhichOneof("parameter_choice")
        if choice is not None:
            result[key] = getattr(param, choice)
    return result


def _set_parameter(param: pb.InferParameter, key: str, value: object) -> None:
    """Store one Python value in an ``InferParameter``."""
    # bool first: it is an int subclass.
    if isinstance(value, bool | np.bool_):
        param.bool_param = bool(value)
    elif isinstance(value, int | np.integer):
        number = int(value)
        if _INT64_MIN <= number <= _INT64_MAX:
            param.int64_param = number
        elif 0 <= number <= _UINT64_MAX:
            param.uint64_param = number
        else:
            raise InternalError(f"parameter {key!r}: {number} does not fit in 64 bits")
    elif isinstance(value, float | np.floating):
        param.double_param = float(value)
    elif isinstance(value, str):
        param.string_param = value
    else:
        raise InternalError(
            f"parameter {key!r} is a {type(value).__name__}; gRPC parameters carry only "
            "bool, int, float and str"
        )


def parameters_to_proto(
    values: Mapping[str, Any], target: MutableMapping[str, pb.InferParameter]
) -> None:
    """Copy plain Python values into an ``InferParameter`` map field."""
    for key, value in values.items():
        _set_parameter(target[key], key, value)


# ---------------------------------------------------------------------- tensors


def _array_from_contents(
    what: str, name: str, datatype: str, shape: tuple[int, ...], contents: pb.InferTensorContents
) -> np.ndarray:
    dtype = numpy_dtype(datatype)
    given = [field.name for field, _ in contents.ListFields()]
    field = TYPED_FIELD.get(datatype)
    expected = math.prod(shape)
    if field is None:
        if given or expected > 0:
            raise InvalidInputError(
                f"{what} {name!r}: {datatype} has no typed contents field in the protocol; "
                f"send it in raw_{what}_contents"
            )
        return np.empty(shape, dtype=dtype)
    wrong = [f for f in given if f != field]
    if wrong:
        raise InvalidInputError(
            f"{what} {name!r}: datatype {datatype} takes its data in {field}, got "
            f"{', '.join(wrong)}"
        )
    values: Sequence[Any] = getattr(contents, field)
    if len(values) != expected:
        raise InvalidInputError(
            f"{what} {name!r}: shape {list(shape)} needs {expected} elements, got {len(values)}"
        )
    if datatype == "BYTES":
        arr = np.empty(expected, dtype=object)
        arr[:] = list(values)
        return arr.reshape(shape)
    wire = _WIRE_DTYPE.get(datatype, dtype)
    arr = np.fromiter(values, dtype=wire, count=expected)
    if wire != dtype:
        info = np.iinfo(dtype)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise InvalidInputError(
                f"{what} {name!r}: values must lie in [{info.min}, {info.max}] for {datatype}"
            )
        arr = arr.astype(dtype)
    return arr.reshape(shape)


def _fill_contents(contents: pb.InferTensorContents, datatype: str, array: np.ndarray) -> None:
    field: Any = getattr(contents, TYPED_FIELD[datatype])
    flat = array.reshape(-1)
    if datatype == "BYTES":
        field.extend(v if isinstance(v, bytes) else str(v).encode("utf-8") for v in flat)
    else:
        field.extend(flat.astype(numpy_dtype(datatype), copy=False).tolist())


def _raw_bytes(out: InferOutput) -> bytes:
    if out.datatype != "BYTES":
        expected = numpy_dtype(out.datatype)
        if out.array.dtype != expected:
            # The declared datatype is what the client decodes with.
            out = InferOutput(
                out.name, out.datatype, out.shape, out.array.astype(expected), out.parameters
            )
    return binary_bytes(out)


def _check_output(out: InferOutput) -> None:
    # A bad output is the server's fault, not the client's: INTERNAL, not INVALID_ARGUMENT.
    if out.datatype not in DATATYPES:
        raise InternalError(f"output {out.name!r} has unknown datatype {out.datatype!r}")
    if math.prod(out.shape) != out.array.size:
        raise InternalError(
            f"output {out.name!r}: shape {list(out.shape)} does not match its "
            f"{out.array.size} elements"
        )


def _decode_tensors(
    what: str,
    tensors: Sequence[Any],
    raw: Sequence[bytes],
) -> list[tuple[str, str, tuple[int, ...], np.ndarray, dict[str, Any]]]:
    """Decode input or output tensors (``what``), from raw contents if there are any."""
    if raw:
        if len(raw) != len(tensors):
            raise InvalidInputError(
                f"raw_{what}_contents has {len(raw)} entries for {len(tensors)} {what}s; "
                "give one per tensor, in order"
            )
        for t in tensors:
            if t.contents.ListFields():
                raise InvalidInputError(
                    f"{what} {t.name!r}: both typed contents and raw_{what}_contents are "
                    "given; use one or the other for the whole request"
                )
    decoded = []
    for i, t in enumerate(tensors):
        name = t.name
        if not name:
            raise InvalidInputError(f"every {what} needs a non-empty 'name'")
        datatype = t.datatype
        numpy_dtype(datatype)
        shape = check_shape(name, list(t.shape))
        if raw:
            arr = array_from_binary(name, datatype, shape, raw[i])
        else:
            arr = _array_from_contents(what, name, datatype, shape, t.contents)
        decoded.append((name, datatype, shape, arr, parameters_from_proto(t.parameters)))
    return decoded


# ---------------------------------------------------------------------- server side


def request_from_proto(msg: pb.ModelInferRequest, max_elements: int | None = None) -> InferRequest:
    """Decode a ``ModelInferRequest``; :class:`InvalidInputError` when it is malformed.

    With ``max_elements``, the inputs' declared shapes are counted before any array is
    built, and a request over that budget is a PayloadTooLargeError.

    ``parameters["priority"]`` (int64 or uint64, 1 is the highest) becomes
    ``priority`` and ``parameters["timeout"]`` (microseconds) becomes ``timeout_s``;
    both also stay in ``parameters``, as on the REST side.
    """
    if not msg.model_name:
        raise InvalidInputError("'model_name' is required")
    if not msg.inputs:
        raise InvalidInputError("request needs at least one input")
    if max_elements is not None:
        total = 0
        for t in msg.inputs:
            total = count_elements(t.name, check_shape(t.name, list(t.shape)), total, max_elements)
    inputs = [
        InferInput(name, datatype, shape, arr, params)
        for name, datatype, shape, arr, params in _decode_tensors(
            "input", msg.inputs, msg.raw_input_contents
        )
    ]
    params = parameters_from_proto(msg.parameters)
    outputs = None
    if msg.outputs:
        outputs = []
        for o in msg.outputs:
            if not o.name:
                raise InvalidInputError("every requested output needs a non-empty 'name'")
            outputs.append(RequestedOutput(o.name, parameters_from_proto(o.parameters)))
    return InferRequest(
        model_name=msg.model_name,
        model_version=msg.model_version or None,
        inputs=inputs,
        id=msg.id or None,
        outputs=outputs,
        parameters=params,
        priority=priority_param(params.get("priority")),
        timeout_s=timeout_param_s(params.get("timeout")),
    )


def response_to_proto(response: InferResponse, *, raw: bool = True) -> pb.ModelInferResponse:
    """Encode an :class:`InferResponse`.

    With ``raw`` (the default, as Triton does and as tritonclient expects) tensor data
    goes in ``raw_output_contents``; otherwise in typed contents, unless an output is
    FP16, which has no typed field, and then the whole response is raw.
    """
    msg = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id or "",
    )
    parameters_to_proto(response.parameters, msg.parameters)
    raw = raw or any(out.datatype not in TYPED_FIELD for out in response.outputs)
    for out in response.outputs:
        _check_output(out)
        tensor = msg.outputs.add(name=out.name, datatype=out.datatype, shape=out.shape)
        parameters_to_proto(out.parameters, tensor.parameters)
        if raw:
            msg.raw_output_contents.append(_raw_bytes(out))
        else:
            _fill_contents(tensor.contents, out.datatype, out.array)
    return msg


# ---------------------------------------------------------------------- client side


def request_to_proto(request: InferRequest, *, raw: bool = True) -> pb.ModelInferRequest:
    """Encode an :class:`InferRequest` (raw contents by default, as tritonclient sends).

    ``priority`` and ``timeout_s`` go into ``parameters`` as ``priority`` (uint64, as
    tritonclient sends it) and ``timeout`` (int64 microseconds).
    """
    msg = pb.ModelInferRequest(
        model_name=request.model_name,
        model_version=request.model_version or "",
        id=request.id or "",
    )
    parameters_to_proto(request.parameters, msg.parameters)
    if request.priority is not None:
        msg.parameters["priority"].uint64_param = request.priority
    if request.timeout_s is not None:
        msg.parameters["timeout"].int64_param = max(1, round(request.timeout_s * 1e6))
    raw = raw or any(t.datatype not in TYPED_FIELD for t in request.inputs)
    for t in request.inputs:
        tensor = msg.inputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
        parameters_to_proto(t.parameters, tensor.parameters)
        out = InferOutput(t.name, t.datatype, t.shape, t.array)
        if raw:
            msg.raw_input_contents.append(_raw_bytes(out))
        else:
            _fill_contents(tensor.contents, t.datatype, t.array)
    for wanted in request.outputs or ():
        requested = msg.outputs.add(name=wanted.name)
        parameters_to_proto(wanted.parameters, requested.parameters)
    return msg


def response_from_proto(msg: pb.ModelInferResponse) -> InferResponse:
    """Decode a ``ModelInferResponse`` (raw or typed contents)."""
    outputs = [
        InferOutput(name, datatype, shape, arr, params)
        for name, datatype, shape, arr, params in _decode_tensors(
            "output", msg.outputs, msg.raw_output_contents
        )
    ]
    return InferResponse(
        model_name=msg.model_name,
        model_version=msg.model_version,
        outputs=outputs,
        id=msg.id or None,
        parameters=parameters_from_proto(msg.parameters),
    )
