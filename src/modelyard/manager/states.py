"""Model lifecycle states and the transitions allowed between them."""

from __future__ import annotations

from enum import StrEnum


class ModelState(StrEnum):
    """Where one model version is in its lifecycle (shown in the repository index)."""

    UNLOADED = "UNLOADED"
    LOADING = "LOADING"
    WARMING = "WARMING"
    READY = "READY"
    DRAINING = "DRAINING"
    UNLOADING = "UNLOADING"
    FAILED = "FAILED"


_ALLOWED: dict[ModelState, frozenset[ModelState]] = {
    ModelState.UNLOADED: frozenset({ModelState.LOADING, ModelState.FAILED}),
    ModelState.FAILED: frozenset({ModelState.LOADING, ModelState.UNLOADED}),
    ModelState.LOADING: frozenset({ModelState.WARMING, ModelState.FAILED, ModelState.UNLOADING}),
    ModelState.WARMING: frozenset({ModelState.READY, ModelState.FAILED, ModelState.UNLOADING}),
    ModelState.READY: frozenset(
        {ModelState.DRAINING, ModelState.UNLOADING, ModelState.FAILED, ModelState.LOADING}
    ),
    ModelState.DRAINING: frozenset({ModelState.UNLOADING, ModelState.READY, ModelState.FAILED}),
    ModelState.UNLOADING: frozenset({ModelState.UNLOADED, ModelState.FAILED}),
}

RESIDENT: frozenset[ModelState] = frozenset(
    {ModelState.LOADING, ModelState.WARMING, ModelState.READY, ModelState.DRAINING}
)
"""States whose reservation counts against the device budget."""


def can_transition(src: ModelState, dst: ModelState) -> bool:
    """True when ``src → dst`` is a legal lifecycle step."""
    return dst in _ALLOWED[src]
