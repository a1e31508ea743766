"""Management routes beside the protocol: stats, health details, pins, aliases, rollback.

Each handler parses the request and calls the control plane (``frontends/control.py``).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from modelyard.errors import InvalidInputError
from modelyard.frontends.control import DEFAULT_ALIAS, ControlPlane
from modelyard.frontends.http.bodies import json_response, read_json
from modelyard.frontends.http.errors import guarded
from modelyard.protocol.names import check_model_name, check_version_name


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


def admin_routes(control: ControlPlane) -> list[BaseRoute]:
    """Stats, pin/unpin, aliases (blue-green switch) and rollback."""

    async def health_details(request: Request) -> Response:
        view = control.health_details()
        return json_response(view.to_json(), 200 if view.ready else 503)

    async def list_aliases(request: Request) -> Response:
        name = request.path_params["model"]
        aliases = control.aliases(name)
        return json_response({"name": name, "aliases": aliases})

    async def set_alias(request: Request) -> Response:
        p = request.path_params
        # The path is checked before the body is read, so a bad name is what is reported.
        check_model_name(p["model"])
        check_version_name(p["alias"])
        targets = _targets(await read_json(request))
        route = await control.set_alias(p["model"], p["alias"], targets)
        return json_response({"name": p["model"], "alias": p["alias"], "versions": route})

    async def rollback(request: Request) -> Response:
        name = check_model_name(request.path_params["model"])
        doc = await read_json(request)
        alias = str(doc.get("alias", DEFAULT_ALIAS))
        route = await control.rollback(name, alias)
        return json_response({"name": name, "alias": alias, "versions": route})

    async def stats(request: Request) -> Response:
        return json_response(control.stats().stats_json())

    async def pin(request: Request) -> Response:
        name = control.set_pinned(request.path_params["model"], True)
        return json_response({"name": name, "pinned": True})

    async def unpin(request: Request) -> Response:
        name = control.set_pinned(request.path_params["model"], False)
        return json_response({"name": name, "pinned": False})

    return [
        Route("/v2/stats", guarded(stats), methods=["GET"]),
        Route("/v2/health/details", guarded(health_details), methods=["GET"]),
        Route("/v2/repository/models/{model}/pin", guarded(pin), methods=["POST"]),
        Route("/v2/repository/models/{model}/unpin", guarded(unpin), methods=["POST"]),
        Route("/v2/repository/models/{model}/aliases", guarded(list_aliases), methods=["GET"]),
        Route(
            "/v2/repository/models/{model}/aliases/{alias}",
            guarded(set_alias),
            methods=["POST", "PUT"],
        ),
        Route("/v2/repository/models/{model}/rollback", guarded(rollback), methods=["POST"]),
    ]
