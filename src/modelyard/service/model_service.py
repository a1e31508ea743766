"""ModelService: every verb the front ends may call on the model table.

It is narrow on purpose: resolve a name to a version (the router is the one resolver),
run a request on it (:meth:`~modelyard.manager.router.Router.submit`: lease, hot-load,
the replica's scheduler), wait until a version is ready, the repository verbs, the
management verbs (pins, aliases, rollback) and typed read-only views
(:mod:`~modelyard.service.views`). The front ends never reach the manager's parts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, cast

import numpy as np

from modelyard.manager.fallback import (
    FallbackReason,
    allows_fallback,
    fallback_reason,
    tensor_mismatch,
)
from modelyard.manager.generation_service import GenerationService, context_length
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import DEFAULT_ALIAS, ModelEntry, ModelRecord
from modelyard.manager.router import Router, check_client_timeout
from modelyard.manager.stats import ManagerView
from modelyard.manager.versions import VersionController
from modelyard.runtimes.base import TensorSpec
from modelyard.service.views import InstanceInfo, ServedModel, ServedVersion

__all__ = [
    "FallbackReason",
    "ModelService",
    "allows_fallback",
    "check_client_timeout",
    "fallback_reason",
    "tensor_mismatch",
]

Prepare = Callable[[list[TensorSpec]], dict[str, np.ndarray]]
"""A request's inputs, checked against the input tensors of the instance it reached."""


class Submit(Protocol):
    """:meth:`ModelService.submit`'s signature."""

    async def __call__(
        self,
        version: ServedVersion,
        prepare: Prepare,
        priority: int | None,
        started: float,
        client_timeout_s: float | None,
    ) -> tuple[InstanceInfo, dict[str, np.ndarray]]: ...


class ModelService:
    """The model table's verbs for the front ends; see the module docstring."""

    def __init__(self, manager: ModelManager, versions: VersionController) -> None:
        self.manager = manager
        """The manager behind the verbs (for the app; no front end reads it)."""
        self.router = Router(manager)
        """The one resolver and the one way to a scheduler."""
        self.generation = GenerationService(manager, self.router)
        """The generation verbs: route through the router, lease a replica, its
        generation scheduler (``manager/generation_service.py``)."""
        self.clock = manager.clock
        self._versions = versions
        self._entries = manager.registry.entries
        self.resolve: Callable[[str, str | None], ServedVersion] = self.router.resolve
        """The version serving ``name`` at ``version`` (a version label, an alias, or the
        default); ModelNotFoundError when there is none."""
        self.submit = cast(Submit, self.router.submit)
        """Run a request on a version (see :meth:`Router.submit
        <modelyard.manager.router.Router.submit>`): ``(version, prepare, priority,
        started, client_timeout_s)`` → the instance's metadata and the outputs. The
        router's own method: no layer of its own on the request path."""

    def on_load_wait(self, listener: Callable[[ServedVersion, float], None]) -> None:
        """Call ``listener`` with the seconds each request waited for its model to load."""
        self.router.on_load_wait = listener

    # ------------------------------------------------------------------ reads

    def model(self, name: str) -> ServedModel:
        """The model called ``name``; ModelNotFoundError if unknown."""
        return self.manager.entry(name)

    def models(self) -> Mapping[str, ServedModel]:
        """Every configured model by name."""
        return self._entries

    def versions(self) -> Iterable[ServedVersion]:
        """Every known model version."""
        return self.manager.records()

    def missing_reason(self, model: ServedModel) -> str:
        """Why ``model`` has no version to serve."""
        return self.manager.missing_reason(cast(ModelEntry, model))

    def context_length(self, version: ServedVersion) -> int | None:
        """Tokens per sequence of a generative model: as its worker reported it once
        loaded, else from its file's header; None for other models."""
        return context_length(cast(ModelRecord, version))

    def stats(self) -> ManagerView:
        """The ``/v2/stats`` view: models, devices and recent events."""
        return ManagerView.of(self.manager)

    # ------------------------------------------------------------------ lifecycle

    async def ensure_ready(self, version: ServedVersion, *, deadline: float | None) -> None:
        """Return once ``version`` is READY, hot-loading it (``deadline``: on :attr:`clock`)."""
        await self.manager.ensure_ready(cast(ModelRecord, version), deadline=deadline)

    async def load(self, name: str, config: Mapping[str, Any] | None = None) -> None:
        """Load the model's default version (repository extension); see
        :meth:`ModelManager.load <modelyard.manager.manager.ModelManager.load>`."""
        await self.manager.load(name, config=config)

    async def unload(self, name: str) -> None:
        """Unload every loaded version of the model (repository extension)."""
        await self.manager.unload(name)

    # ------------------------------------------------------------------ management

    def pin(self, name: str, pinned: bool) -> str:
        """Pin (never evicted) or unpin every version of a model; its configured name."""
        return self.manager.pin(name, pinned).config.name

    def aliases(self, name: str) -> dict[str, dict[str, float]]:
        """Every alias of the model with its ``{version: weight}``."""
        return self._versions.aliases(name)

    async def set_alias(
        self, name: str, alias: str, targets: Mapping[str, float]
    ) -> dict[str, float]:
        """Point ``alias`` at ``targets`` (``{version: weight}``) once they are ready."""
        return await self._versions.set_alias(name, alias, targets)

    async def rollback(self, name: str, alias: str = DEFAULT_ALIAS) -> dict[str, float]:
        """Move ``alias`` back to its previous route."""
        return await self._versions.rollback(name, alias)
