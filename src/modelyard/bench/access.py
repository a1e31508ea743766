"""How the load generator gets in: the Bearer token and the CA it trusts, for every client.

A server started with ``security.data_token`` (or a management token, for discovery
through ``/v2/repository/index``) refuses requests without the token; a server with
TLS needs its CA trusted. :class:`Access` turns ``--token`` and ``--cacert`` into what
each client sends: an HTTP header, gRPC call metadata, an SSL context, channel credentials.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

from modelyard.bench.config import BenchConfig
from modelyard.bench.errors import BenchConfigError


@dataclass(frozen=True)
class Access:
    """The token (if any) and the CA bundle (if any) of one benchmark."""

    token: str | None = field(default=None, repr=False)
    ca_file: Path | None = None

    @classmethod
    def from_config(cls, config: BenchConfig) -> Access:
        """The access that ``config`` describes."""
        token = config.token.get_secret_value() if config.token is not None else None
        return cls(token=token or None, ca_file=config.ca_file)

    @property
    def http_headers(self) -> dict[str, str]:
        """Headers every REST request carries (empty without a token)."""
        return {} if self.token is None else {"Authorization": f"Bearer {self.token}"}

    @property
    def grpc_metadata(self) -> tuple[tuple[str, str], ...] | None:
        """Call metadata every gRPC call carries (None without a token)."""
        return None if self.token is None else (("authorization", f"Bearer {self.token}"),)

    def ssl_context(self) -> ssl.SSLContext | None:
        """A context trusting ``ca_file``; None means the system's default trust."""
        if self.ca_file is None:
            return None
        try:
            return ssl.create_default_context(cafile=str(self.ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise BenchConfigError(f"--cacert {self.ca_file}: {exc}") from None

    def grpc_root_certificates(self) -> bytes | None:
        """The CA bundle for gRPC over TLS; None: plaintext gRPC."""
        if self.ca_file is None:
            return None
        try:
            return self.ca_file.read_bytes()
        except OSError as exc:
            raise BenchConfigError(f"--cacert {self.ca_file}: {exc.strerror or exc}") from None
