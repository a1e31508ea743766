"""Management routes beside the protocol: stats view, pin/unpin."""

from __future__ import annotations

from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from modelyard.errors import InvalidInputError
from modelyard.frontends.http.app import _guard, json_response
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import DEFAULT_ALIAS
from modelyard.manager.stats import manager_stats
from modelyard.manager.versions import VersionController
from modelyard.protocol.documents import json_object
from modelyard.protocol.names import check_model_name, check_version_name


class _HasManager(Protocol):
    manager: ModelManager
    versions: VersionController

    def health_details(self) -> dict[str, Any]: ...


async def _optional_json(request: Request) -> dict[str, Any]:
    return json_object(await request.body(), allow_empty=True)


def _targets(doc: dict[str, Any]) -> dict[str, float]:
    if "version" in doc:
        return {str(doc["version"]): 1.0}
    versions = doc.get("versions")
    if not isinstance(versions, dict) or not versions:
        raise InvalidInputError('body must be {"version": "2"} or {"versions": {"1": 90, "2": 10}}')
    try:
        return {str(v): float(w) for v, w in versions.items()}
    except (TypeError, ValueError):
        raise InvalidInputError("alias weights must be numbers") from None


def admin_routes(app: _HasManager) -> list[BaseRoute]:
    """Stats, pin/unpin, aliases (blue-green switch) and rollback."""
    manager = app.manager
    versions = app.versions

    async def health_details(request: Request) -> Response:
        details = app.health_details()
        return json_response(details, 200 if details["ready"] else 503)

    async def list_aliases(request: Request) -> Response:
        name = check_model_name(request.path_params["model"])
        return json_response({"name": name, "aliases": versions.aliases(name)})

    async def set_alias(request: Request) -> Response:
        p = request.path_params
        check_model_name(p["model"])
        check_version_name(p["alias"])
        route = await versions.set_alias(
            p["model"], p["alias"], _targets(await _optional_json(request))
        )
        return json_response({"name": p["model"], "alias": p["alias"], "versions": route})

    async def rollback(request: Request) -> Response:
        name = check_model_name(request.path_params["model"])
        doc = await _optional_json(request)
        alias = str(doc.get("alias", DEFAULT_ALIAS))
        route = await versions.rollback(name, alias)
        return json_response({"name": name, "alias": alias, "versions": route})

    async def stats(request: Request) -> Response:
        return json_response(manager_stats(manager))

    async def pin(request: Request) -> Response:
        return _set_pinned(request, True)

    async def unpin(request: Request) -> Response:
        return _set_pinned(request, False)

    def _set_pinned(request: Request, pinned: bool) -> Response:
        entry = manager.pin(check_model_name(request.path_params["model"]), pinned)
        body: dict[str, Any] = {"name": entry.config.name, "pinned": pinned}
        return json_response(body)

    return [
        Route("/v2/stats", _guard(stats), methods=["GET"]),
        Route("/v2/health/details", _guard(health_details), methods=["GET"]),
        Route("/v2/repository/models/{model}/pin", _guard(pin), methods=["POST"]),
        Route("/v2/repository/models/{model}/unpin", _guard(unpin), methods=["POST"]),
        Route("/v2/repository/models/{model}/aliases", _guard(list_aliases), methods=["GET"]),
        Route(
            "/v2/repository/models/{model}/aliases/{alias}",
            _guard(set_alias),
            methods=["POST", "PUT"],
        ),
        Route("/v2/repository/models/{model}/rollback", _guard(rollback), methods=["POST"]),
    ]
