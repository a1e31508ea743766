"""The REST front end: Open Inference Protocol routes plus ``/predict``; nothing else.

Each handler decodes, calls the data plane, encodes. Every ServerError becomes the
protocol's ``{"error": ...}`` body through one handler; anything unforeseen becomes
a 500 with its message, and the server keeps serving.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp

from modelyard.config.limits import LimitsConfig
from modelyard.errors import InvalidInputError, ModelNotFoundError, NotSupportedError
from modelyard.frontends.auth import Authorizer
from modelyard.frontends.dataplane import DataPlane
from modelyard.frontends.http.auth import AuthLayer
from modelyard.frontends.http.bodies import json_response, read_json
from modelyard.frontends.http.errors import guarded
from modelyard.frontends.http.fastpath import InferFastPath, InferHandler
from modelyard.frontends.http.generate import GenerateApi, mark_brownout
from modelyard.frontends.http.limits import RouteLimits
from modelyard.frontends.http.openai import OpenAIApi
from modelyard.frontends.http.openai_errors import error_response_at
from modelyard.frontends.http.openapi import openapi_routes
from modelyard.protocol.load_parameters import check_load_parameters
from modelyard.protocol.types import TIMEOUT_HEADER


class RestApi:
    """Route handlers bound to one data plane."""

    def __init__(self, dataplane: DataPlane, max_request_bytes: int) -> None:
        self.dp = dataplane
        self.max_request_bytes = max_request_bytes
        self.infer = InferHandler(dataplane, max_request_bytes)
        """``POST …/infer``: the fast path's handler, also behind the Starlette routes."""
        self.generate = GenerateApi(dataplane, max_request_bytes)
        """``POST …/generate`` and ``…/generate_stream``: the generate extension."""

    async def _json_body(self, request: Request, *, allow_empty: bool = True) -> dict[str, Any]:
        return await read_json(request, self.max_request_bytes, allow_empty=allow_empty)

    # ------------------------------------------------------------------ health / metadata

    async def live(self, request: Request) -> Response:
        """200 while the process is up."""
        return json_response({"live": self.dp.live()})

    async def ready(self, request: Request) -> Response:
        """200 when serving, 503 while starting or shutting down."""
        ok = self.dp.ready()
        return json_response({"ready": ok}, 200 if ok else 503)

    async def server_metadata(self, request: Request) -> Response:
        """``GET /v2``."""
        return json_response(self.dp.server_metadata().to_dict())

    async def model_metadata(self, request: Request) -> Response:
        """``GET /v2/models/{m}[/versions/{v}]``; loads the model to learn its tensors."""
        p = request.path_params
        meta = await self.dp.model_metadata_loaded(p["model"], p.get("version"))
        return json_response(meta.to_dict())

    async def model_ready(self, request: Request) -> Response:
        """200 when that model version can serve now, 400 when not (as Triton)."""
        p = request.path_params
        ok = self.dp.model_ready(p["model"], p.get("version"))
        return json_response({"name": p["model"], "ready": ok}, 200 if ok else 400)

    async def model_config(self, request: Request) -> Response:
        """``GET /v2/models/{m}[/versions/{v}]/config``: Triton's model configuration."""
        p = request.path_params
        return json_response(await self.dp.model_config(p["model"], p.get("version")))

    async def model_statistics(self, request: Request) -> Response:
        """``GET /v2/models[/{m}[/versions/{v}]]/stats``: Triton's statistics extension."""
        p = request.path_params
        return json_response(self.dp.statistics(p.get("model"), p.get("version")))

    async def logging_settings(self, request: Request) -> Response:
        """``GET /v2/logging`` reads, ``POST /v2/logging {settings}`` changes (Triton's
        logging extension; management plane)."""
        settings = self.dp.log_settings
        if request.method == "GET":
            return json_response(settings.as_dict())
        return json_response(settings.update(await self._json_body(request)))

    # ------------------------------------------------------------------ inference

    async def predict(self, request: Request) -> Response:
        """``POST /predict {"model", "version"?, "inputs": {name: nested list}} | "text"``.

        Optional ``"priority"`` (1 is the highest) and ``"timeout"`` (µs), and the
        ``X-Modelyard-Timeout-Ms`` header, mean what they mean on the infer route.
        """
        doc = await self._json_body(request, allow_empty=False)
        answer = await self.dp.predict(doc, request.headers.get(TIMEOUT_HEADER))
        response = json_response(answer)
        self.dp.check_response_bytes(len(response.body))
        mark_brownout(response, answer)
        return response

    # ------------------------------------------------------------------ repository

    async def repository_index(self, request: Request) -> Response:
        """``POST /v2/repository/index {"ready": bool}``."""
        doc = await self._json_body(request)
        return json_response(self.dp.repository_index(bool(doc.get("ready", False))))

    async def repository_load(self, request: Request) -> Response:
        """``POST /v2/repository/models/{m}/load``: returns once loaded (or failed).

        A model folder the YAML does not list can be loaded too, optionally with
        ``{"parameters": {"config": {...model fields...}}}``.
        """
        doc = await self._json_body(request)
        params = doc.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidInputError("'parameters' must be an object")
        check_load_parameters(params)
        name = request.path_params["model"]
        await self.dp.load(name, params.get("config"))
        return Response(b"", status_code=200)

    async def repository_unload(self, request: Request) -> Response:
        """``POST /v2/repository/models/{m}/unload``."""
        await self._json_body(request)
        await self.dp.unload(request.path_params["model"])
        return Response(b"", status_code=200)

    def routes(self) -> list[BaseRoute]:
        """Every route of the REST API."""
        g = guarded
        m = "/v2/models/{model}"
        mv = "/v2/models/{model}/versions/{version}"
        return [
            Route("/v2/health/live", g(self.live), methods=["GET"]),
            Route("/v2/health/ready", g(self.ready), methods=["GET"]),
            Route("/v2", g(self.server_metadata), methods=["GET"]),
            # Before "{model}": "stats" is not a model's name here.
            Route("/v2/models/stats", g(self.model_statistics), methods=["GET"]),
            Route(m, g(self.model_metadata), methods=["GET"]),
            Route(mv, g(self.model_metadata), methods=["GET"]),
            Route(m + "/ready", g(self.model_ready), methods=["GET"]),
            Route(mv + "/ready", g(self.model_ready), methods=["GET"]),
            Route(m + "/config", g(self.model_config), methods=["GET"]),
            Route(mv + "/config", g(self.model_config), methods=["GET"]),
            Route(m + "/stats", g(self.model_statistics), methods=["GET"]),
            Route(mv + "/stats", g(self.model_statistics), methods=["GET"]),
            Route(m + "/infer", self.infer, methods=["POST"]),
            Route(mv + "/infer", self.infer, methods=["POST"]),
            Route(m + "/generate", self.generate.generate, methods=["POST"]),
            Route(mv + "/generate", self.generate.generate, methods=["POST"]),
            Route(m + "/generate_stream", self.generate.generate_stream, methods=["POST"]),
            Route(mv + "/generate_stream", self.generate.generate_stream, methods=["POST"]),
            Route("/predict", g(self.predict), methods=["POST"]),
            Route("/v2/logging", g(self.logging_settings), methods=["GET", "POST"]),
            Route("/v2/repository/index", g(self.repository_index), methods=["POST"]),
            Route("/v2/repository/models/{model}/load", g(self.repository_load), methods=["POST"]),
            Route(
                "/v2/repository/models/{model}/unload", g(self.repository_unload), methods=["POST"]
            ),
        ]


async def _not_found(request: Request, exc: Exception) -> Response:
    message = f"no route for {request.method} {request.url.path}"
    return error_response_at(request.url.path, ModelNotFoundError(message))


async def _method_not_allowed(request: Request, exc: Exception) -> Response:
    message = f"{request.method} is not allowed on {request.url.path}"
    response = error_response_at(request.url.path, NotSupportedError(message))
    response.status_code = 405
    return response


def create_app(
    dataplane: DataPlane,
    max_request_bytes: int,
    extra_routes: list[BaseRoute] | None = None,
    authorizer: Authorizer | None = None,
    *,
    max_control_body_bytes: int | None = None,
) -> ASGIApp:
    """The ASGI app: the token check (when ``authorizer`` has tokens), the infer fast
    path, then the protocol routes, ``GET /openapi.json`` and ``extra_routes`` (metrics,
    dashboard, admin) in Starlette, every body bounded: inference bodies by
    ``max_request_bytes``, every other route's by ``max_control_body_bytes``."""
    api = RestApi(dataplane, max_request_bytes)
    app = Starlette(
        routes=[
            *api.routes(),
            *OpenAIApi(dataplane, max_request_bytes).routes(),
            *openapi_routes(),
            *(extra_routes or []),
        ],
        exception_handlers={404: _not_found, 405: _method_not_allowed},
    )
    control = max_control_body_bytes or LimitsConfig().max_control_body_bytes
    fast: ASGIApp = InferFastPath(
        api.infer, RouteLimits(app, max_request_bytes, min(control, max_request_bytes))
    )
    if authorizer is not None and authorizer.is_enabled:
        return AuthLayer(authorizer, fast)
    return fast
