"""``GET /metrics``: the server's Prometheus registry in the text exposition format."""

from __future__ import annotations

from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from modelyard.frontends.http.errors import guarded
from modelyard.observability.metrics import Metrics


def metrics_routes(metrics: Metrics) -> list[BaseRoute]:
    """``GET /metrics`` (Prometheus text, or OpenMetrics when the scraper asks for it)."""
    registry = metrics.registry

    async def scrape(request: Request) -> Response:
        # NOTE: collected on the event loop, not in a thread: the manager collector reads
        # state that only the loop mutates, and a scrape of a few hundred series is ~1 ms.
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(registry), headers={"content-type": content_type})

    return [Route("/metrics", guarded(scrape), methods=["GET"])]
