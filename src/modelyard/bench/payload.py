"""Request payloads: one per model, built once from its metadata (or a file) and reused.

The load generator sends the same pre-encoded bytes for every request to a model, so the
client's per-request cost does not include building or serialising tensors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from modelyard.bench.errors import BenchConfigError, TargetError
from modelyard.protocol.datatypes import DATATYPES as PROTOCOL_DATATYPES
from modelyard.protocol.datatypes import numpy_dtype

MAX_ELEMENTS = 16 * 1024 * 1024
"""Largest tensor the payload factory will generate; protects the client's memory."""

_INTEGER_TYPES = frozenset(d for d in PROTOCOL_DATATYPES if numpy_dtype(d).kind in "iu")
_FLOAT_TYPES = frozenset(d for d in PROTOCOL_DATATYPES if numpy_dtype(d).kind == "f") | {"BF16"}
"""The protocol's float types, and BF16, which other v2 servers (Triton) define."""
DATATYPES = PROTOCOL_DATATYPES | _FLOAT_TYPES
"""Open Inference Protocol tensor datatypes the payload factory can fill."""


@dataclass(frozen=True)
class TensorSpec:
    """An input as the model's metadata describes it; ``-1`` marks a dynamic dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelMetadata:
    """The part of ``GET /v2/models/{name}`` the benchmark needs."""

    name: str
    inputs: tuple[TensorSpec, ...]

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ModelMetadata:
        """Read a v2 metadata response; raises :class:`TargetError` when it is malformed."""
        name = body.get("name")
        inputs = body.get("inputs")
        if not isinstance(name, str) or not isinstance(inputs, list):
            raise TargetError(f"model metadata lacks 'name' or 'inputs': {dict(body)!r:.200}")
        specs = []
        for item in inputs:
            try:
                specs.append(
                    TensorSpec(
                        name=str(item["name"]),
                        datatype=str(item["datatype"]).upper(),
                        shape=tuple(int(dim) for dim in item["shape"]),
                    )
                )
            except (KeyError, TypeError, ValueError) as exc:
                raise TargetError(f"model {name}: malformed input metadata {item!r:.200}") from exc
        return cls(name=name, inputs=tuple(specs))


@dataclass(frozen=True)
class InferInput:
    """One input tensor of a request; ``data`` is flat, row-major."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: list[Any]


@dataclass(frozen=True)
class Payload:
    """Everything sent to one model: the tensors and their JSON encoding, made once."""

    model: str
    inputs: tuple[InferInput, ...]
    json_body: bytes
    """The ``POST /v2/models/{model}/infer`` body, ready to send."""


def random_payload(metadata: ModelMetadata, *, seed: int = 0) -> Payload:
    """Build a request with random data of each input's datatype and shape (``-1`` → 1)."""
    if not metadata.inputs:
        raise TargetError(f"model {metadata.name} declares no inputs; pass --payload for it")
    rng = np.random.default_rng(seed)
    inputs = tuple(_random_input(metadata.name, spec, rng) for spec in metadata.inputs)
    return Payload(model=metadata.name, inputs=inputs, json_body=encode_json(inputs))


def payload_from_file(model: str, path: Path | str) -> Payload:
    """Load a user-written v2 JSON request body; it is sent byte for byte as written."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BenchConfigError(f"cannot read payload {path}: {exc.strerror or exc}") from exc
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BenchConfigError(f"payload {path} is not JSON: {exc}") from exc
    items = body.get("inputs") if isinstance(body, dict) else None
    if not isinstance(items, list) or not items:
        raise BenchConfigError(f"payload {path} needs a non-empty 'inputs' list")
    inputs = []
    for item in items:
        try:
            inputs.append(
                InferInput(
                    name=str(item["name"]),
                    datatype=str(item["datatype"]).upper(),
                    shape=tuple(int(dim) for dim in item["shape"]),
                    data=_flatten(item["data"]),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BenchConfigError(f"payload {path}: malformed input {item!r:.200}") from exc
    return Payload(model=model, inputs=tuple(inputs), json_body=raw)


def encode_json(inputs: tuple[InferInput, ...]) -> bytes:
    """The v2 JSON request body for ``inputs``."""
    body = {
        "inputs": [
            {"name": i.name, "shape": list(i.shape), "datatype": i.datatype, "data": i.data}
            for i in inputs
        ]
    }
    return orjson.dumps(body)


def _random_input(model: str, spec: TensorSpec, rng: np.random.Generator) -> InferInput:
    shape = tuple(1 if dim < 0 else dim for dim in spec.shape)
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise TargetError(
            f"model {model} input {spec.name} has {count} elements (shape {spec.shape}); "
            f"over {MAX_ELEMENTS}, pass --payload for it"
        )
    data: list[Any]
    if spec.datatype in _FLOAT_TYPES:
        # Four decimals keep the JSON short; every such value is exact enough for any float type.
        data = np.round(rng.random(count), 4).tolist()
    elif spec.datatype in _INTEGER_TYPES:
        data = rng.integers(0, 100, count).tolist()
    elif spec.datatype == "BOOL":
        data = (rng.random(count) < 0.5).tolist()
    elif spec.datatype == "BYTES":
        data = [f"s{value}" for value in rng.integers(0, 1_000_000, count).tolist()]
    else:
        raise TargetError(
            f"model {model} input {spec.name} has datatype {spec.datatype!r}, which the payload "
            f"factory cannot fill; pass --payload for it"
        )
    return InferInput(name=spec.name, datatype=spec.datatype, shape=shape, data=data)


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    if not any(isinstance(item, list) for item in data):
        return data
    flat: list[Any] = []
    for item in data:
        flat.extend(_flatten(item))
    return flat
