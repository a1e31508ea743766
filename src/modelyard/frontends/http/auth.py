"""REST authentication: the outermost ASGI layer, before the infer fast path and Starlette.

One layer in front of everything means every route, the fast path's included, is
checked the same way, and a route added later is protected (as management) until it
is listed here as something else. Which plane a request belongs to depends only on its
method and path; the decision itself is :meth:`Authorizer.check`.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Receive, Scope, Send

from modelyard.errors import ServerError
from modelyard.frontends.auth import Authorizer, Plane
from modelyard.frontends.http.openai_errors import error_response_at

_OPEN_PATHS = frozenset(
    {
        "/v2/health/live",
        "/v2/health/ready",
        "/v2",
        "/openapi.json",
        # The dashboard's page and assets are static; the data it polls is management.
        # "/" only redirects to the dashboard.
        "/",
        "/dashboard",
    }
)
_WS_POLICY_VIOLATION = 1008
_OPEN_METHODS = frozenset({"GET", "HEAD"})
_DASHBOARD_ASSET = re.compile(r"/dashboard/[^/]+")
_DATA_PATH = re.compile(
    r"/v2/models/[^/]+(?:/versions/[^/]+)?"
    r"(?:/infer|/ready|/generate|/generate_stream|/config|/stats)?|/predict"
    r"|/v1/models(?:/[^/]+)?|/v1/completions|/v1/chat/completions|/v1/embeddings"
    r"|/tokenize|/detokenize"
)


def rest_plane(method: str, path: str) -> Plane:
    """The plane of ``method path``; anything not recognised is management."""
    if method in _OPEN_METHODS and (path in _OPEN_PATHS or _DASHBOARD_ASSET.fullmatch(path)):
        return Plane.OPEN
    if path == "/metrics":
        return Plane.METRICS
    if _DATA_PATH.fullmatch(path):
        return Plane.DATA
    return Plane.MANAGEMENT


class AuthLayer:
    """ASGI app: refuse a request whose plane needs a token it lacks, else pass it on.

    A refused request is answered 401 (no Bearer token, with ``WWW-Authenticate``)
    or 403 (a token that does not grant the plane) with the protocol's error body,
    before its body is read.
    """

    def __init__(self, authorizer: Authorizer, app: ASGIApp) -> None:
        self.authorizer = authorizer
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the request, then hand it to the wrapped app."""
        if scope["type"] in ("http", "websocket"):
            plane = rest_plane(scope.get("method", "GET"), scope["path"])
            if self.authorizer.tokens_for(plane):
                authorization = None
                for key, value in scope["headers"]:
                    if key == b"authorization":
                        authorization = value
                        break
                try:
                    self.authorizer.check(plane, authorization)
                except ServerError as exc:
                    if scope["type"] == "websocket":
                        await send({"type": "websocket.close", "code": _WS_POLICY_VIOLATION})
                    else:
                        await error_response_at(scope["path"], exc)(scope, receive, send)
                    return
        await self.app(scope, receive, send)
