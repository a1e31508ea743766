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
