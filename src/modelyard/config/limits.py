"""LimitsConfig: the bounds on what one client can make the server hold (``limits:``).

Every bound is checked before the work it bounds (a body before it is read whole,
elements before arrays are allocated, connections before they can exhaust file
descriptors), and every refusal is a typed error, never a truncated answer.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from modelyard.config.units import MIB, OldName, from_old_names

_OLD_NAMES: dict[str, OldName] = {
    "max_control_body_bytes": ("max_control_body_mb", MIB),
    "max_response_bytes": ("max_response_mb", MIB),
}
"""Older names of the size limits (bytes), still accepted."""


class LimitsConfig(BaseModel):
    """The ``limits:`` block of ``modelyard.yaml`` (``max_request_mb`` stays top-level).

    Sizes are MiB in the file (``_mb``, fractions allowed); the code reads them in bytes
    through the ``_bytes`` properties."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_control_body_mb: float = Field(default=1.0, gt=0)
    """Largest body of any route other than inference (repository, aliases, rollback,
    pin, dashboard, ...); beyond it, HTTP 413 before the body is read whole. Older name
    ``max_control_body_bytes`` (bytes)."""
    max_request_elements: PositiveInt = 16 * MIB
    """Most tensor elements one inference request may carry (all inputs together),
    checked from the declared shapes before any array is built; beyond it, 413
    (gRPC RESOURCE_EXHAUSTED). A batch the scheduler forms never exceeds it either."""
    max_response_mb: float = Field(default=64.0, gt=0)
    """Largest encoded inference response; beyond it the request fails with 413 (gRPC
    RESOURCE_EXHAUSTED) rather than sending a partial body. Older name
    ``max_response_bytes`` (bytes)."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """An HTTP connection must send a complete request head within this long of opening
    (or of its first byte, between keep-alive requests); otherwise it is closed. A gRPC
    connection must complete its HTTP/2 handshake within it too."""
    body_idle_timeout_s: float = Field(default=30.0, gt=0)
    """A request body that stops arriving for this long closes its connection."""
    keep_alive_timeout_s: PositiveInt = 30
    """An idle keep-alive HTTP connection is closed after this long."""
    max_connections: PositiveInt | None = None
    """Open REST connections at most (the REST port's own cap; gRPC has its own). Unset
    (the default): derived from the process's file limit (``ulimit -n``, raised toward
    its hard limit at start-up), half of what is left after the server's own needs going
    to each port, so that a flood on one port cannot starve the other. At the cap, a new
    connection first displaces the oldest connection not in a request (a slow or silent
    client, or an idle keep-alive one); if every connection is busy, requests are
    answered 503 and, past a small overflow, new connections are closed at once."""
    grpc_max_message_mb: float = Field(default=4.0, gt=0)
    """Largest gRPC message either way (grpcio's own default), kept below
    ``max_request_mb`` because grpcio buffers a whole message per running RPC; beyond
    it the call ends with RESOURCE_EXHAUSTED ("Received message larger than max (N vs.
    LIMIT)"). Raise it for large tensors, with ``grpc_max_buffered_mb`` in mind."""
    grpc_max_buffered_mb: float = Field(default=256.0, gt=0)
    """The total bound on gRPC request bytes held at once: RPCs run at once are capped
    at ``grpc_max_buffered_mb / grpc_max_message_mb`` (64 by default), so bodies that
    never end cannot hold more, however many connections send them."""
    grpc_max_concurrent_rpcs: PositiveInt = 1024
    """RPCs the gRPC server runs at once, all connections together (also capped by
    ``grpc_max_buffered_mb``); beyond it, new RPCs are answered RESOURCE_EXHAUSTED
    ("Concurrent RPC limit exceeded!")."""
    grpc_max_concurrent_streams: PositiveInt = 128
    """Concurrent RPCs one gRPC connection may have open."""
    grpc_max_connections: PositiveInt = 256
    """Open gRPC connections at most (grpcio refuses more), so that a flood of
    connections on the gRPC port cannot take the file descriptors REST needs."""
    grpc_max_connection_idle_s: float = Field(default=300.0, gt=0)
    """A gRPC connection with no RPC for this long is closed (GOAWAY)."""
    grpc_max_connection_age_s: float = Field(default=600.0, gt=0)
    """Every gRPC connection gets GOAWAY at this age (clients reconnect by themselves);
    with the grace below, the deadline of a call left open without progress."""
    grpc_max_connection_age_grace_s: float = Field(default=60.0, gt=0)
    """After the age GOAWAY, how long calls still running may finish before the close."""

    @property
    def grpc_max_message_bytes(self) -> int:
        """``grpc_max_message_mb`` in bytes."""
        return max(1, int(self.grpc_max_message_mb * MIB))

    @property
    def grpc_max_buffered_bytes(self) -> int:
        """``grpc_max_buffered_mb`` in bytes."""
        return max(1, int(self.grpc_max_buffered_mb * MIB))

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        return from_old_names(data, _OLD_NAMES)

    @property
    def max_control_body_bytes(self) -> int:
        """``max_control_body_mb`` in bytes."""
        return max(1, int(self.max_control_body_mb * MIB))

    @property
    def max_response_bytes(self) -> int:
        """``max_response_mb`` in bytes."""
        return max(1, int(self.max_response_mb * MIB))
