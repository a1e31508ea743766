"""What a gRPC handler sees and raises, and the table of methods a connection dispatches to.

A handler is ``async (request, context) -> response``; it ends a call with a status other
than OK by raising :class:`RpcError`. :class:`RpcContext` carries the call's metadata and
deadline, the two things modelyard's servicer reads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from modelyard.frontends.auth import Authorizer, Plane


class RpcError(Exception):
    """Ends the call with ``code`` (never OK), ``details`` and trailing ``metadata``."""

    def __init__(
        self, code: grpc.StatusCode, details: str, metadata: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.metadata = metadata


class RpcContext:
    """One call's invocation metadata and deadline (an event-loop time, or None)."""

    __slots__ = ("_clock", "_metadata", "deadline")

    def __init__(
        self,
        metadata: tuple[tuple[str, str], ...],
        deadline: float | None,
        clock: Callable[[], float],
    ) -> None:
        self._metadata = metadata
        self.deadline = deadline
        self._clock = clock

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        """The call's metadata (``-bin`` keys as latin-1 text), pseudo-headers left out."""
        return self._metadata

    def time_remaining(self) -> float | None:
        """Seconds until the client's deadline; None when the call has none."""
        return None if self.deadline is None else self.deadline - self._clock()


Handler = Callable[[Any, RpcContext], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Method:
    """One unary method: how to decode its request, run it, encode its response."""

    plane: Plane
    deserialize: Callable[[bytes], Any]
    handler: Handler


@dataclass(slots=True)
class Limits:
    """The server-wide bounds every connection applies."""

    max_message_bytes: int
    max_concurrent_streams: int
    max_concurrent_rpcs: int | None
    max_connection_idle_s: float
    handshake_timeout_s: float


@dataclass(slots=True)
class ServerState:
    """What every connection of one server shares: methods, auth, limits, live counts."""

    methods: dict[bytes, Method]
    limits: Limits
    authorizer: Authorizer | None = None
    active_rpcs: int = 0
    draining: bool = False
    connections: set[Any] = field(default_factory=set)
