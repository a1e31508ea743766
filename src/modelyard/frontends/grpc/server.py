"""grpc.aio server bootstrap: bind, register the servicer, start; and a graceful stop."""

from __future__ import annotations

import grpc

from modelyard.config.security import SecurityConfig
from modelyard.frontends.auth import Authorizer
from modelyard.frontends.grpc.auth import AuthInterceptor
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from modelyard.frontends.grpc.servicer import DataPlaneProtocol, InferenceServicer


def _address(host: str, port: int) -> str:
    # A bare IPv6 literal needs brackets before the port.
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def server_credentials(security: SecurityConfig) -> grpc.ServerCredentials | None:
    """TLS credentials from the certificate settings (client CA → mutual TLS); None: plaintext.

    Raises OSError when a file cannot be read.
    """
    if security.tls_certfile is None or security.tls_keyfile is None:
        return None
    ca = security.tls_client_ca_file
    return grpc.ssl_server_credentials(
        [(security.tls_keyfile.read_bytes(), security.tls_certfile.read_bytes())],
        root_certificates=ca.read_bytes() if ca is not None else None,
        require_client_auth=ca is not None,
    )


async def start_grpc_server(
    dataplane: DataPlaneProtocol,
    host: str,
    port: int,
    max_message_bytes: int,
    *,
    authorizer: Authorizer | None = None,
    credentials: grpc.ServerCredentials | None = None,
    max_concurrent_streams: int = 128,
    max_connection_idle_s: float = 300.0,
    max_concurrent_rpcs: int | None = None,
    handshake_timeout_s: float = 10.0,
) -> tuple[grpc.aio.Server, int]:
    """Start the KServe v2 gRPC server on ``host:port`` and return it with its bound port.

    ``port`` 0 picks a free port. Messages over ``max_message_bytes`` either way are
    refused by gRPC itself with RESOURCE_EXHAUSTED. ``authorizer`` checks each call's
    token; ``credentials`` (see :func:`server_credentials`) serve TLS. Must run on the
    server's event loop.
    refused by gRPC itself with RESOURCE_EXHAUSTED. One connection may have at most
    ``max_concurrent_streams`` RPCs open, the server runs at most
    ``max_concurrent_rpcs`` at once (RESOURCE_EXHAUSTED beyond), and a connection
    without RPCs for ``max_connection_idle_s`` is closed, as is one that has not
    completed its HTTP/2 handshake within ``handshake_timeout_s`` (a silent client).
    Must run on the server's event loop.
    """
    if max_message_bytes <= 0:
        raise ValueError(f"max_message_bytes must be positive, got {max_message_bytes}")
    interceptors = (
        [AuthInterceptor(authorizer)] if authorizer is not None and authorizer.is_enabled else []
    )
    server = grpc.aio.server(
        interceptors=interceptors,
        maximum_concurrent_rpcs=max_concurrent_rpcs,
        options=[
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            # Without this, Linux lets a second server bind the same port silently.
            ("grpc.so_reuseport", 0),
            ("grpc.max_concurrent_streams", max_concurrent_streams),
            ("grpc.max_connection_idle_ms", int(max_connection_idle_s * 1000)),
            ("grpc.server_handshake_timeout_ms", max(1, int(handshake_timeout_s * 1000))),
        ],
    )
    # The generated registration function has no annotations (protoc emits no stubs for it).
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(  # type: ignore[no-untyped-call]
        InferenceServicer(dataplane), server
    )
    address = _address(host, port)
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise OSError(f"gRPC server cannot listen on {address}: {exc}") from exc
    if bound == 0:
        raise OSError(f"gRPC server cannot listen on {address}")
    await server.start()
    return server, bound


async def stop_grpc_server(server: grpc.aio.Server, grace_s: float) -> None:
    """Refuse new RPCs, let those in flight finish for up to ``grace_s``, then cancel them."""
    await server.stop(grace_s)
