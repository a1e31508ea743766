"""Certificates for TLS tests, made per test by trustme: a CA, a server and a client cert."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc
import trustme


@dataclass(frozen=True)
class Pki:
    """A CA, the server's certificate files, and a client certificate it signed."""

    ca: trustme.CA
    certfile: Path
    keyfile: Path
    ca_file: Path
    client: trustme.LeafCert


def make_pki(tmp_path: Path) -> Pki:
    """A fresh CA; the server's certificate (127.0.0.1, localhost) written under ``tmp_path``
    as ``cert.pem`` and ``key.pem``, the CA as ``ca.pem``; a client certificate in memory."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    server.cert_chain_pems[0].write_to_path(str(certfile))
    for extra in server.cert_chain_pems[1:]:
        extra.write_to_path(str(certfile), append=True)
    server.private_key_pem.write_to_path(str(keyfile))
    ca.cert_pem.write_to_path(str(ca_file))
    return Pki(ca, certfile, keyfile, ca_file, ca.issue_cert("client@modelyard.test"))


def client_context(pki: Pki, *, with_cert: bool = False) -> ssl.SSLContext:
    """An SSL context trusting the test CA, optionally presenting the client certificate."""
    context = ssl.create_default_context()
    pki.ca.configure_trust(context)
    if with_cert:
        pki.client.configure_cert(context)
    return context


def channel_credentials(pki: Pki, *, with_cert: bool = False) -> grpc.ChannelCredentials:
    """gRPC credentials trusting the test CA, optionally with the client certificate."""
    if not with_cert:
        return grpc.ssl_channel_credentials(root_certificates=pki.ca.cert_pem.bytes())
    return grpc.ssl_channel_credentials(
        root_certificates=pki.ca.cert_pem.bytes(),
        private_key=pki.client.private_key_pem.bytes(),
        certificate_chain=b"".join(p.bytes() for p in pki.client.cert_chain_pems),
    )
