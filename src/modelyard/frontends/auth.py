"""The one authoriser both front ends call: which plane a call belongs to, and its token.

REST (``http/auth.py``) and gRPC (``grpc/auth.py``) only map their routes or methods
to a :class:`Plane` and pass the ``authorization`` value they received; the decision,
and its constant-time comparison, is made here once for both, so a route cannot be
protected on one transport and open on the other.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from enum import StrEnum

from modelyard.config.security import SecurityConfig
from modelyard.errors import PermissionDeniedError, UnauthenticatedError

_BEARER = "bearer"


class Plane(StrEnum):
    """What a call can do, and so which token it needs."""

    OPEN = "open"
    """Liveness, readiness, server metadata: never needs a token."""
    DATA = "data"
    """Inference, model metadata and model readiness."""
    METRICS = "metrics"
    """``/metrics``: open, or the management plane's when ``protect_metrics`` is set."""
    MANAGEMENT = "management"
    """Everything that changes or reveals the server's state: load, unload, pin, aliases…"""


@dataclass(frozen=True, repr=False)
class Authorizer:
    """Checks a call's credential against the tokens of its plane.

    A plane with no token configured is open. The management token is accepted on
    every plane (an operator can do what a client can); the data token only on data.
    """

    management: bytes | None
    data: bytes | None
    protect_metrics: bool = False
    _grants: dict[Plane, tuple[bytes, ...]] = field(init=False, compare=False)

    def __repr__(self) -> str:
        # Never the tokens themselves, which the dataclass repr would print.
        return (
            f"Authorizer(management={'set' if self.management else 'open'}, "
            f"data={'set' if self.data else 'open'}, protect_metrics={self.protect_metrics})"
        )

    @classmethod
    def from_config(cls, security: SecurityConfig) -> Authorizer:
        """Read the tokens (from their files if need be); raises ``SecurityError``."""
        management = security.management_secret()
        data = security.data_secret()
        return cls(
            management=management.encode() if management else None,
            data=data.encode() if data else None,
            protect_metrics=security.protect_metrics,
        )

    @property
    def is_enabled(self) -> bool:
        """Whether any call can be refused (when not, front ends skip the check)."""
        return self.management is not None or self.data is not None

    def __post_init__(self) -> None:
        # Which tokens grant each plane, worked out once: the check runs per request.
        management = () if self.management is None else (self.management,)
        data = () if self.data is None else (self.data, *management)
        grants = {
            Plane.OPEN: (),
            Plane.DATA: data,
            Plane.METRICS: management if self.protect_metrics else (),
            Plane.MANAGEMENT: management,
        }
        object.__setattr__(self, "_grants", grants)

    def tokens_for(self, plane: Plane) -> tuple[bytes, ...]:
        """The tokens that grant ``plane``; empty when it is open."""
        return self._grants[plane]

    def check(self, plane: Plane, authorization: str | bytes | None) -> None:
        """Allow the call, or raise :class:`UnauthenticatedError` (no Bearer token) or
        :class:`PermissionDeniedError` (a token that does not grant ``plane``).

        ``authorization`` is the raw ``Authorization`` header or ``authorization``
        metadata value. Messages never quote what the client sent.
        """
        allowed = self.tokens_for(plane)
        if not allowed:
            return
        token = _bearer_token(authorization)
        if token is None:
            raise UnauthenticatedError(
                f"the {plane.value} plane needs a token: send 'Authorization: Bearer <token>'"
            )
        # Compare against every allowed token, without stopping at the first match, so
        # that the time taken says nothing about which (if any) token was close.
        granted = False
        for candidate in allowed:
            granted |= hmac.compare_digest(token, candidate)
        if not granted:
            raise PermissionDeniedError(f"the token does not grant the {plane.value} plane")


def _bearer_token(authorization: str | bytes | None) -> bytes | None:
    if authorization is None:
        return None
    raw = authorization
    if isinstance(raw, str):
        raw = raw.encode("latin-1", "replace")
    scheme, _, token = raw.strip().partition(b" ")
    if scheme.lower() != _BEARER.encode() or not token.strip():
        return None
    return token.strip()
