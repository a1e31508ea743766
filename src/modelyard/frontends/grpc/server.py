"""The gRPC server: an asyncio HTTP/2 listener on the server's event loop, and its stop.

gRPC calls are served by :mod:`modelyard.frontends.grpc.connection` (HTTP/2 on asyncio)
rather than by grpcio's server: grpcio's asyncio server spends several times REST's CPU
per call in its completion-queue bridge (BENCHMARKS.md, section 4).
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass

from modelyard.config.security import SecurityConfig
from modelyard.frontends.auth import Authorizer
from modelyard.frontends.grpc.auth import grpc_plane
from modelyard.frontends.grpc.connection import GrpcConnection
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.rpc import Limits, Method, ServerState
from modelyard.frontends.grpc.servicer import DataPlaneProtocol, InferenceServicer

SERVICE = "inference.GRPCInferenceService"
BACKLOG = 2048


def _address(host: str, port: int) -> str:
    # A bare IPv6 literal needs brackets before the port.
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


@dataclass(slots=True)
class GrpcServer:
    """A running gRPC listener and the state its connections share."""

    listener: asyncio.Server
    state: ServerState


def server_credentials(security: SecurityConfig) -> ssl.SSLContext | None:
    """A TLS context (HTTP/2 by ALPN; client CA → mutual TLS); None: plaintext.

    Raises OSError when a file cannot be read.
    """
    if security.tls_certfile is None or security.tls_keyfile is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(security.tls_certfile, security.tls_keyfile)
        ca = security.tls_client_ca_file
        if ca is not None:
            context.load_verify_locations(ca)
            context.verify_mode = ssl.CERT_REQUIRED
    except ssl.SSLError as exc:
        raise OSError(f"bad TLS file: {exc}") from exc
    context.set_alpn_protocols(["h2"])
    return context


def method_table(dataplane: DataPlaneProtocol) -> dict[bytes, Method]:
    """Every RPC of the inference service by its path, bound to one servicer."""
    servicer = InferenceServicer(dataplane)
    methods = {}
    for method in pb.DESCRIPTOR.services_by_name[SERVICE.rsplit(".", 1)[1]].methods:
        path = f"/{SERVICE}/{method.name}"
        request_class = getattr(pb, method.input_type.name)
        methods[path.encode()] = Method(
            plane=grpc_plane(path),
            deserialize=request_class.FromString,
            handler=getattr(servicer, method.name),
        )
    return methods


async def start_grpc_server(
    dataplane: DataPlaneProtocol,
    host: str,
    port: int,
    max_message_bytes: int,
    *,
    authorizer: Authorizer | None = None,
    credentials: ssl.SSLContext | None = None,
    max_concurrent_streams: int = 128,
    max_connection_idle_s: float = 300.0,
    max_concurrent_rpcs: int | None = None,
    handshake_timeout_s: float = 10.0,
) -> tuple[GrpcServer, int]:
    """Start the KServe v2 gRPC server on ``host:port`` and return it with its bound port.

    ``port`` 0 picks a free port. A message over ``max_message_bytes`` either way ends
    its call with RESOURCE_EXHAUSTED. ``authorizer`` checks each call's token;
    ``credentials`` (see :func:`server_credentials`) serve TLS. One connection may have
    at most ``max_concurrent_streams`` calls open, the server runs at most
    ``max_concurrent_rpcs`` at once (RESOURCE_EXHAUSTED beyond), and a connection
    without calls for ``max_connection_idle_s`` is closed, as is one that has not
    completed its TLS and HTTP/2 handshakes within ``handshake_timeout_s`` (a silent
    client). Must run on the server's event loop; raises OSError when it cannot listen.
    """
    if max_message_bytes <= 0:
        raise ValueError(f"max_message_bytes must be positive, got {max_message_bytes}")
    state = ServerState(
        methods=method_table(dataplane),
        limits=Limits(
            max_message_bytes=max_message_bytes,
            max_concurrent_streams=max_concurrent_streams,
            max_concurrent_rpcs=max_concurrent_rpcs,
            max_connection_idle_s=max_connection_idle_s,
            handshake_timeout_s=handshake_timeout_s,
        ),
        authorizer=authorizer if authorizer is not None and authorizer.is_enabled else None,
    )
    loop = asyncio.get_running_loop()
    try:
        listener = await loop.create_server(
            lambda: GrpcConnection(state),
            host,
            port,
            ssl=credentials,
            ssl_handshake_timeout=handshake_timeout_s if credentials is not None else None,
            backlog=BACKLOG,
            reuse_address=True,
        )
    except OSError as exc:
        raise OSError(f"gRPC server cannot listen on {_address(host, port)}: {exc}") from exc
    bound: int = listener.sockets[0].getsockname()[1]
    return GrpcServer(listener, state), bound


def running_calls(connections: set[GrpcConnection]) -> int:
    """How many calls the ``connections`` still have open."""
    return sum(len(c.streams) for c in connections)


async def stop_grpc_server(server: GrpcServer, grace_s: float) -> None:
    """Refuse new calls, let those in flight finish for up to ``grace_s``, then cancel them."""
    state = server.state
    state.draining = True
    server.listener.close()
    for connection in list(state.connections):
        connection.shutdown()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while running_calls(state.connections) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    for connection in list(state.connections):
        connection.cancel_calls()
    await server.listener.wait_closed()
