"""The uvicorn set-up of a REST server, shared by the single process and each ingress."""

from __future__ import annotations

import contextlib
import logging
import resource
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from modelyard.config.limits import LimitsConfig
from modelyard.frontends.http.connections import guarded_protocol, overflow_connections

log = logging.getLogger("modelyard")

# Descriptors the server needs besides client connections: listening sockets, the
# workers' socket pairs and shared-memory regions, log files, the gRPC core.
_SPARE_DESCRIPTORS = 256


def accept_batch(max_connections: int) -> int:
    """The listen backlog, which is also how many connections asyncio accepts in one go.

    Connections over the cap are closed only after they are accepted, so one batch must
    fit in the descriptors left above the cap (uvicorn's default of 2,048 would not).
    """
    return max(64, min(2048, max_connections // 4))


def ensure_descriptor_room(max_connections: int) -> None:
    """Raise the soft file limit to what the connection cap needs, or warn if it cannot."""
    needed = (
        max_connections
        + overflow_connections(max_connections)
        + accept_batch(max_connections)
        + _SPARE_DESCRIPTORS
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    raised = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
    if raised > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            log.info("raised the soft file limit from %d to %d", soft, raised)
            soft = raised
    if soft < needed:
        log.warning(
            "the file limit (ulimit -n) is %d but limits.max_connections=%d needs about %d; "
            "lower limits.max_connections or raise the limit, or accepting connections "
            "can fail for every client",
            soft,
            max_connections,
            needed,
        )


def uvicorn_config(
    app: ASGIApp, host: str, port: int, limits: LimitsConfig, tls_options: dict[str, Any]
) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` under ``limits`` (and TLS when given)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="none",
        # httptools, plus a deadline for request heads and a connection cap.
        http=guarded_protocol(
            limits.header_timeout_s, limits.max_connections, limits.body_idle_timeout_s
        ),
        # Counted with the connection being answered: 503 once over the cap.
        limit_concurrency=limits.max_connections + 1,
        backlog=accept_batch(limits.max_connections),
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
