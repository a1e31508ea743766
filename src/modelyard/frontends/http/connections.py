"""HTTP connections that cannot be held hostage: a head deadline, a body idle deadline
and a connection cap, on public interfaces only.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) and answers 503 past
``limit_concurrency``, but it has no limit on how long a client may take to send a
request head or a body, and it accepts connections until descriptors run out. A
:class:`ConnectionGuard` adds what it lacks from two public hooks:

* a **protocol class** given to uvicorn through its documented ``http=`` option: a
  subclass of uvicorn's httptools protocol that overrides only ``asyncio.Protocol``'s
  own methods (``connection_made``, ``data_received``, ``connection_lost``), always
  calling uvicorn's, and touches nothing of uvicorn's but the transport asyncio gives it;
* an **ASGI middleware** (:class:`GuardLayer`, outermost): uvicorn calls the app once a
  request head is complete, so the app call is where the head deadline ends; its
  ``receive`` says when the body is complete; its return says when the request is over.
  The two meet on the connection's peer address (the scope's ``client``).

What is guarded:

* **head deadline**: from the moment a connection opens (or a new request's first byte
  arrives on a kept-alive one), the complete request head must arrive within
  ``header_timeout_s``, or the connection is closed;
* **body idle deadline**: while the app waits for body bytes that do not come, the
  connection is closed once ``body_idle_timeout_s`` passes without any;
* **connection cap**: when a new connection takes the count over ``max_connections``,
  the oldest connection not in a request (waiting for its head, or idle between
  keep-alive requests) is closed to make room; if every connection is busy, the
  middleware answers 503 (uvicorn's ``limit_concurrency``, set past the overflow, is a
  backstop), and beyond a small overflow the new connection is closed at once, so
  descriptors never run out.
"""

from __future__ import annotations

import asyncio
from time import monotonic
from typing import Any, cast

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from modelyard.frontends.http.coalesce import CoalescingTransport

_HEAD = 0
"""Waiting for a request head (a new connection, or one between requests)."""
_REQUEST = 1
"""A request's app is running: no head deadline; a body deadline while it waits for bytes."""


def overflow_connections(max_connections: int) -> int:
    """Connections accepted past the cap only to be answered 503 (then closed)."""
    return max(16, max_connections // 8)


class _Connection:
    """What the guard knows of one connection."""

    __slots__ = ("active", "gone", "last_data_at", "state", "task", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.state = _HEAD
        self.active = 0
        """Requests whose app is running (more than one only when pipelined)."""
        self.last_data_at = 0.0
        self.task: asyncio.Task[Any] | None = None
        """The task of the request now running (the newest, when pipelined)."""
        self.gone = False
        """The connection was lost while a request ran: its task was cancelled."""

    def close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()


class ConnectionGuard:
    """The deadlines and the cap of one HTTP server (one port).

    Deadlines are checked by one sweep every quarter of the shorter deadline (at most
    every second), not by a timer per request: a request pays a few dict operations.
    """

    def __init__(
        self, header_timeout_s: float, body_idle_timeout_s: float, max_connections: int
    ) -> None:
        self.header_timeout_s = header_timeout_s
        self.body_idle_timeout_s = body_idle_timeout_s
        self.max_connections = max_connections
        self.hard_cap = max_connections + overflow_connections(max_connections)
        self.connections: dict[tuple[str, int], _Connection] = {}
        """Every open connection, by peer address (the ASGI scope's ``client``)."""
        self.idle: dict[tuple[str, int], None] = {}
        """Connections not in a request, oldest first (dicts keep insertion order)."""
        self.heads: dict[tuple[str, int], float] = {}
        """Connections whose head is due, and since when (oldest first)."""
        self.bodies: dict[_Connection, None] = {}
        """Connections whose app waits for body bytes now."""
        self._tick_s = max(0.02, min(1.0, header_timeout_s / 4, body_idle_timeout_s / 4))
        self._sweeper: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ protocol side

    def opened(self, peer: tuple[str, int], transport: asyncio.Transport) -> _Connection | None:
        """Count a new connection; None when it must be closed at once (over the cap
        with every other connection busy)."""
        conn = _Connection(transport)
        self.closed(peer, None)  # an address reused before its old connection was lost
        self.connections[peer] = conn
        crowded = len(self.connections) > self.max_connections
        if crowded and not self._displace_one(peer) and len(self.connections) > self.hard_cap:
            return None
        self.idle[peer] = None
        self._head_due(peer)
        return conn

    def received(self, peer: tuple[str, int]) -> None:
        """Bytes arrived: a head now under way is due within the deadline; a body's
        bytes are progress."""
        conn = self.connections.get(peer)
        if conn is None:
            return
        if conn.state == _HEAD:
            if peer not in self.heads:
                self._head_due(peer)
        else:
            conn.last_data_at = monotonic()

    def closed(self, peer: tuple[str, int], conn: _Connection | None) -> None:
        """Forget the connection at ``peer`` (only if it is ``conn``, when given)."""
        known = self.connections.get(peer)
        if known is None or (conn is not None and known is not conn):
            return
        del self.connections[peer]
        self.idle.pop(peer, None)
        self.heads.pop(peer, None)
        self.bodies.pop(known, None)
        task = known.task
        if known.active and task is not None and not task.done():
            # The client went: its request's work stops (a queued one leaves its queue).
            known.gone = True
            task.cancel()

    # ------------------------------------------------------------------ app side

    def request_started(self, peer: tuple[str, int]) -> _Connection | None:
        """A request's head is complete (its app is called): no head deadline now."""
        conn = self.connections.get(peer)
        if conn is None:
            return None
        self.idle.pop(peer, None)
        self.heads.pop(peer, None)
        conn.state = _REQUEST
        conn.active += 1
        conn.last_data_at = monotonic()
        return conn

    def waiting_body(self, conn: _Connection, waiting: bool) -> None:
        """The app starts (True) or stops (False) waiting for body bytes."""
        if waiting:
            self.bodies[conn] = None
            self._sweep_soon()
        else:
            self.bodies.pop(conn, None)

    def request_done(self, peer: tuple[str, int], conn: _Connection) -> None:
        """The request's app returned: the connection waits for its next head."""
        conn.active -= 1
        if conn.active or self.connections.get(peer) is not conn or conn.transport.is_closing():
            return  # a pipelined request runs on, or the connection is gone
        self.bodies.pop(conn, None)
        conn.state = _HEAD
        self.idle[peer] = None  # the newest idle connection: displaced last

    # ------------------------------------------------------------------ deadlines

    def _head_due(self, peer: tuple[str, int]) -> None:
        self.heads[peer] = monotonic()
        self._sweep_soon()

    def _sweep_soon(self) -> None:
        if self._sweeper is None:
            loop = asyncio.get_running_loop()
            self._sweeper = loop.call_later(self._tick_s, self._sweep)

    def _sweep(self) -> None:
        """Close the connections past a deadline; sweep again while any deadline runs."""
        self._sweeper = None
        now = monotonic()
        cutoff = now - self.header_timeout_s
        late: list[tuple[str, int]] = []
        for peer, since in self.heads.items():
            if since > cutoff:
                break  # oldest first: the rest are due later
            late.append(peer)
        for peer in late:
            del self.heads[peer]
            self.connections[peer].close()
        cutoff = now - self.body_idle_timeout_s
        stalled = [conn for conn in self.bodies if conn.last_data_at <= cutoff]
        for conn in stalled:
            del self.bodies[conn]
            conn.close()
        if self.heads or self.bodies:
            self._sweep_soon()

    def _displace_one(self, newcomer: tuple[str, int]) -> bool:
        for peer in self.idle:
            if peer != newcomer:
                # Uncounted at once (its connection_lost comes a loop turn later), so
                # a request that arrives meanwhile is not taken for one over the cap.
                self.idle.pop(peer)
                self.heads.pop(peer, None)
                self.connections.pop(peer).close()
                return True
        return False

    def over_cap(self) -> bool:
        """More connections than the cap: every one busy, none could be displaced."""
        return len(self.connections) > self.max_connections

    # ------------------------------------------------------------------ the two hooks

    def protocol_class(self) -> type[asyncio.Protocol]:
        """The protocol class for uvicorn's ``http=`` option, bound to this guard."""
        guard = self

        class GuardedHttpProtocol(HttpToolsProtocol):
            """uvicorn's httptools protocol, counted and timed by the guard."""

            _peer: tuple[str, int] | None = None
            _conn: _Connection | None = None

            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                """Let uvicorn set up (on a transport that joins each answer's writes),
                then count the connection (or close it: over the cap)."""
                loop = asyncio.get_running_loop()
                joined = CoalescingTransport(cast(asyncio.Transport, transport), loop)
                super().connection_made(joined)
                peer = peer_of(transport.get_extra_info("peername"))
                if peer is None:
                    return  # not TCP: nothing to guard by address
                self._peer = peer
                # uvloop's transports are not asyncio.Transport subclasses, alike in use.
                stream = cast(asyncio.Transport, transport)
                self._conn = guard.opened(peer, stream)
                if self._conn is None:
                    stream.abort()

            def data_received(self, data: bytes) -> None:
                """Time the head or the body these bytes belong to, then parse them."""
                if self._peer is not None:
                    guard.received(self._peer)
                super().data_received(data)

            def connection_lost(self, exc: Exception | None) -> None:
                """Forget the connection, then let uvicorn clean up."""
                if self._peer is not None:
                    guard.closed(self._peer, self._conn)
                super().connection_lost(exc)

        return GuardedHttpProtocol


def peer_of(address: Any) -> tuple[str, int] | None:
    """A TCP peer address as uvicorn writes the scope's ``client`` (None: not TCP)."""
    if isinstance(address, (tuple, list)) and len(address) >= 2:
        return str(address[0]), int(address[1])
    return None


async def _service_unavailable(send: Send) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": b"Service Unavailable"})


class GuardLayer:
    """ASGI middleware, outermost: tells the guard when each request's head is complete,
    when its app waits for body bytes, and when it is over; the request's task is
    cancelled if its connection is lost before then (its work stops, a queued request
    leaves its queue), which costs a request nothing while its client stays."""

    def __init__(self, guard: ConnectionGuard, app: ASGIApp) -> None:
        self.guard = guard
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app with the connection marked busy, its body reads timed."""
        peer = scope.get("client") if scope["type"] == "http" else None
        if peer is not None and type(peer) is not tuple:
            peer = peer_of(peer)  # uvicorn's is already the tuple the protocol keys by
        conn = None if peer is None else self.guard.request_started(peer)
        if peer is None or conn is None:
            await self.app(scope, receive, send)
            return
        guard = self.guard
        if guard.over_cap():
            await _service_unavailable(send)
            guard.request_done(peer, conn)
            return
        body_done = False

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            guard.waiting_body(conn, True)
            try:
                message = await receive()
            finally:
                guard.waiting_body(conn, False)
            conn.last_data_at = monotonic()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        task = conn.task = asyncio.current_task()
        try:
            await self.app(scope, timed_receive, send)
        except asyncio.CancelledError:
            if not conn.gone or task is None:
                raise  # the server is stopping: not the client's doing
            task.uncancel()  # the client went: nobody to answer
        finally:
            guard.request_done(peer, conn)
