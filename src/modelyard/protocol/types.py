"""Protocol-neutral request and response objects shared by REST and gRPC.

These are plain slotted dataclasses, not pydantic models: tensor data is already a
numpy array by the time one is built, and the hot path must not validate per element.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from modelyard.errors import InvalidInputError

TIMEOUT_HEADER = "x-modelyard-timeout-ms"
"""REST header, or gRPC metadata key, with the client's own deadline in milliseconds."""


def header_timeout_s(value: str | bytes) -> float:
    """Seconds from an ``X-Modelyard-Timeout-Ms`` value; InvalidInputError unless positive."""
    try:
        ms = float(value)
    except ValueError:
        ms = math.nan
    if not math.isfinite(ms) or ms <= 0:
        raise InvalidInputError("X-Modelyard-Timeout-Ms must be a positive number of milliseconds")
    return ms / 1000.0


def check_client_timeout(timeout_s: float | None) -> float | None:
    """A request's own timeout, refused unless positive (None: the client set none)."""
    if timeout_s is not None and timeout_s <= 0:
        raise InvalidInputError("'timeout' must be positive")
    return timeout_s


def priority_param(value: object, what: str = "parameter 'priority'") -> int | None:
    """A request's ``priority`` (1 is the highest; None: not given), as every route reads it.

    ``0`` means the model's default priority, as in Triton (its clients send it when no
    priority was set). REST infer, ``/predict`` and gRPC share this check, so a value one
    route refuses (``true``, ``-1``, ``"high"``) is refused by all of them with the same
    words.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(
            f"{what} must be a positive integer (1 is the highest; 0: the default)"
        )
    return value or None


def timeout_param_s(value: object, what: str = "parameter 'timeout'") -> float | None:
    """Seconds from a request's ``timeout`` in microseconds (None: not given), as every
    route reads it; ``0`` means no timeout of the client's own (the model's), as in
    Triton. InvalidInputError unless a non-negative number (never a boolean)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise InvalidInputError(
            f"{what} must be a positive number of microseconds (0: the default)"
        )
    return float(value) / 1e6 if value else None


def earliest(timeout_s: float | None, other_s: float | None) -> float | None:
    """The shorter of two optional client timeouts (None: not given)."""
    if timeout_s is None:
        return other_s
    if other_s is None:
        return timeout_s
    return min(timeout_s, other_s)


@dataclass(slots=True)
class InferInput:
    """One decoded input tensor."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    array: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with its parameters (e.g. ``binary_data``)."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    """A decoded inference request, whichever transport it came on."""

    model_name: str
    model_version: str | None
    inputs: list[InferInput]
    id: str | None = None
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    priority: int | None = None
    """1 is the highest; None means the model's own priority."""
    timeout_s: float | None = None
    """The client's own deadline budget: caps the request's total time, a load included,
    and may only shorten the model's ``timeout_s``."""
    raw_input: bytes | None = None
    """A raw binary request's body (``Inference-Header-Content-Length: 0``): the data of
    the model's single input, whose name, datatype and shape come from the model's
    metadata (:func:`modelyard.frontends.tensor_checks.raw_input_array`); ``inputs`` is
    then empty."""


@dataclass(slots=True)
class InferOutput:
    """One output tensor of a response."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    array: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferResponse:
    """The answer to an :class:`InferRequest`."""

    model_name: str
    model_version: str
    outputs: list[InferOutput]
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    """Name, datatype and shape (``-1`` = any size) of a model's input or output."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False
    """A request may leave this input out (an ONNX input with a default value)."""

    def to_dict(self) -> dict[str, object]:
        """The protocol's JSON form: ``{"name", "datatype", "shape"}``."""
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """The protocol's model metadata; each front end writes it in its own form."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...] = ()
    """Known once the model has loaded (empty before)."""
    outputs: tuple[TensorMetadata, ...] = ()
    generative: bool = False
    """True for a text-generation model (``llama_cpp``, ``transformers`` runtimes): it is
    served by :meth:`~modelyard.frontends.dataplane.DataPlane.generate`."""
    context_length: int | None = None
    """Tokens of context one sequence may hold (prompt plus generated) for a generative
    model: the configured ``n_ctx``, else the model's trained length; None otherwise."""

    def to_dict(self) -> dict[str, object]:
        """The REST form: ``{"name", "versions", "platform", "inputs", "outputs"}``
        (generative models add ``"generative": true`` and ``"context_length"``)."""
        doc: dict[str, object] = {
            "name": self.name,
            "versions": list(self.versions),
            "platform": self.platform,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }
        if self.generative:
            doc["generative"] = True
            doc["context_length"] = self.context_length
        return doc


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    """The server's name, version and protocol extensions."""

    name: str
    version: str
    extensions: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        """The REST form: ``{"name", "version", "extensions"}``."""
        return {"name": self.name, "version": self.version, "extensions": list(self.extensions)}
