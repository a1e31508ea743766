"""The live dashboard: a static page (no build step, nothing external) and its traffic feed.

``GET /dashboard`` serves ``static/dashboard.html`` with its script and style beside it.
The page polls ``GET /v2/stats`` (models, devices, events; see ``admin.py``) and
``GET /v2/stats/timeseries`` (per-second requests, p50/p99 latency, cold starts, the
model's errors and the clients' errors apart, and for generative models time to first
token, tokens and active sequences, per model version, from
:class:`~modelyard.observability.metrics.Metrics`) once a second.
"""

from __future__ import annotations

from importlib import resources
from typing import Protocol

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from modelyard.errors import InvalidInputError
from modelyard.frontends.dataplane import DataPlane
from modelyard.frontends.http.bodies import json_response
from modelyard.frontends.http.errors import guarded
from modelyard.observability.metrics import Metrics

_STATIC = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
# The page may load only what this server serves: no CDN, no inline script.
_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "cache-control": "no-cache",
}
DEFAULT_WINDOW_S = 300


class _HasMetrics(Protocol):
    metrics: Metrics
    dataplane: DataPlane


def _static(name: str) -> bytes:
    return (resources.files("modelyard.frontends.http") / "static" / name).read_bytes()


def dashboard_routes(app: _HasMetrics) -> list[BaseRoute]:
    """``GET /`` (a redirect to the dashboard), ``GET /dashboard``, its assets under
    ``/dashboard/``, and ``GET /v2/stats/timeseries``."""
    metrics = app.metrics
    page = _static("dashboard.html")
    assets = {name: (_static(name), kind) for name, kind in _STATIC.items()}

    async def dashboard(request: Request) -> Response:
        return Response(page, headers={**_HEADERS, "content-type": "text/html; charset=utf-8"})

    async def asset(request: Request) -> Response:
        found = assets.get(request.path_params["name"])
        if found is None:
            return json_response({"error": f"no dashboard asset {request.url.path}"}, 404)
        body, kind = found
        return Response(body, headers={**_HEADERS, "content-type": kind})

    async def timeseries(request: Request) -> Response:
        raw = request.query_params.get("window_s", str(DEFAULT_WINDOW_S))
        try:
            window_s = int(raw)
        except ValueError:
            raise InvalidInputError(
                f"window_s must be a whole number of seconds, not {raw!r}"
            ) from None
        if window_s < 1:
            raise InvalidInputError(f"window_s must be at least 1, not {window_s}")
        feed = metrics.recent_traffic(window_s)
        generation = app.dataplane.generation
        for model in feed["models"]:
            gate = generation.generation_gate(model["name"], model["version"])
            # Streams holding a sequence slot now (generative models only).
            model["active_sequences"] = None if gate is None else gate.running
        return json_response(feed)

    async def home(request: Request) -> Response:
        # A browser pointed at the server's address finds the dashboard.
        return RedirectResponse("/dashboard", status_code=302)

    return [
        Route("/", home, methods=["GET"]),
        Route("/dashboard", guarded(dashboard), methods=["GET"]),
        Route("/dashboard/{name}", guarded(asset), methods=["GET"]),
        Route("/v2/stats/timeseries", guarded(timeseries), methods=["GET"]),
    ]
