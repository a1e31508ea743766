"""The gRPC server: grpcio's asyncio server (``grpc.aio``) with modelyard's servicer on top.

grpcio's C core owns the transport (HTTP/2 framing, HPACK, flow control, keepalive, the
RFC 9113 checks); every bound modelyard puts on it is one of grpcio's own options
(:func:`server_options`), so none of them depends on code this project would have to
keep correct against HTTP/2 attacks. Authentication is a server interceptor
(:class:`modelyard.frontends.grpc.auth.AuthInterceptor`). See
``docs/decisions/0031-grpc-on-grpcio.md`` for why grpcio rather than a server of our own.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from modelyard.config.security import SecurityConfig
from modelyard.frontends.auth import Authorizer
from modelyard.frontends.grpc.auth import AuthInterceptor
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from modelyard.frontends.grpc.servicer import DataPlaneProtocol, InferenceServicer

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    """The bounds of one gRPC server, all enforced by grpcio itself.

    Together they bound the request bytes the server can hold at once: grpcio buffers
    at most one message of ``max_message_bytes`` per running RPC, and runs at most
    :attr:`concurrent_rpcs` RPCs, so an attacker sending bodies that never end holds at
    most ``max_message_bytes * concurrent_rpcs`` (``max_buffered_bytes``), whatever the
    number of connections or streams.
    """

    max_message_bytes: int = 4 * MIB
    """Largest message either way; beyond it RESOURCE_EXHAUSTED ("Received message
    larger than max (N vs. LIMIT)")."""
    max_buffered_bytes: int = 256 * MIB
    """Request bytes held at once, all RPCs together (see the class docstring)."""
    max_concurrent_rpcs: int = 1024
    """RPCs running at once, server-wide (further capped by ``max_buffered_bytes``)."""
    max_concurrent_streams: int = 128
    """RPCs one connection may have open (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS)."""
    max_connections: int = 256
    """Open connections on the port; beyond it new connections are refused, so that a
    flood of connections on the gRPC port cannot take the descriptors REST needs."""
    max_connection_idle_s: float = 300.0
    """A connection without RPCs for this long gets GOAWAY."""
    max_connection_age_s: float = 600.0
    """Every connection gets GOAWAY at this age (clients reconnect transparently): the
    deadline of a call that stays open without progress, e.g. an unfinished body."""
    max_connection_age_grace_s: float = 60.0
    """After the age GOAWAY, calls still running get this long before the close."""
    handshake_timeout_s: float = 10.0
    """A connection must finish its TLS and HTTP/2 handshakes within this long."""
    min_ping_interval_s: float = 10.0
    """Client PINGs closer than this without data in between are strikes; after
    :attr:`max_ping_strikes` of them, GOAWAY (ENHANCE_YOUR_CALM, "too_many_pings")."""
    max_ping_strikes: int = 2
    keepalive_s: float = 60.0
    """The server PINGs an idle connection this often, and closes it when the answer
    does not come within ``keepalive_timeout_s`` (a vanished peer)."""
    keepalive_timeout_s: float = 20.0

    @property
    def concurrent_rpcs(self) -> int:
        """RPCs run at once: ``max_concurrent_rpcs`` capped by the buffered-bytes bound."""
        by_bytes = max(1, self.max_buffered_bytes // self.max_message_bytes)
        return min(self.max_concurrent_rpcs, by_bytes)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def server_options(limits: GrpcLimits) -> list[tuple[str, int]]:
    """grpcio's channel arguments for ``limits``."""
    return [
        ("grpc.max_send_message_length", limits.max_message_bytes),
        ("grpc.max_receive_message_length", limits.max_message_bytes),
        # Without this, Linux lets a second server bind the same port silently.
        ("grpc.so_reuseport", 0),
        ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
        ("grpc.max_allowed_incoming_connections", limits.max_connections),
        ("grpc.max_connection_idle_ms", _ms(limits.max_connection_idle_s)),
        ("grpc.max_connection_age_ms", _ms(limits.max_connection_age_s)),
        ("grpc.max_connection_age_grace_ms", _ms(limits.max_connection_age_grace_s)),
        ("grpc.server_handshake_timeout_ms", _ms(limits.handshake_timeout_s)),
        ("grpc.http2.min_ping_interval_without_data_ms", _ms(limits.min_ping_interval_s)),
        ("grpc.http2.max_ping_strikes", limits.max_ping_strikes),
        ("grpc.keepalive_time_ms", _ms(limits.keepalive_s)),
        ("grpc.keepalive_timeout_ms", _ms(limits.keepalive_timeout_s)),
    ]


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
    limits: GrpcLimits,
    *,
    authorizer: Authorizer | None = None,
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Start the KServe v2 gRPC server on ``host:port`` and return it with its bound port.

    ``port`` 0 picks a free port. ``limits`` are applied by grpcio (see
    :class:`GrpcLimits`); ``authorizer`` checks each call's token; ``credentials`` (see
    :func:`server_credentials`) serve TLS. Must run on the server's event loop; raises
    OSError when it cannot listen.
    """
    if limits.max_message_bytes <= 0:
        raise ValueError(f"max_message_bytes must be positive, got {limits.max_message_bytes}")
    interceptors = (
        [AuthInterceptor(authorizer)] if authorizer is not None and authorizer.is_enabled else []
    )
    server = grpc.aio.server(
        interceptors=interceptors,
        maximum_concurrent_rpcs=limits.concurrent_rpcs,
        options=server_options(limits),
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
