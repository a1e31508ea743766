"""HTTP connections that cannot be held hostage: a head deadline and a connection cap.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but has no limit
on how long a client may take to send a request head: a connection that opens and
says nothing, or sends a byte a minute, is kept forever. Enough of them exhaust the
process's file descriptors, and then every good client fails. This protocol, a small
subclass of uvicorn's httptools protocol (independent of the ASGI app), adds:

* a **head deadline**: from the moment a connection opens (or a new request's first
  byte arrives on a kept-alive one), the complete request head must arrive within
  ``header_timeout_s``, or the connection is closed;
* a **body idle timeout**: a request whose body stops arriving for ``body_idle_timeout_s``
  closes its connection (a timer is armed only for bodies that span several reads);
* a **connection cap**: when a new connection takes the count over
  ``max_connections``, the oldest connection that is not in a request (still waiting
  for its head, or idle between keep-alive requests) is closed to make room; if every
  connection is busy, uvicorn's own ``limit_concurrency`` answers 503, and beyond a
  small overflow the new connection is closed at once, so descriptors never run out.

It also answers infer requests on their request cycle without ASGI when the app allows
it (see :mod:`~modelyard.frontends.http.direct`): the hot route's per-request cost. One
read whole is answered with no uvicorn request cycle at all
(:mod:`~modelyard.frontends.http.raw_cycle`), and its keep-alive timer is armed lazily:
one timer per idle spell, not one per request (uvicorn arms one after every answer and
cancels it on the next request); when it fires on a connection that answered meanwhile,
it re-arms for the rest of the idle timeout.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from modelyard.frontends.http.direct import answer_cycle, direct_handler, direct_target
from modelyard.frontends.http.fastpath import InferHandler
from modelyard.frontends.http.raw_cycle import RawCycle, answer_raw
from modelyard.frontends.http.raw_infer import PREFIX, RawInfer, parse_raw_infer

if TYPE_CHECKING:
    from uvicorn._types import ASGI3Application


def overflow_connections(max_connections: int) -> int:
    """Connections accepted past the cap only to be answered 503 (then closed)."""
    return max(16, max_connections // 8)


def guarded_protocol(
    header_timeout_s: float, max_connections: int, body_idle_timeout_s: float = 30.0
) -> type[asyncio.Protocol]:
    """A protocol class for one server (its own record of connections not in a request)."""
    hard_cap = max_connections + overflow_connections(max_connections)
    # Connections not in a request, oldest first (dicts keep insertion order).
    waiting: dict[GuardedHttpProtocol, None] = {}

    class GuardedHttpProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol with a head deadline and a connection cap."""

        _head_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None
        _last_data_at = 0.0
        _direct_infer: InferHandler | None = None
        _direct: tuple[RequestResponseCycle | RawCycle, asyncio.Task[None]] | None = None
        """The infer request answered without ASGI now, and its task."""
        _in_message = False
        _idle_since = 0.0
        """When the last answer was complete (the keep-alive timeout counts from it)."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            """Count the connection, make room if over the cap, start the head deadline."""
            super().connection_made(transport)
            self._direct_infer = direct_handler(self.app)
            crowded = len(self.connections) > max_connections
            if crowded and not self._displace_one() and len(self.connections) > hard_cap:
                transport.abort()
                return
            waiting[self] = None
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_too_late)

        def connection_lost(self, exc: Exception | None) -> None:
            """Forget the connection and its deadlines; cancel a direct infer request."""
            waiting.pop(self, None)
            self._cancel_head_timer()
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None
            super().connection_lost(exc)
            direct, self._direct = self._direct, None
            if direct is not None and not direct[0].response_complete:
                # The client went: the request's work stops (it leaves its queue).
                direct[0].disconnected = True
                direct[0].message_event.set()
                direct[1].cancel()

        def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
            # NOTE: overrides a private uvicorn method (the one place a request cycle is
            # started, pipelined ones included); tests/integration pin the direct path.
            handler = self._direct_infer
            if handler is not None and app is self.app:
                target = direct_target(cycle)
                if target is not None:
                    task = self.loop.create_task(answer_cycle(handler, cycle, *target))
                    task.add_done_callback(self.tasks.discard)
                    self.tasks.add(task)
                    self._direct = (cycle, task)
                    return
            super()._start_asgi_task(cycle, app)

        def data_received(self, data: bytes) -> None:
            """Answer a whole infer request read at once; else feed the parser, and time a
            head or a body that is still to come."""
            handler = self._direct_infer
            if handler is not None and data.startswith(PREFIX) and self._between_messages():
                raw = parse_raw_infer(data, handler.max_request_bytes)
                if raw is not None:
                    self._start_raw(handler, raw)
                    return
            self._last_data_at = self.loop.time()
            super().data_received(data)
            if self in waiting:
                # Part of a head (a whole one would have left ``waiting``): it is due
                # within the deadline. Heads that arrive in one read never arm a timer.
                if self._head_timer is None:
                    self._head_timer = self.loop.call_later(header_timeout_s, self._head_too_late)
                return
            cycle = self.cycle
            if (
                self._body_timer is None
                and cycle is not None
                and cycle.more_body
                and not cycle.response_complete
            ):
                self._body_timer = self.loop.call_later(body_idle_timeout_s, self._body_stalled)

        def _between_messages(self) -> bool:
            # What uvicorn would do with a new request now is start it: no message half
            # parsed, none answering or queued behind one, no 503 for the concurrency cap.
            cycle = self.cycle
            limit = self.limit_concurrency
            return (
                not self._in_message
                and (cycle is None or cycle.response_complete)
                and not self.pipeline
                and not self.root_path
                and (limit is None or (len(self.connections) < limit and len(self.tasks) < limit))
            )

        def _start_raw(self, handler: InferHandler, raw: RawInfer) -> None:
            # on_message_begin, on_headers_complete and on_message_complete in one, for a
            # request parsed by raw_infer. No scope, cycle or event (raw_cycle.py), and
            # the keep-alive timer stays armed: it sees the connection busy if it fires.
            waiting.pop(self, None)
            if self._head_timer is not None:
                self._cancel_head_timer()
            request = RawCycle(self, raw)
            # Read as a cycle by uvicorn's methods: RawCycle has what they read of one.
            self.cycle = request  # type: ignore[assignment]
            task = self.loop.create_task(answer_raw(handler, request))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)
            self._direct = (request, task)

        def raw_error_cycle(self, request: RawCycle) -> RequestResponseCycle:
            """The scope and request cycle ``_start_raw`` would have built, for an error
            to be answered through uvicorn's ASGI ``send``; it takes the request's place."""
            raw = request.raw
            scope = {
                "type": "http",
                "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
                "http_version": "1.1",
                "server": self.server,
                "client": self.client,
                "scheme": self.scheme,
                "root_path": "",
                "headers": raw.headers,
                "state": self.app_state.copy(),
                "method": "POST",
                "path": raw.path,
                "raw_path": raw.raw_path,
                "query_string": b"",
            }
            cycle = RequestResponseCycle(
                scope=scope,  # type: ignore[arg-type]
                transport=self.transport,
                flow=self.flow,
                logger=self.logger,
                access_logger=self.access_logger,
                access_log=self.access_log,
                default_headers=self.server_state.default_headers,
                message_event=asyncio.Event(),
                expect_100_continue=False,
                keep_alive=request.keep_alive,
                on_response=self.on_response_complete,
            )
            cycle.more_body = False  # the body was read with the head
            cycle.disconnected = request.disconnected
            if self.cycle is request:  # type: ignore[comparison-overlap]
                self.cycle = cycle
            direct = self._direct
            if direct is not None and direct[0] is request:
                self._direct = (cycle, direct[1])
            return cycle

        def raw_response_complete(self) -> None:
            """uvicorn's ``on_response_complete`` (and ours) for a raw request answered,
            but the keep-alive timer armed only if none is."""
            self.server_state.total_requests += 1
            if self.transport.is_closing():
                return
            flow = self.flow
            if flow.read_paused:
                flow.resume_reading()
            if self.pipeline:
                self._unset_keepalive_if_required()
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
                return
            self._idle_since = self.loop.time()
            if self.timeout_keep_alive_task is None:
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler
                )
            cycle = self.cycle  # a request read by httptools may be under way
            if cycle is None or cycle.response_complete:
                waiting[self] = None

        def timeout_keep_alive_handler(self) -> None:
            """Close the connection if it has been idle ``timeout_keep_alive`` since its
            last answer; if it answered since the timer was armed, wait for the rest."""
            self.timeout_keep_alive_task = None
            if self.transport.is_closing():
                return
            cycle = self.cycle
            if self._in_message or self.pipeline or not (cycle is None or cycle.response_complete):
                return  # busy: the answer arms the timer again
            idle = self.loop.time() - self._idle_since
            if idle >= self.timeout_keep_alive:
                self.transport.close()
            else:
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive - idle, self.timeout_keep_alive_handler
                )

        def on_message_begin(self) -> None:
            """httptools began a message: raw reads wait for its end."""
            self._in_message = True
            super().on_message_begin()

        def on_message_complete(self) -> None:
            """httptools ended a message: the next read may be taken raw."""
            super().on_message_complete()
            self._in_message = False

        def _body_stalled(self) -> None:
            self._body_timer = None
            cycle = self.cycle
            if cycle is None or not cycle.more_body or cycle.response_complete:
                return
            idle = self.loop.time() - self._last_data_at
            if idle >= body_idle_timeout_s:
                self._close()
            else:
                self._body_timer = self.loop.call_later(
                    body_idle_timeout_s - idle, self._body_stalled
                )

        def on_headers_complete(self) -> None:
            """The head arrived in time: the connection is busy with a request."""
            waiting.pop(self, None)
            self._cancel_head_timer()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            """Idle again (keep-alive): displaceable, and uvicorn's idle timeout runs."""
            self._idle_since = self.loop.time()
            super().on_response_complete()
            cycle = self.cycle  # a pipelined request may have started meanwhile
            if not self.transport.is_closing() and (cycle is None or cycle.response_complete):
                waiting[self] = None

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_too_late(self) -> None:
            self._head_timer = None
            if self in waiting:
                self._close()

        def _close(self) -> None:
            waiting.pop(self, None)
            if not self.transport.is_closing():
                self.transport.close()

        def _displace_one(self) -> bool:
            for other in waiting:
                if other is not self:
                    other._close()
                    return True
            return False

    return GuardedHttpProtocol
