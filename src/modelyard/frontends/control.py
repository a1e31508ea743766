"""The control plane: management verbs beside the protocol, whatever the transport.

The HTTP admin routes (``frontends/http/admin.py``) call these methods, as the protocol
routes call :class:`~modelyard.frontends.dataplane.DataPlane`; both reach the model table
through :class:`~modelyard.service.model_service.ModelService` alone (import-linter
contracts keep the front ends off ``modelyard.manager``). Names are checked here, so
every transport checks them alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from modelyard.observability.health import HealthView
from modelyard.protocol.names import check_model_name, check_version_name
from modelyard.service.model_service import ModelService
from modelyard.service.views import DEFAULT_ALIAS, ManagerView

__all__ = ["DEFAULT_ALIAS", "ControlPlane"]


class ControlPlane:
    """Stats, health details, pins, aliases and rollback over the model service."""

    def __init__(self, service: ModelService, health_view: Callable[[], HealthView]) -> None:
        self._service = service
        self._health_view = health_view

    def stats(self) -> ManagerView:
        """The ``/v2/stats`` view: models, devices and recent events (typed; the route
        converts it to JSON)."""
        return self._service.stats()

    def health_details(self) -> HealthView:
        """Why the server and each model are (not) ready (typed; the route converts it)."""
        return self._health_view()

    def set_pinned(self, name: str, pinned: bool) -> str:
        """Pin (never evicted) or unpin every version of a model, later ones included; its
        configured name."""
        return self._service.pin(check_model_name(name), pinned)

    def aliases(self, name: str) -> dict[str, dict[str, float]]:
        """Every alias of the model with its ``{version: weight}``."""
        return self._service.aliases(check_model_name(name))

    async def set_alias(
        self, name: str, alias: str, targets: Mapping[str, float]
    ) -> dict[str, float]:
        """Point ``alias`` at ``targets`` (``{version: weight}``) once they are ready."""
        check_model_name(name)
        check_version_name(alias)
        return await self._service.set_alias(name, alias, targets)

    async def rollback(self, name: str, alias: str = DEFAULT_ALIAS) -> dict[str, float]:
        """Move ``alias`` back to its previous route."""
        return await self._service.rollback(check_model_name(name), alias)
