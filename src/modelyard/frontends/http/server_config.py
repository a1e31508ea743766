"""The uvicorn set-up of the REST server: documented options and public hooks only."""

from __future__ import annotations

import logging
import resource
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from modelyard.config.limits import LimitsConfig
from modelyard.frontends.descriptors import SPARE_DESCRIPTORS, port_share
from modelyard.frontends.http.connections import ConnectionGuard, GuardLayer, overflow_connections

log = logging.getLogger("modelyard")


def accept_batch(max_connections: int) -> int:
    """The listen backlog, which is also how many connections asyncio accepts in one go.

    Connections over the cap are closed only after they are accepted, so one batch must
    fit in the descriptors left above the cap (uvicorn's default of 2,048 would not).
    """
    return max(16, min(2048, max_connections // 4))


def descriptors_needed(max_connections: int) -> int:
    """Descriptors the REST port can hold at once with this cap (overflow and one
    accepted batch included)."""
    return max_connections + overflow_connections(max_connections) + accept_batch(max_connections)


def rest_connection_cap(limits: LimitsConfig) -> int:
    """``limits.max_connections``, or by default the most connections whose descriptors
    fit in the REST port's share of the file limit
    (:func:`~modelyard.frontends.descriptors.port_share`)."""
    if limits.max_connections is not None:
        _warn_if_short(limits.max_connections)
        return limits.max_connections
    share = port_share()
    cap = max(16, share * 8 // 11)  # the cap, its overflow (1/8) and a batch (1/4)
    while cap > 16 and descriptors_needed(cap) > share:
        cap -= 1
    return cap


def _warn_if_short(max_connections: int) -> None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    needed = descriptors_needed(max_connections) + SPARE_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < needed:
        port_share()  # raises the soft limit when the hard one allows
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "the file limit (ulimit -n) is %d but limits.max_connections=%d needs about %d; "
            "lower limits.max_connections (or leave it unset: derived from the limit) or "
            "raise the limit, or accepting connections can fail for every client",
            soft,
            max_connections,
            needed,
        )


def uvicorn_config(
    app: ASGIApp, host: str, port: int, limits: LimitsConfig, tls_options: dict[str, Any]
) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` under ``limits`` (and TLS when given)."""
    cap = rest_connection_cap(limits)
    guard = ConnectionGuard(limits.header_timeout_s, limits.body_idle_timeout_s, cap)
    return uvicorn.Config(
        GuardLayer(guard, app),
        host=host,
        port=port,
        loop="none",
        # httptools, counted and timed by the guard (connections.py).
        http=guard.protocol_class(),
        # The guard answers 503 past the cap from its own count (uvicorn's also counts
        # displaced connections until their connection_lost): uvicorn's is a backstop.
        limit_concurrency=cap + overflow_connections(cap) + 1,
        backlog=accept_batch(cap),
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=limits.keep_alive_timeout_s,
        # No proxy-header rewriting, Server or Date headers: work per response that
        # no inference client needs.
        proxy_headers=False,
        server_header=False,
        date_header=False,
        **tls_options,
    )
