"""The OpenAPI document lists exactly the server's routes, and the server serves it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate
from starlette.applications import Starlette
from starlette.routing import Route

from modelyard.app import App
from modelyard.config.settings import load_settings
from modelyard.frontends.http.app import create_app
from modelyard.frontends.http.errors import HTTP_STATUS
from modelyard.frontends.http.fastpath import InferFastPath
from modelyard.frontends.http.openapi import OPENAPI_PATH, openapi_document
from tests.servers import running_server, write_config

HTTP_METHODS = frozenset({"get", "put", "post", "delete", "patch", "options", "head", "trace"})
ERROR_STATUSES = {"400", "401", "403", "404", "409", "413", "429", "500", "503", "504"}
"""Every error status the issue asks the document to describe."""
FAST_PATH = {
    ("/v2/models/{model}/infer", "post"),
    ("/v2/models/{model}/versions/{version}/infer", "post"),
}
"""Answered by InferFastPath before Starlette routes; they must be documented too."""
OPEN_ROUTES = {"/", "/v2/health/live", "/v2/health/ready", OPENAPI_PATH}
"""Routes that stay open whatever tokens are configured."""


@pytest.fixture
def config_file(model_root: Path, tmp_path: Path) -> Path:
    models = [{"name": "add", "path": "add", "isolation": "inline"}]
    return write_config(tmp_path, models, model_repository=str(model_root))


def _documented() -> set[tuple[str, str]]:
    return {
        (path, method)
        for path, item in openapi_document()["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, op)
        for path, item in openapi_document()["paths"].items()
        for method, op in item.items()
        if method in HTTP_METHODS
    ]


def test_document_is_valid_openapi_3() -> None:
    doc = openapi_document()
    assert doc["openapi"].startswith("3.")
    validate(doc)


def _starlette_inside(app: object) -> Starlette:
    """The Starlette router under the ASGI layers in front of it (fast path, body limits)."""
    seen = 0
    while not isinstance(app, Starlette):
        seen += 1
        assert seen < 10, "no Starlette app under the ASGI layers"
        app = next(getattr(app, name) for name in ("fallback", "app", "data") if hasattr(app, name))
    return app


def test_document_lists_exactly_the_servers_routes(config_file: Path) -> None:
    # The same composition App.start() serves, built without starting anything.
    app = App(load_settings(config_file))
    asgi = create_app(app.dataplane, 1 << 20, app.extra_routes())
    assert isinstance(asgi, InferFastPath)
    starlette = _starlette_inside(asgi)
    served: set[tuple[str, str]] = set()
    for route in starlette.routes:
        assert isinstance(route, Route), route
        # Starlette adds HEAD to every GET route by itself.
        served |= {(route.path, m.lower()) for m in route.methods or () if m != "HEAD"}
    documented = _documented()
    assert served - documented == set(), "routes missing from openapi.yaml"
    assert documented - served == set(), "openapi.yaml documents routes the server lacks"
    assert documented >= FAST_PATH


def test_every_error_status_and_the_error_schema_are_documented() -> None:
    doc = openapi_document()
    error = doc["components"]["schemas"]["Error"]
    assert error["required"] == ["error"]
    assert error["additionalProperties"] is False
    statuses = {code for _, _, op in _operations() for code in op["responses"]}
    assert statuses >= ERROR_STATUSES
    # Every status the server can map an error to is described somewhere (499 is a
    # client that already left: nobody reads it).
    assert {str(s) for s in HTTP_STATUS.values()} - {"499"} <= statuses
    assert doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"


@pytest.mark.parametrize(("path", "method", "op"), _operations(), ids=lambda v: str(v)[:60])
def test_each_operation_documents_its_errors(path: str, method: str, op: dict[str, Any]) -> None:
    responses = op["responses"]
    # A success: an answer, or (GET /) a redirect to one.
    assert any(code.startswith(("2", "3")) for code in responses), "no success answer"
    assert "500" in responses
    if path in OPEN_ROUTES:
        assert op.get("security") == []
    else:
        assert {"401", "403"} <= set(responses)
    for code, answer in responses.items():
        if code.startswith(("4", "5")) and "$ref" in answer:
            assert answer["$ref"].startswith("#/components/responses/")


async def test_server_serves_the_document(config_file: Path) -> None:
    async with running_server(config_file) as (_, client):
        r = await client.get(OPENAPI_PATH)
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/json"
        assert r.json() == openapi_document()
