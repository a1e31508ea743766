"""The ``/predict`` document ⇄ protocol objects, whatever transport carries it.

``{"model", "version"?, "inputs": {name: nested list}} | "text"``, with optional
``"priority"`` (1 is the highest) and ``"timeout"`` (µs), read as the infer route
reads them. Inputs are typed by the model's metadata, so the client sends plain lists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelyard.errors import InvalidInputError
from modelyard.protocol.json_tensors import array_from_nested, json_nested
from modelyard.protocol.tensors import json_data
from modelyard.protocol.types import (
    InferInput,
    InferResponse,
    TensorMetadata,
    priority_param,
    timeout_param_s,
)


@dataclass(frozen=True, slots=True)
class PredictCall:
    """What a ``/predict`` document asks for, before its inputs are typed."""

    model: str
    version: str | None
    priority: int | None
    timeout_s: float | None
    """The document's own ``timeout`` (None: not given)."""


def predict_call(doc: Mapping[str, Any]) -> PredictCall:
    """The model, version and schedule policy of a ``/predict`` document."""
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidInputError("'model' must be a non-empty string")
    version = doc.get("version")
    return PredictCall(
        model=model,
        version=None if version is None else str(version),
        priority=priority_param(doc.get("priority"), "'priority'"),
        timeout_s=timeout_param_s(doc.get("timeout"), "'timeout'"),
    )


def predict_inputs(
    doc: Mapping[str, Any], model: str, specs: Sequence[TensorMetadata]
) -> list[InferInput]:
    """The document's inputs typed by the model's input metadata; a single example is
    promoted to a batch of one when the model wants a batch."""
    raw = doc.get("inputs")
    if raw is None and "text" in doc:
        if len(specs) != 1 or specs[0].datatype != "BYTES":
            raise InvalidInputError(
                f"'text' needs a model with one BYTES input; {model!r} has "
                f"{', '.join(s.name + ':' + s.datatype for s in specs)}"
            )
        text = doc["text"]
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise InvalidInputError("'text' must be a string or a list of strings")
        raw = {specs[0].name: texts}
    if not isinstance(raw, dict) or not raw:
        raise InvalidInputError("'inputs' must be an object of input name → nested list")
    by_name = {s.name: s for s in specs}
    inputs = []
    for name, value in raw.items():
        spec = by_name.get(name)
        if spec is None:
            raise InvalidInputError(
                f"model {model!r} has no input {name!r}; inputs are: {', '.join(by_name)}"
            )
        arr = array_from_nested(name, spec.datatype, value)
        if arr.ndim == len(spec.shape) - 1:
            arr = arr[np.newaxis, ...]
        inputs.append(InferInput(name, spec.datatype, tuple(arr.shape), arr))
    return inputs


def predict_answer(response: InferResponse) -> dict[str, object]:
    """``{"model", "version", "outputs": {name: nested list}}``, plus ``served_by`` and
    ``fallback_reason`` when a fallback model answered."""
    answer: dict[str, object] = {
        "model": response.model_name,
        "version": response.model_version,
        "outputs": {
            # BYTES outputs may hold str or bytes (runtimes differ): json_data handles
            # both, as the v2 infer route does.
            o.name: json_data(o) if o.datatype == "BYTES" else json_nested(o.array)
            for o in response.outputs
        },
    }
    for key in ("served_by", "fallback_reason"):
        if key in response.parameters:
            answer[key] = response.parameters[key]
    return answer
