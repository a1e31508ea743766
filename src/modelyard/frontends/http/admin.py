"""Management routes beside the protocol: stats view, pin/unpin."""

from __future__ import annotations

from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from modelyard.frontends.http.app import _guard, json_response
from modelyard.manager.manager import ModelManager
from modelyard.manager.stats import manager_stats


class _HasManager(Protocol):
    manager: ModelManager


def admin_routes(app: _HasManager) -> list[BaseRoute]:
    """``GET /v2/stats``, ``POST /v2/repository/models/{m}/pin`` and ``/unpin``."""
    manager = app.manager

    async def stats(request: Request) -> Response:
        return json_response(manager_stats(manager))

    async def pin(request: Request) -> Response:
        return _set_pinned(request, True)

    async def unpin(request: Request) -> Response:
        return _set_pinned(request, False)

    def _set_pinned(request: Request, pinned: bool) -> Response:
        entry = manager.entry(request.path_params["model"])
        for record in entry.versions.values():
            record.pinned = pinned
        body: dict[str, Any] = {"name": entry.config.name, "pinned": pinned}
        return json_response(body)

    return [
        Route("/v2/stats", _guard(stats), methods=["GET"]),
        Route("/v2/repository/models/{model}/pin", _guard(pin), methods=["POST"]),
        Route("/v2/repository/models/{model}/unpin", _guard(unpin), methods=["POST"]),
    ]
