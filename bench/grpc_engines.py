"""``modelyard serve`` with another gRPC engine, for bench_grpc_rest.py's side-by-side runs.

Run as ``python bench/grpc_engines.py ENGINE serve --config ...``: the server's own
``start_grpc_server`` / ``stop_grpc_server`` are swapped for one of the alternatives that
were measured against modelyard's asyncio HTTP/2 server and lost to it (BENCHMARKS.md,
section 4), then the usual CLI runs. Each serves the same servicer (same conversions, same
data plane) over another transport:

* ``grpcio-aio``: ``grpc.aio.server`` (modelyard's engine before), tuned: no interceptor,
  no compression, one generic handler table;
* ``grpcio-sync``: grpcio's synchronous server on a thread pool, each call handed to the
  server's event loop with ``run_coroutine_threadsafe``;
* ``grpclib``: the pure-asyncio ``grpclib`` server (``h2`` underneath).

Bench only: no TLS and no auth (the bench uses neither).
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from modelyard.frontends.grpc import server as modelyard_grpc
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.rpc import Method, RpcContext, RpcError

ENGINES = ("grpcio-aio", "grpcio-sync", "grpclib")
SERVICE = modelyard_grpc.SERVICE


def _methods(dataplane: Any) -> dict[str, Method]:
    return {
        path.decode().rsplit("/", 1)[1]: method
        for path, method in modelyard_grpc.method_table(dataplane).items()
    }


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


def _context(metadata: Any, remaining: float | None) -> RpcContext:
    loop = asyncio.get_running_loop()
    deadline = None if remaining is None else loop.time() + remaining
    return RpcContext(tuple(metadata or ()), deadline, loop.time)


# ---------------------------------------------------------------------- grpc.aio


def _aio_handler(method: Method) -> Callable[..., Any]:
    async def handle(request: Any, context: Any) -> Any:
        try:
            return await method.handler(
                request, _context(context.invocation_metadata(), context.time_remaining())
            )
        except RpcError as exc:
            await context.abort(exc.code, exc.details, exc.metadata)

    return handle


async def start_aio(dataplane: Any, host: str, port: int, max_bytes: int, **kw: Any) -> Any:
    server = grpc.aio.server(
        maximum_concurrent_rpcs=kw.get("max_concurrent_rpcs"),
        compression=grpc.Compression.NoCompression,
        options=[
            ("grpc.max_send_message_length", max_bytes),
            ("grpc.max_receive_message_length", max_bytes),
            ("grpc.so_reuseport", 0),
            ("grpc.max_concurrent_streams", kw.get("max_concurrent_streams", 128)),
        ],
    )
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            _aio_handler(m), request_deserializer=m.deserialize, response_serializer=_serialize
        )
        for name, m in _methods(dataplane).items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    bound = server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server, bound


async def stop_aio(server: Any, grace_s: float) -> None:
    await server.stop(grace_s)


# ---------------------------------------------------------------------- grpcio sync + threads


def _sync_handler(method: Method, loop: asyncio.AbstractEventLoop) -> Callable[..., Any]:
    def handle(request: Any, context: Any) -> Any:
        metadata = tuple(context.invocation_metadata() or ())
        remaining = context.time_remaining()

        async def run() -> Any:
            return await method.handler(request, _context(metadata, remaining))

        try:
            return asyncio.run_coroutine_threadsafe(run(), loop).result()
        except RpcError as exc:
            context.set_trailing_metadata(exc.metadata)
            context.abort(exc.code, exc.details)

    return handle


async def start_sync(dataplane: Any, host: str, port: int, max_bytes: int, **kw: Any) -> Any:
    loop = asyncio.get_running_loop()
    server = grpc.server(
        ThreadPoolExecutor(max_workers=16),
        maximum_concurrent_rpcs=kw.get("max_concurrent_rpcs"),
        options=[
            ("grpc.max_send_message_length", max_bytes),
            ("grpc.max_receive_message_length", max_bytes),
            ("grpc.so_reuseport", 0),
        ],
    )
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            _sync_handler(m, loop),
            request_deserializer=m.deserialize,
            response_serializer=_serialize,
        )
        for name, m in _methods(dataplane).items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    bound = server.add_insecure_port(f"{host}:{port}")
    server.start()
    return server, bound


async def stop_sync(server: Any, grace_s: float) -> None:
    stopped: threading.Event = server.stop(grace_s)
    await asyncio.get_running_loop().run_in_executor(None, stopped.wait)


# ---------------------------------------------------------------------- grpclib


async def start_grpclib(dataplane: Any, host: str, port: int, max_bytes: int, **kw: Any) -> Any:
    from grpclib.const import Cardinality, Handler, Status
    from grpclib.exceptions import GRPCError
    from grpclib.server import Server

    service = pb.DESCRIPTOR.services_by_name[SERVICE.rsplit(".", 1)[1]]

    def handler(method: Method) -> Callable[..., Any]:
        async def handle(stream: Any) -> None:
            request = await stream.recv_message()
            remaining = None if stream.deadline is None else stream.deadline.time_remaining()
            metadata = [(k, v) for k, v in stream.metadata.items() if isinstance(v, str)]
            try:
                response = await method.handler(request, _context(metadata, remaining))
            except RpcError as exc:
                raise GRPCError(Status(exc.code.value[0]), exc.details) from None
            await stream.send_message(response)

        return handle

    methods = _methods(dataplane)
    mapping = {
        f"/{SERVICE}/{m.name}": Handler(
            handler(methods[m.name]),
            Cardinality.UNARY_UNARY,
            getattr(pb, m.input_type.name),
            getattr(pb, m.output_type.name),
        )
        for m in service.methods
    }

    class _Service:
        def __mapping__(self) -> dict[str, Any]:
            return mapping

    server = Server([_Service()])
    await server.start(host, port)
    sockets = server._server.sockets if server._server is not None else ()
    return server, sockets[0].getsockname()[1]


async def stop_grpclib(server: Any, grace_s: float) -> None:
    server.close()
    await asyncio.wait_for(server.wait_closed(), grace_s)


STARTS = {"grpcio-aio": start_aio, "grpcio-sync": start_sync, "grpclib": start_grpclib}
STOPS = {"grpcio-aio": stop_aio, "grpcio-sync": stop_sync, "grpclib": stop_grpclib}


def main() -> None:
    engine = sys.argv.pop(1)
    if engine not in STARTS:
        raise SystemExit(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
    # app.py imports these names when it starts gRPC, so the swap takes effect.
    modelyard_grpc.start_grpc_server = STARTS[engine]  # type: ignore[assignment]
    modelyard_grpc.stop_grpc_server = STOPS[engine]  # type: ignore[assignment]
    from modelyard.cli import main as serve

    sys.argv[0] = "modelyard"
    sys.exit(serve())


if __name__ == "__main__":
    main()
