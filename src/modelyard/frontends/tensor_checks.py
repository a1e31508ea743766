"""Checks of an inference request against a model's tensors, and the outputs it asked for."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from modelyard.errors import InvalidInputError
from modelyard.frontends.classification import CLASSIFICATION, classification_k, classify
from modelyard.protocol.datatypes import element_size
from modelyard.protocol.tensors import array_from_binary, output_from_array
from modelyard.protocol.types import InferOutput, InferRequest
from modelyard.runtimes.base import TensorSpec


def _shape_matches(spec: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    if len(spec) != len(shape):
        return False
    for s, d in zip(spec, shape, strict=True):  # noqa: SIM110  (no generator per request)
        if s >= 0 and s != d:
            return False
    return True


def _raw_shape(spec: TensorSpec, count: int) -> tuple[int, ...]:
    """The shape of a raw input of ``count`` elements: the spec's, its one dynamic
    dimension (if any) filled in, every other dynamic dimension 1."""
    dims = list(spec.shape)
    dynamic = [i for i, d in enumerate(dims) if d < 0]
    for i in dynamic[1:]:
        dims[i] = 1
    known = math.prod(d for d in dims if d >= 0)
    if dynamic:
        dims[dynamic[0]] = count // known if known and count % known == 0 else -1
    if math.prod(dims) != count or min(dims, default=0) < 0:
        raise InvalidInputError(
            f"raw binary request: {count} elements of {spec.datatype} do not fill input "
            f"{spec.name!r} of shape {list(spec.shape)}"
        )
    return tuple(dims)


def raw_input_array(model: str, raw: bytes, specs: list[TensorSpec]) -> tuple[str, np.ndarray]:
    """The input name and array of a raw binary request's body (Triton's binary tensor
    extension): the model's only input, its datatype from the metadata, its shape
    deduced from the size.

    A BYTES input gets the whole body as its one element."""
    required = [s for s in specs if not s.optional]
    if len(required) != 1:
        raise InvalidInputError(
            "a raw binary request (Inference-Header-Content-Length: 0) needs a model with "
            f"exactly one input; {model!r} has {len(required)}"
        )
    spec = required[0]
    if spec.datatype == "BYTES":
        shape = _raw_shape(spec, 1)
        arr = np.empty(1, dtype=object)
        arr[0] = raw
        return spec.name, arr.reshape(shape)
    size = element_size(spec.datatype)
    if len(raw) % size:
        raise InvalidInputError(
            f"raw binary request: {len(raw)} bytes are not whole {spec.datatype} elements "
            f"of input {spec.name!r}"
        )
    shape = _raw_shape(spec, len(raw) // size)
    return spec.name, array_from_binary(spec.name, spec.datatype, shape, raw)


def validate_inputs(
    model: str, request: InferRequest, specs: list[TensorSpec]
) -> dict[str, np.ndarray]:
    """The request's input arrays by name, checked against the inputs of ``model`` (its
    name, for the messages); the
    requested outputs are checked here too (every transport calls this before the model
    runs): each may be named once. Inputs the model declares optional may be left out."""
    if request.outputs:
        _refuse_repeated_outputs(request)
    if request.raw_input is not None:
        name, array = raw_input_array(model, request.raw_input, specs)
        return {name: array}
    by_name = {s.name: s for s in specs}
    inputs: dict[str, np.ndarray] = {}
    for tensor in request.inputs:
        spec = by_name.get(tensor.name)
        if spec is None:
            raise InvalidInputError(
                f"model {model!r} has no input {tensor.name!r}; inputs are: {', '.join(by_name)}"
            )
        if tensor.name in inputs:
            raise InvalidInputError(f"input {tensor.name!r} is given twice")
        if tensor.datatype != spec.datatype:
            raise InvalidInputError(
                f"input {tensor.name!r}: datatype {tensor.datatype} does not match the "
                f"model's {spec.datatype}"
            )
        if not _shape_matches(spec.shape, tensor.shape):
            raise InvalidInputError(
                f"input {tensor.name!r}: shape {list(tensor.shape)} does not match the "
                f"model's {list(spec.shape)} (-1 means any size)"
            )
        inputs[tensor.name] = tensor.array
    # Every input named a distinct known input: none is missing when the counts agree.
    missing = (
        []
        if len(inputs) == len(by_name)
        else [n for n, s in by_name.items() if n not in inputs and not s.optional]
    )
    if missing:
        raise InvalidInputError(f"model {model!r} needs input(s) {', '.join(missing)}, not given")
    return inputs


def _refuse_repeated_outputs(request: InferRequest) -> None:
    """InvalidInputError when an output is requested twice (100,000 copies of one name
    would multiply the answer)."""
    seen: set[str] = set()
    for wanted in request.outputs or ():
        if wanted.name in seen:
            raise InvalidInputError(f"output {wanted.name!r} is requested twice")
        seen.add(wanted.name)


def select_outputs(
    request: InferRequest,
    outputs: dict[str, np.ndarray],
    specs: list[TensorSpec],
    *,
    batched: bool = False,
    labels: Callable[[], tuple[str, ...]] = tuple,
) -> list[InferOutput]:
    """The outputs the request asked for (all, in metadata order, when it named none).

    An output asked for with ``classification: k`` comes back as its top ``k`` classes
    (:mod:`modelyard.frontends.classification`); ``batched``: the model's first
    dimension is the batch; ``labels``: reads the model's class labels when needed."""
    if request.outputs:
        result = []
        for wanted in request.outputs:
            if wanted.name not in outputs:
                raise InvalidInputError(
                    f"requested output {wanted.name!r} does not exist; outputs are: "
                    f"{', '.join(outputs)}"
                )
            params = wanted.parameters
            k = classification_k(wanted.name, params) if params else None
            if k is None:
                out = output_from_array(wanted.name, outputs[wanted.name])
                out.parameters = dict(params)
            else:
                out = classify(
                    wanted.name, outputs[wanted.name], k, batched=batched, labels=labels()
                )
                out.parameters = {n: v for n, v in params.items() if n != CLASSIFICATION}
            result.append(out)
        return result
    result = [output_from_array(s.name, outputs[s.name]) for s in specs if s.name in outputs]
    return result or [output_from_array(name, array) for name, array in outputs.items()]


def request_rows(request: InferRequest, batched: bool) -> int:
    """Inferences in a request: its batch size for a batching model, else one."""
    if not batched or not request.inputs or not request.inputs[0].shape:
        return 1
    return request.inputs[0].shape[0]
