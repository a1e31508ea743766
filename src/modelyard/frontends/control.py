"""The control plane: management verbs beside the protocol, whatever the transport.

The HTTP admin routes (``frontends/http/admin.py``) call these methods and never the
manager itself, as the protocol routes call :class:`~modelyard.frontends.dataplane.DataPlane`:
an import-linter contract keeps ``frontends.http`` and ``frontends.grpc`` off
``modelyard.manager``. Names are checked here, so every transport checks them alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from modelyard.manager.manager import ModelManager
from modelyard.manager.records import DEFAULT_ALIAS
from modelyard.manager.stats import ManagerView
from modelyard.manager.versions import VersionController
from modelyard.observability.health import HealthView
from modelyard.protocol.names import check_model_name, check_version_name

__all__ = ["DEFAULT_ALIAS", "ControlPlane"]


class ControlPlane:
    """Stats, health details, pins, aliases and rollback over one manager."""

    def __init__(
        self,
        manager: ModelManager,
        versions: VersionController,
        health_view: Callable[[], HealthView],
    ) -> None:
        self._manager = manager
        self._versions = versions
        self._health_view = health_view

    def stats(self) -> ManagerView:
        """The ``/v2/stats`` view: models, devices and recent events (typed; the route
        converts it to JSON)."""
        return ManagerView.of(self._manager)

    def health_details(self) -> HealthView:
        """Why the server and each model are (not) ready (typed; the route converts it)."""
        return self._health_view()

    def set_pinned(self, name: str, pinned: bool) -> str:
        """Pin (never evicted) or unpin every version of a model, later ones included; its
        configured name."""
        return self._manager.pin(check_model_name(name), pinned).config.name

    def aliases(self, name: str) -> dict[str, dict[str, float]]:
        """Every alias of the model with its ``{version: weight}``."""
        return self._versions.aliases(check_model_name(name))

    async def set_alias(
        self, name: str, alias: str, targets: Mapping[str, float]
    ) -> dict[str, float]:
        """Point ``alias`` at ``targets`` (``{version: weight}``) once they are ready."""
        check_model_name(name)
        check_version_name(alias)
        return await self._versions.set_alias(name, alias, targets)

    async def rollback(self, name: str, alias: str = DEFAULT_ALIAS) -> dict[str, float]:
        """Move ``alias`` back to its previous route."""
        return await self._versions.rollback(check_model_name(name), alias)
