"""Checks of an inference request against a model's tensors, and the outputs it asked for."""

from __future__ import annotations

import numpy as np

from modelyard.errors import InvalidInputError
from modelyard.manager.records import ModelRecord
from modelyard.protocol.tensors import output_from_array
from modelyard.protocol.types import InferOutput, InferRequest
from modelyard.runtimes.base import TensorSpec


def _shape_matches(spec: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    if len(spec) != len(shape):
        return False
    for s, d in zip(spec, shape, strict=True):  # noqa: SIM110  (no generator per request)
        if s >= 0 and s != d:
            return False
    return True


def validate_inputs(
    record: ModelRecord, request: InferRequest, specs: list[TensorSpec]
) -> dict[str, np.ndarray]:
    """The request's input arrays by name, checked against the model's inputs; the
    requested outputs are checked here too (every transport calls this before the model
    runs): each may be named once."""
    if request.outputs:
        _refuse_repeated_outputs(request)
    by_name = {s.name: s for s in specs}
    inputs: dict[str, np.ndarray] = {}
    for tensor in request.inputs:
        spec = by_name.get(tensor.name)
        if spec is None:
            raise InvalidInputError(
                f"model {record.key.name!r} has no input {tensor.name!r}; "
                f"inputs are: {', '.join(by_name)}"
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
    missing = [] if len(inputs) == len(by_name) else [n for n in by_name if n not in inputs]
    if missing:
        raise InvalidInputError(
            f"model {record.key.name!r} needs input(s) {', '.join(missing)}, not given"
        )
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
    request: InferRequest, outputs: dict[str, np.ndarray], specs: list[TensorSpec]
) -> list[InferOutput]:
    """The outputs the request asked for (all, in metadata order, when it named none)."""
    if request.outputs:
        result = []
        for wanted in request.outputs:
            if wanted.name not in outputs:
                raise InvalidInputError(
                    f"requested output {wanted.name!r} does not exist; outputs are: "
                    f"{', '.join(outputs)}"
                )
            out = output_from_array(wanted.name, outputs[wanted.name])
            out.parameters = dict(wanted.parameters)
            result.append(out)
        return result
    result = [output_from_array(s.name, outputs[s.name]) for s in specs if s.name in outputs]
    return result or [output_from_array(name, array) for name, array in outputs.items()]
