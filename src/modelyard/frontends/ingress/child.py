"""One ingress process: accepts HTTP on its share of the port, forwards to the manager.

Started by :mod:`modelyard.frontends.ingress.supervisor` as
``python -m modelyard.frontends.ingress.child LISTEN_FD CHANNEL_FD OPTIONS_JSON``.
It runs the same uvicorn set-up as a single-process server (head deadline,
connection cap, keep-alive, TLS), and its ASGI app only relays: each request's head
and body go to the manager as frames, the manager's answer comes back the same way.
It decides nothing itself, so every ingress answers exactly as the manager's app does.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import sys
from typing import Any

import orjson
import uvicorn
from starlette.types import Message, Receive, Scope, Send

from modelyard.config.limits import LimitsConfig
from modelyard.errors import ModelNotReadyError
from modelyard.frontends.http.errors import answer_error
from modelyard.frontends.http.server_config import ensure_descriptor_room, uvicorn_config
from modelyard.frontends.ingress.frames import (
    BODY,
    DISCONNECT,
    HELLO,
    REQUEST,
    RESPONSE_BODY,
    START,
    FrameProtocol,
    body_frame,
    decode_start,
    encode_scope,
    frame,
)
from modelyard.frontends.ingress.tunnel import ABORT
from modelyard.observability.logging import setup_logging

INGRESS_HEADER = b"x-modelyard-ingress"
"""Response header naming the ingress process (its pid) that answered."""
_LOST = -1
_WATCH_AFTER_S = 0.002
"""A request unanswered this long starts watching for its client's disconnect."""
_STREAM_IDS = 1 << 32


class ForwardingApp:
    """ASGI app relaying every HTTP request to the manager over one channel."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.protocol = FrameProtocol(self._on_frame, self._on_lost)
        self.manager_gone = asyncio.Event()
        self._streams: dict[int, asyncio.Queue[tuple[int, bytes]]] = {}
        self._next_stream = 0
        self._pid_header = (INGRESS_HEADER, str(self.pid).encode())

    def _on_frame(self, stream: int, kind: int, payload: bytes) -> None:
        queue = self._streams.get(stream)
        if queue is not None:
            queue.put_nowait((kind, payload))

    def _on_lost(self) -> None:
        for queue in self._streams.values():
            queue.put_nowait((_LOST, b""))
        self.manager_gone.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Forward one request; relay its answer."""
        if scope["type"] != "http":
            return
        if self.manager_gone.is_set():
            gone = ModelNotReadyError("the server is shutting down")
            await answer_error(gone, scope["method"], scope["path"])(scope, receive, send)
            return
        self._next_stream = stream = (self._next_stream + 1) % _STREAM_IDS
        queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        self._streams[stream] = queue
        write = self.protocol.write
        request = frame(stream, REQUEST, encode_scope(scope, self.pid))
        loop = asyncio.get_running_loop()
        watchers: list[asyncio.Task[None]] = []
        timer: asyncio.TimerHandle | None = None

        def watch() -> None:
            watchers.append(loop.create_task(self._pump(stream, receive)))

        message = await receive()
        if message["type"] == "http.request" and message.get("more_body", False):
            # A body in several pieces: relayed as it arrives, while the manager may
            # already answer (413 on a body over the limit).
            write(request)
            watchers.append(loop.create_task(self._pump(stream, receive, message)))
        else:
            # Head and whole body in one write: one read for the manager.
            write(request + self._frame_of(stream, message))
            # The manager's app may watch for the client leaving: relayed only for
            # requests that take a while, so quick ones cost no extra task.
            timer = loop.call_later(_WATCH_AFTER_S, watch)
        started = finished = False
        try:
            while True:
                kind, payload = await queue.get()
                if kind == RESPONSE_BODY:
                    more = payload[0] == 1
                    finished = not more
                    await send(
                        {"type": "http.response.body", "body": payload[1:], "more_body": more}
                    )
                    if finished:
                        return
                elif kind == START:
                    status, headers = decode_start(payload)
                    headers.append(self._pid_header)
                    await send(
                        {"type": "http.response.start", "status": status, "headers": headers}
                    )
                    started = True
                elif kind == ABORT:
                    finished = True
                    raise ConnectionAbortedError("the manager's answer failed part-way")
                elif kind == _LOST:
                    finished = True
                    if started:
                        raise ConnectionAbortedError("the manager went away mid-answer")
                    gone = ModelNotReadyError("the server is shutting down")
                    await answer_error(gone, scope["method"], scope["path"])(scope, receive, send)
                    return
        finally:
            if timer is not None:
                timer.cancel()
            for task in watchers:
                task.cancel()
            del self._streams[stream]
            if not finished:
                # Cancelled here (shutdown, or an error sending to the client): the
                # manager stops working on it as for a client that went away.
                write(frame(stream, DISCONNECT))

    @staticmethod
    def _frame_of(stream: int, message: Message) -> bytes:
        if message["type"] == "http.request":
            more = bool(message.get("more_body", False))
            return body_frame(stream, BODY, message.get("body", b""), more)
        return frame(stream, DISCONNECT)

    def _relay(self, stream: int, message: Message) -> None:
        self.protocol.write(self._frame_of(stream, message))

    async def _pump(self, stream: int, receive: Receive, first: Message | None = None) -> None:
        message = first if first is not None else await receive()
        while True:
            self._relay(stream, message)
            if message["type"] == "http.disconnect":
                return
            message = await receive()


async def serve(listen_fd: int, channel_fd: int, options: dict[str, Any]) -> None:
    """Serve HTTP on the inherited socket until told to stop or the manager goes."""
    loop = asyncio.get_running_loop()
    app = ForwardingApp()
    channel = socket.socket(fileno=channel_fd)
    await loop.connect_accepted_socket(lambda: app.protocol, sock=channel)
    listener = socket.socket(fileno=listen_fd)
    limits = LimitsConfig.model_validate(options["limits"])
    # The connection cap holds per process: each ingress needs the descriptors for it.
    ensure_descriptor_room(limits.max_connections)
    config = uvicorn_config(app, options["host"], 0, limits, options["tls"])
    server = uvicorn.Server(config)
    task = loop.create_task(server.serve(sockets=[listener]))
    while not server.started:
        if task.done():
            task.result()
            return
        await asyncio.sleep(0.01)
    app.protocol.write(frame(0, HELLO, str(app.pid).encode()))
    gc.collect()
    gc.freeze()
    gone = loop.create_task(app.manager_gone.wait())
    await asyncio.wait([task, gone], return_when=asyncio.FIRST_COMPLETED)
    # Without a manager nothing can be answered: stop (the supervisor is gone too).
    server.should_exit = True
    with contextlib.suppress(asyncio.CancelledError):
        await task
    gone.cancel()


def main(argv: list[str]) -> int:
    """Entry point: ``LISTEN_FD CHANNEL_FD OPTIONS_JSON``."""
    listen_fd, channel_fd, options = int(argv[0]), int(argv[1]), orjson.loads(argv[2])
    setup_logging(options["logging"]["level"], options["logging"]["format"])
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    asyncio.run(serve(listen_fd, channel_fd, options))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
