"""The OpenAPI 3 document of the REST API: kept beside the code, served as JSON."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import orjson
import yaml
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

OPENAPI_PATH = "/openapi.json"


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The document (``openapi.yaml``, package data), parsed once per process."""
    text = (resources.files("modelyard.frontends.http") / "openapi.yaml").read_text("utf-8")
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


def openapi_routes() -> list[BaseRoute]:
    """``GET /openapi.json``."""
    body = orjson.dumps(openapi_document())

    async def serve(request: Request) -> Response:
        return Response(body, headers={"content-type": "application/json"})

    return [Route(OPENAPI_PATH, serve, methods=["GET"])]
