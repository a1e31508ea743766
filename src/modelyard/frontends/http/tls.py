"""HTTPS for the REST front end: uvicorn's TLS options from the security settings."""

from __future__ import annotations

import ssl
from typing import Any

from modelyard.config.security import SecurityConfig, SecurityError


def uvicorn_tls_options(security: SecurityConfig) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.Config``: empty for plaintext.

    The files are loaded once here first, so that a wrong path or a key that does not
    match its certificate stops start-up with the setting's name instead of a bare
    ``ssl`` error from inside uvicorn.
    """
    cert, key, ca = security.tls_certfile, security.tls_keyfile, security.tls_client_ca_file
    if cert is None or key is None:
        return {}
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        probe.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise SecurityError(
            f"security.tls_certfile / tls_keyfile: cannot load {cert} with {key}: {exc}"
        ) from None
    options: dict[str, Any] = {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
    if ca is not None:
        try:
            probe.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise SecurityError(f"security.tls_client_ca_file: cannot load {ca}: {exc}") from None
        options["ssl_ca_certs"] = str(ca)
        options["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return options
