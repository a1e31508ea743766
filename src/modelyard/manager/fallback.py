"""Fallback chains: which refusals send a request on to a model's ``fallback`` list.

A model may name fallbacks (``fallback: [digits-logreg]``) that answer in its place when
it cannot answer in time. Only refusals of a request that never ran qualify, so a
retry on another model is always safe:

========================  ==========================================================
reason                    raised by
========================  ==========================================================
``queue_full``            ``OverloadedError``: the model's queue is full
``deadline``              ``DeadlineUnreachableError``: early rejection
``shed``                  ``LoadShedError``: shed to protect a more important class
``circuit_open``          ``CircuitOpenError``: the breaker is open or probing
``unavailable``           ``MemoryBudgetError``, ``ModelLoadError``,
                          ``ModelNotReadyError``: it cannot be loaded (or is FAILED)
========================  ==========================================================

Only the requested model's chain is followed (a fallback's own fallbacks are not), so
chains cannot loop. A fallback must take the same inputs and give the same outputs
(names and datatypes); :func:`tensor_mismatch` says how two models differ, checked at
start for models loaded then and again before each fallback. The data plane routes;
this module only decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from modelyard.errors import (
    CircuitOpenError,
    DeadlineUnreachableError,
    InvalidInputError,
    LoadShedError,
    MemoryBudgetError,
    ModelLoadError,
    ModelNotReadyError,
    OverloadedError,
    ServerError,
)
from modelyard.manager.manager import ModelManager
from modelyard.workers.instance import InstanceInfo

__all__ = [
    "FALLBACK_PARAMETER",
    "FallbackReason",
    "allows_fallback",
    "chain_problems",
    "fallback_reason",
    "tensor_mismatch",
]

FallbackReason = Literal["queue_full", "deadline", "shed", "circuit_open", "unavailable"]

FALLBACK_PARAMETER = "fallback"
"""Request parameter: ``false`` forbids answering from a fallback model."""


def fallback_reason(error: ServerError) -> FallbackReason | None:
    """Why ``error`` sends its request to the next fallback; None: it does not."""
    if isinstance(error, DeadlineUnreachableError):
        return "deadline"
    if isinstance(error, LoadShedError):
        return "shed"
    if isinstance(error, OverloadedError):
        return "queue_full"
    if isinstance(error, CircuitOpenError):
        return "circuit_open"
    if isinstance(error, MemoryBudgetError | ModelLoadError | ModelNotReadyError):
        return "unavailable"
    return None


def allows_fallback(parameters: Mapping[str, Any]) -> bool:
    """False when the request's ``fallback`` parameter forbids it; a non-boolean is refused."""
    value = parameters.get(FALLBACK_PARAMETER, True)
    if not isinstance(value, bool):
        raise InvalidInputError(
            f"parameter {FALLBACK_PARAMETER!r} must be true or false, got {value!r}"
        )
    return value


def tensor_mismatch(model: InstanceInfo, fallback: InstanceInfo) -> str | None:
    """How ``fallback``'s input and output names and datatypes differ from ``model``'s."""
    for kind, mine, theirs in (
        ("inputs", model.inputs, fallback.inputs),
        ("outputs", model.outputs, fallback.outputs),
    ):
        want = {spec.name: spec.datatype for spec in mine}
        got = {spec.name: spec.datatype for spec in theirs}
        if want != got:
            return f"{kind} differ: {_describe(want)} vs {_describe(got)}"
    return None


def _describe(tensors: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{name}: {dtype}" for name, dtype in sorted(tensors.items())) + "}"


def chain_problems(manager: ModelManager) -> list[str]:
    """One line per fallback whose tensors differ from its model's, among loaded models."""
    problems: list[str] = []
    for entry in manager.entries.values():
        if not entry.config.fallback or not entry.versions:
            continue
        info = _loaded_info(manager, entry.config.name)
        if info is None:
            continue
        for name in entry.config.fallback:
            other_info = _loaded_info(manager, name)
            if other_info is None:
                continue
            mismatch = tensor_mismatch(info, other_info)
            if mismatch is not None:
                problems.append(
                    f"model {entry.config.name!r}: fallback {name!r} does not take the same "
                    f"tensors ({mismatch})"
                )
    return problems


def _loaded_info(manager: ModelManager, name: str) -> InstanceInfo | None:
    """The tensors of ``name``'s default version when it is loaded; else None."""
    entry = manager.entries.get(name)
    if entry is None or not entry.versions:
        return None
    try:
        return manager.resolve(name, None).info
    except ServerError:
        return None
