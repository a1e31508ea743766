"""SecurityConfig: who may call which plane, and TLS for both front ends.

Tokens come from the YAML, from ``MODELYARD_SECURITY__…`` environment variables, or
from a file named here (read once at start-up). They are :class:`~pydantic.SecretStr`,
so neither ``repr`` nor a validation error prints them.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import BaseModel, ConfigDict, SecretStr, model_validator

_FILE_FIELDS = (
    "management_token_file",
    "data_token_file",
    "tls_certfile",
    "tls_keyfile",
    "tls_client_ca_file",
)
_LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})


class SecurityError(Exception):
    """The security settings cannot be used as given (names the setting, never a token)."""


class SecurityConfig(BaseModel):
    """Authentication tokens per plane, and TLS certificates for REST and gRPC."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    management_token: SecretStr | None = None
    """Bearer token for the management plane: repository index/load/unload, pin/unpin,
    aliases, rollback, ``/v2/stats``, ``/v2/health/details``. It grants the data plane too.
    Unset: the management plane is open (allowed only on a loopback address)."""
    management_token_file: Path | None = None
    """File whose content (stripped) is the management token; exclusive with the above."""
    data_token: SecretStr | None = None
    """Bearer token for the data plane: infer, ``/predict``, model metadata and readiness.
    Unset: the data plane is open."""
    data_token_file: Path | None = None
    """File whose content (stripped) is the data token; exclusive with the above."""
    protect_metrics: bool = False
    """``/metrics`` needs the management token too."""
    allow_unauthenticated_remote: bool = False
    """Serve on a non-loopback address without a management token (refused otherwise)."""
    tls_certfile: Path | None = None
    """PEM certificate (chain) served by HTTPS and gRPC; set with ``tls_keyfile``."""
    tls_keyfile: Path | None = None
    """PEM private key of ``tls_certfile``."""
    tls_client_ca_file: Path | None = None
    """PEM CA bundle; when set, clients must present a certificate it signed (mutual TLS)."""

    @model_validator(mode="after")
    def _check(self) -> SecurityConfig:
        for plane in ("management", "data"):
            if (
                getattr(self, f"{plane}_token") is not None
                and getattr(self, f"{plane}_token_file") is not None
            ):
                raise ValueError(f"set {plane}_token or {plane}_token_file, not both")
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ValueError("tls_certfile and tls_keyfile go together")
        if self.tls_client_ca_file is not None and self.tls_certfile is None:
            raise ValueError("tls_client_ca_file (mutual TLS) needs tls_certfile and tls_keyfile")
        if self.protect_metrics and not self.has_management_token:
            raise ValueError(
                "protect_metrics needs security.management_token or management_token_file"
            )
        return self

    @property
    def has_management_token(self) -> bool:
        """Whether a management token is configured (inline or by file)."""
        return self.management_token is not None or self.management_token_file is not None

    @property
    def is_tls(self) -> bool:
        """Whether both front ends serve TLS."""
        return self.tls_certfile is not None

    def relative_to(self, base: Path) -> SecurityConfig:
        """This config with its relative file paths taken from ``base`` (the YAML's folder)."""
        update = {}
        for name in _FILE_FIELDS:
            value: Path | None = getattr(self, name)
            if value is not None and not value.is_absolute():
                update[name] = base / value
        return self.model_copy(update=update) if update else self

    def management_secret(self) -> str | None:
        """The management token (read from its file if need be); None when unset."""
        return _secret(self.management_token, self.management_token_file, "management")

    def data_secret(self) -> str | None:
        """The data-plane token (read from its file if need be); None when unset."""
        return _secret(self.data_token, self.data_token_file, "data")


def _secret(inline: SecretStr | None, file: Path | None, plane: str) -> str | None:
    if inline is not None:
        value = inline.get_secret_value().strip()
        setting = f"security.{plane}_token"
    elif file is not None:
        setting = f"security.{plane}_token_file"
        try:
            value = file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise SecurityError(f"{setting}: cannot read {file}: {reason or exc}") from None
    else:
        return None
    if not value:
        raise SecurityError(f"{setting} is empty")
    if not all(33 <= ord(c) < 127 for c in value):
        # It travels in an HTTP header and gRPC metadata: printable ASCII, no spaces.
        raise SecurityError(f"{setting} must be printable ASCII without spaces")
    return value


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` exposes the server to this machine only."""
    name = host.strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name we will not resolve: assume it is reachable


def check_exposure(host: str, security: SecurityConfig) -> None:
    """Refuse to serve a non-loopback ``host`` with an open management plane.

    Raises :class:`SecurityError` naming the settings that fix it, unless the operator
    set ``allow_unauthenticated_remote``.
    """
    if security.has_management_token or security.allow_unauthenticated_remote:
        return
    if is_loopback(host):
        return
    raise SecurityError(
        f"refusing to serve on {host}, a non-loopback address, without a management token: "
        "set security.management_token (or security.management_token_file, or the "
        "MODELYARD_SECURITY__MANAGEMENT_TOKEN environment variable), or set "
        "security.allow_unauthenticated_remote: true to accept that anyone who can reach "
        "the port can load, unload and reconfigure models"
    )
