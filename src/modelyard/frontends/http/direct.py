"""Infer requests answered on uvicorn's own request cycle, without ASGI in between.

The HTTP protocol (:mod:`~modelyard.frontends.http.connections`) hands a
``POST /v2/models/{m}[/versions/{v}]/infer`` request here instead of starting the ASGI
app, when the app is the :class:`~modelyard.frontends.http.fastpath.InferFastPath`
itself (no layer in front of it to skip: with tokens configured, the auth layer is
outermost and every request keeps the ASGI path). The answer is what the ASGI route
answers, built by the same :class:`~modelyard.frontends.http.fastpath.InferHandler`; what
goes is the per-request machinery around it:

* the status line, headers and body leave in **one** ``write`` (uvicorn's ASGI ``send``
  writes the head and the body apart: two TCP segments, and the client may wake twice);
* no ASGI messages, header checks or disconnect watcher: a client that goes is seen by
  ``connection_lost``, which cancels the request's task (a queued request leaves its
  queue, as on the ASGI path), so a quick answer pays for no timer at all.

Errors, and anything unforeseen, are answered through the ASGI ``send`` of the cycle
with :func:`~modelyard.frontends.http.errors.answer_error`, as on the ASGI path.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from modelyard.errors import RequestCancelledError
from modelyard.frontends.http.errors import answer_error
from modelyard.frontends.http.fastpath import InferFastPath, InferHandler, infer_target

log = logging.getLogger("modelyard.http")

_STATUS_200 = b"HTTP/1.1 200 OK\r\n"
_JOIN_BELOW_BYTES = 64 * 1024
"""Bodies up to this size are copied behind the head (one buffer); larger ones are
written as a second buffer of the same ``writelines`` call, uncopied."""


def direct_handler(app: object) -> InferHandler | None:
    """The infer handler to call without ASGI, when ``app`` is the fast path itself."""
    return app.direct_infer if isinstance(app, InferFastPath) else None


def direct_target(cycle: RequestResponseCycle) -> tuple[str, str | None] | None:
    """``(model, version)`` when the cycle's request is an infer request, else None."""
    if cycle.scope["method"] != "POST":
        return None
    return infer_target(cycle.scope["path"])


async def answer_cycle(
    handler: InferHandler, cycle: RequestResponseCycle, model: str, version: str | None
) -> None:
    """Answer one infer request parsed by httptools on ``cycle`` (see the module
    docstring; a request read whole before the parser is answered by
    :func:`~modelyard.frontends.http.raw_cycle.answer_raw`)."""
    # uvicorn's typed ASGI callables are Starlette's plain ones (annotated, not cast:
    # typing.cast is a Python call, twice per request).
    scope: Scope = cycle.scope  # type: ignore[assignment]
    receive: Receive = cycle.receive  # type: ignore[assignment]
    try:
        try:
            payload, headers = await handler.answer(
                scope, receive, model, version, watch_disconnect=False
            )
        except asyncio.CancelledError:
            gone = client_gone(cycle.disconnected)
            if gone is None:
                raise  # the server is stopping: not the client's doing
            raise gone from None
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
    except Exception as exc:  # the server must keep serving whatever happened
        await answer_error_on(cycle, exc)
        return
    finally:
        # As uvicorn's run_asgi: the cycle must not call back into the protocol later.
        on_response = cycle.on_response
        cycle.on_response = nothing
    if cycle.disconnected:
        return
    cycle.response_started = True
    write_answer(cycle.transport, cycle.default_headers, headers, payload, cycle.keep_alive)
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    on_response()


def client_gone(disconnected: bool) -> RequestCancelledError | None:
    """For a direct request's cancelled task: the error answered to a client that went
    (the task uncancelled), or None when the server is stopping (the task stays cancelled)."""
    if not disconnected:
        return None
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    return RequestCancelledError("the client disconnected before its answer was ready")


async def answer_error_on(cycle: RequestResponseCycle, exc: Exception) -> None:
    """Answer ``exc`` through the cycle's ASGI ``send``, as the ASGI route would; if even
    that fails, close the connection."""
    scope: Scope = cycle.scope  # type: ignore[assignment]
    try:
        receive: Receive = cycle.receive  # type: ignore[assignment]
        send: Send = cycle.send  # type: ignore[assignment]
        await answer_error(exc, "POST", scope["path"])(scope, receive, send)
    except Exception:
        log.exception("could not answer an error on POST %s", scope["path"])
        cycle.transport.close()


def write_answer(
    transport: asyncio.WriteTransport,
    default_headers: list[tuple[bytes, bytes]],
    headers: list[tuple[bytes, bytes]],
    payload: bytes,
    keep_alive: bool,
) -> None:
    """Write a 200 answer: status line, headers and body in one call."""
    parts = [_STATUS_200]
    for name, value in (*default_headers, *headers):
        parts += (name, b": ", value, b"\r\n")
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    if len(payload) < _JOIN_BELOW_BYTES:
        parts.append(payload)
        transport.write(b"".join(parts))
    else:
        transport.writelines((b"".join(parts), payload))


def nothing() -> None:
    """The callback of a cycle that must not call back into its protocol any more."""
