"""The manager's end of one ingress channel: forwarded requests meet the real app.

Each ``REQUEST`` frame starts a task that calls the manager's own ASGI app (the one
a single-process server gives uvicorn): token check, body limits, routes, typed
errors, metrics and readiness are all decided here, once, for every ingress. The
app's ``receive`` reads the stream's body frames (then waits for a disconnect), and
its ``send`` writes response frames back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message

from modelyard.frontends.http.errors import answer_error
from modelyard.frontends.ingress.frames import (
    BODY,
    DISCONNECT,
    HELLO,
    REQUEST,
    RESPONSE_BODY,
    START,
    FrameProtocol,
    body_frame,
    decode_scope,
    encode_start,
    frame,
)

log = logging.getLogger("modelyard.ingress")

ABORT = 7
"""Manager → ingress: the app failed after its response started; drop the connection."""
_DISCONNECT: Message = {"type": "http.disconnect"}


class TunnelEnd:
    """Serves the requests one ingress process forwards over its channel."""

    def __init__(self, app: ASGIApp, on_request: Callable[[int], None] | None = None) -> None:
        self.app = app
        self.protocol = FrameProtocol(self._on_frame, self._on_lost)
        self.pid: int | None = None
        """The ingress process's id, once it has said hello."""
        self.hello = asyncio.Event()
        """Set when the ingress serves (its HTTP socket is being accepted on)."""
        self.lost = asyncio.Event()
        """Set when the channel closes (the ingress exited or was killed)."""
        self._on_request = on_request
        self._streams: dict[int, asyncio.Queue[Message]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def _on_frame(self, stream: int, kind: int, payload: bytes) -> None:
        if kind == BODY:
            queue = self._streams.get(stream)
            if queue is not None:
                queue.put_nowait(
                    {"type": "http.request", "body": payload[1:], "more_body": payload[0] == 1}
                )
        elif kind == REQUEST:
            queue = asyncio.Queue()
            self._streams[stream] = queue
            scope = decode_scope(payload)
            task = asyncio.get_running_loop().create_task(self._serve(stream, scope, queue))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            if self._on_request is not None and self.pid is not None:
                self._on_request(self.pid)
        elif kind == DISCONNECT:
            queue = self._streams.get(stream)
            if queue is not None:
                queue.put_nowait(_DISCONNECT)
        elif kind == HELLO:
            self.pid = int(payload)
            self.hello.set()

    def _on_lost(self) -> None:
        # The client connections of a dead ingress are gone: its requests are cancelled
        # like any request whose client disconnects (queued ones leave their queue).
        for queue in self._streams.values():
            queue.put_nowait(_DISCONNECT)
        self.lost.set()

    async def _serve(
        self, stream: int, scope: dict[str, Any], queue: asyncio.Queue[Message]
    ) -> None:
        # Head and body sent in one loop iteration leave in one write (FrameProtocol
        # coalesces); a streamed answer's head leaves at once, as from uvicorn.
        write = self.protocol.write
        state = {"started": False, "done": False}

        async def send(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                state["started"] = True
                head = encode_start(message["status"], list(message.get("headers", ())))
                write(frame(stream, START, head))
            elif kind == "http.response.body":
                more = bool(message.get("more_body", False))
                state["done"] = not more
                write(body_frame(stream, RESPONSE_BODY, bytes(message.get("body", b"")), more))

        try:
            await self.app(scope, queue.get, send)
        except Exception as exc:  # the server keeps serving whatever a request did
            if not state["started"]:
                await answer_error(exc, scope["method"], scope["path"])(scope, queue.get, send)
            else:
                log.error("error after the response started", exc_info=exc)
        finally:
            self._streams.pop(stream, None)
            if not state["done"]:
                write(frame(stream, ABORT))

    async def close(self) -> None:
        """Cancel what is still running and close the channel."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        transport = self.protocol.transport
        if transport is not None:
            transport.close()
