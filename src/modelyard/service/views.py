"""Typed read-only views of the model table, for the front ends.

A view is the manager's own object read through a :class:`~typing.Protocol` that lists
only what a front end may read: the request path builds no copy. Nothing here writes;
the manager's lifecycle (the loader) alone changes a version's state. The value types
re-exported here (keys, states, tensor metadata, counters) are immutable or counters the
data plane feeds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from modelyard.config.model_config import ModelConfig
from modelyard.manager.infer_stats import InferStats
from modelyard.manager.records import DEFAULT_ALIAS, ModelKey
from modelyard.manager.states import ModelState
from modelyard.manager.stats import ManagerView
from modelyard.workers.instance import GenerationCounters, InstanceInfo

__all__ = [
    "DEFAULT_ALIAS",
    "AliasView",
    "GenerationCounters",
    "InferStats",
    "InstanceInfo",
    "ManagerView",
    "ModelKey",
    "ModelState",
    "ServedModel",
    "ServedVersion",
]


class ServedVersion(Protocol):
    """One model version, as a front end reads it."""

    @property
    def key(self) -> ModelKey:
        """``(name, version)``."""
        ...

    @property
    def config(self) -> ModelConfig:
        """The model's configuration."""
        ...

    @property
    def path(self) -> Path:
        """The version's folder (class labels are read from it)."""
        ...

    @property
    def state(self) -> ModelState:
        """Where the version is in its lifecycle."""
        ...

    @property
    def reason(self) -> str:
        """Why it is in that state (a failure's message; may name paths)."""
        ...

    @property
    def info(self) -> InstanceInfo | None:
        """The loaded instance's tensors and details (None until loaded once)."""
        ...

    @property
    def is_ready(self) -> bool:
        """True when requests can be served now."""
        ...

    @property
    def infer_stats(self) -> InferStats:
        """Triton's statistics of this version (the data plane counts its requests)."""
        ...


class AliasView(Protocol):
    """Where an alias sends traffic."""

    @property
    def versions(self) -> Sequence[str]:
        """The versions the alias can pick."""
        ...


class ServedModel(Protocol):
    """One configured model, as a front end reads it."""

    @property
    def config(self) -> ModelConfig:
        """The model's configuration."""
        ...

    @property
    def versions(self) -> Mapping[str, ServedVersion]:
        """Its known versions by version label."""
        ...

    @property
    def aliases(self) -> Mapping[str, AliasView]:
        """Its aliases (``default``, ``stable``, ...) by name."""
        ...
