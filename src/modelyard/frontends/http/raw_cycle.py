"""A raw infer request in flight, without uvicorn's per-request objects.

A request read whole by :func:`~modelyard.frontends.http.raw_infer.parse_raw_infer` has
its body already, and its answer leaves in one write: it needs no ASGI scope (with its
copy of the app state), no ``RequestResponseCycle`` (twenty attributes and an
``asyncio.Event``) to be answered. What the protocol reads of the request in flight,
ours (:mod:`~modelyard.frontends.http.connections`) and uvicorn's ``HttpToolsProtocol``
methods through ``self.cycle`` (``connection_lost``, ``shutdown``, the pipelining check
of ``on_headers_complete``), is kept in a :class:`RawCycle` of five slots: whether its
response is complete, whether the client went, whether the connection stays open.

Only an error needs the ASGI machinery: then the protocol builds the scope and a real
cycle from what the :class:`RawCycle` kept (:meth:`RawHost.raw_error_cycle`), and the
error is answered through its ``send``, exactly as on the other paths.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from modelyard.frontends.http.direct import answer_error_on, client_gone, nothing, write_answer

if TYPE_CHECKING:
    from uvicorn.protocols.http.flow_control import FlowControl
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
    from uvicorn.server import ServerState

    from modelyard.frontends.http.fastpath import InferHandler
    from modelyard.frontends.http.raw_infer import RawInfer


class RawHost(Protocol):
    """What :func:`answer_raw` needs of the connection's protocol."""

    transport: asyncio.Transport
    flow: FlowControl
    server_state: ServerState

    def raw_response_complete(self) -> None:
        """The answer was written (uvicorn's ``on_response_complete`` for a raw request)."""

    def raw_error_cycle(self, request: RawCycle) -> RequestResponseCycle:
        """A real request cycle for ``request``, to answer an error on."""


class _Unwatched:
    """The message event of a raw request: uvicorn's ``connection_lost`` sets the
    cycle's event, but nothing waits on it (the body was read with the head)."""

    __slots__ = ()

    def set(self) -> None:
        """Nothing waits: nothing to wake."""


_UNWATCHED = _Unwatched()


class RawCycle:
    """One raw infer request in flight: what is read of ``self.cycle`` while it is."""

    __slots__ = ("disconnected", "host", "keep_alive", "raw", "response_complete")

    more_body = False
    """Its body was read with its head (the protocol's body timer reads this)."""
    message_event = _UNWATCHED

    def __init__(self, host: RawHost, raw: RawInfer) -> None:
        self.host = host
        self.raw = raw
        self.keep_alive = raw.keep_alive
        """False after ``Connection: close`` or once a graceful shutdown began."""
        self.disconnected = False
        self.response_complete = False


async def answer_raw(handler: InferHandler, request: RawCycle) -> None:
    """Answer one raw infer request (the same bytes as
    :func:`~modelyard.frontends.http.direct.answer_cycle` writes for it)."""
    raw = request.raw
    host = request.host
    try:
        try:
            payload, headers = await handler.answer_body(
                raw.model, raw.version, raw.body, raw.header_length, raw.timeout_ms
            )
        except asyncio.CancelledError:
            gone = client_gone(request.disconnected)
            if gone is None:
                raise  # the server is stopping: not the client's doing
            raise gone from None
        flow = host.flow
        if flow.write_paused and not request.disconnected:
            await flow.drain()
    except Exception as exc:  # the server must keep serving whatever happened
        cycle = host.raw_error_cycle(request)
        try:
            await answer_error_on(cycle, exc)
        finally:
            # As uvicorn's run_asgi: the cycle must not call back into the protocol later.
            cycle.on_response = nothing
        return
    if request.disconnected:
        return
    transport = host.transport
    write_answer(transport, host.server_state.default_headers, headers, payload, request.keep_alive)
    request.response_complete = True
    if not request.keep_alive:
        transport.close()
    host.raw_response_complete()
