"""``POST /v2/models/{m}[/versions/{v}]/infer``: the one implementation of the hot route.

:class:`InferHandler` reads the body, decodes, infers (cancelled if the client goes),
encodes and answers. :class:`InferFastPath` calls it before Starlette's middleware and
router; the Starlette routes of the same paths call it too, for any request the fast
path declines, so both answer alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.types import ASGIApp, Receive, Scope, Send

from modelyard.errors import RequestCancelledError
from modelyard.frontends.dataplane import SERVED_BY, DataPlane
from modelyard.frontends.http.bodies import read_body
from modelyard.frontends.http.codec import decode_request, encode_response
from modelyard.frontends.http.errors import answer_error
from modelyard.frontends.http.offload import OFFLOAD_FROM_BYTES, gate
from modelyard.protocol.types import earliest, header_timeout_s

_WATCH_AFTER_S = 0.002
"""A request still unanswered after this long is watched for its client disconnecting."""
SERVED_BY_HEADER = b"x-modelyard-served-by"
"""Response header naming the fallback model that answered (absent: the requested one)."""
_INFER_PREFIX = "/v2/models/"
_INFER_SUFFIX = "/infer"
T = TypeVar("T")


def infer_target(path: str) -> tuple[str, str | None] | None:
    """``(model, version)`` of an infer path (version None when not given), else None."""
    if not is_infer_path(path):
        return None
    parts = path[len(_INFER_PREFIX) : -len(_INFER_SUFFIX)].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


def is_infer_path(path: str) -> bool:
    """Whether ``path`` looks like an infer route (its body carries tensors)."""
    return path.startswith(_INFER_PREFIX) and path.endswith(_INFER_SUFFIX)


async def _cancel_on_disconnect(receive: Receive, task: asyncio.Task[Any]) -> None:
    # The body has been read, so the next ASGI message can only be the disconnect.
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            task.cancel()
            return


async def unless_disconnected(receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    """Await ``work``, cancelling it (so a queued request leaves the queue) if the client goes.

    The work runs in the handler's own task. Watching for the disconnect costs a task,
    so it starts only once the request has taken ``_WATCH_AFTER_S``: quick answers (most
    of them) pay for a timer handle instead, and a request that waits is still watched.
    """
    me = asyncio.current_task()
    assert me is not None
    loop = asyncio.get_running_loop()
    watcher: list[asyncio.Task[None]] = []

    def watch() -> None:
        watcher.append(loop.create_task(_cancel_on_disconnect(receive, me)))

    timer = loop.call_later(_WATCH_AFTER_S, watch)
    try:
        return await work
    except asyncio.CancelledError:
        if watcher and watcher[0].done() and not watcher[0].cancelled():
            me.uncancel()
            raise RequestCancelledError(
                "the client disconnected before its answer was ready"
            ) from None
        raise
    finally:
        timer.cancel()
        if watcher:
            watcher[0].cancel()


class InferHandler:
    """Answers infer requests over one data plane; an ASGI endpoint for Starlette too."""

    def __init__(self, dataplane: DataPlane, max_request_bytes: int) -> None:
        self.dp = dataplane
        self.max_request_bytes = max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI endpoint of the Starlette infer routes (model and version from the path)."""
        params = scope["path_params"]
        await self.serve(scope, receive, send, params["model"], params.get("version"))

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, model: str, version: str | None
    ) -> None:
        """Read, decode, infer, encode and send; every failure through ``answer_error``."""
        try:
            payload, headers = await self.answer(scope, receive, model, version)
        except Exception as exc:  # the server must keep serving whatever happened
            await answer_error(exc, "POST", scope["path"])(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def answer(
        self, scope: Scope, receive: Receive, model: str, version: str | None
    ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The 200 answer's body and headers (``content-length`` first); raises the error
        to answer otherwise."""
        header_length = timeout_ms = encoding = None
        declared = -1
        for key, value in scope["headers"]:
            if key == b"inference-header-content-length":
                header_length = value.decode("latin-1")
            elif key == b"x-modelyard-timeout-ms":
                timeout_ms = value.decode("latin-1")
            elif key == b"content-length" and value.isdigit():
                declared = int(value)
            elif key == b"content-encoding":
                encoding = value
        peer = scope.get("client")
        client = peer[0] if peer else None
        body = await read_body(receive, self.max_request_bytes, declared, encoding, client)
        payload, header_len, served_by = await self.infer_body(
            model, version, body, header_length, timeout_ms, client
        )
        headers = [(b"content-length", str(len(payload)).encode())]
        if header_len is None:
            headers.append((b"content-type", b"application/json"))
        else:
            headers.append((b"content-type", b"application/octet-stream"))
            headers.append((b"inference-header-content-length", str(header_len).encode()))
        if served_by is not None:
            headers.append((SERVED_BY_HEADER, served_by.encode()))
        return payload, headers

    async def infer_body(
        self,
        model: str,
        version: str | None,
        body: bytes,
        header_length: str | None,
        timeout_ms: str | None,
        client: str | None = None,
    ) -> tuple[bytes, int | None, str | None]:
        """Decode (off the event loop for a big body, within ``client``'s share), infer
        (cancelled if the client disconnects: by the connection guard, see
        :class:`~modelyard.frontends.http.connections.GuardLayer`), encode: the response
        body, for binary outputs the JSON header's length, and the fallback model that
        answered (None: the requested one did)."""
        args = (body, header_length, model, version, self.dp.max_request_elements)
        if len(body) < OFFLOAD_FROM_BYTES:  # most bodies: decoded here, no await
            req = decode_request(*args)
        else:
            req = await gate().run(client, decode_request, *args)
        if timeout_ms is not None:
            req.timeout_s = earliest(req.timeout_s, header_timeout_s(timeout_ms))
        resp = await self.dp.infer(req)
        payload, header_len = encode_response(resp, req)
        if len(payload) > self.dp.max_response_bytes:
            self.dp.check_response_bytes(len(payload))
        served_by = resp.parameters.get(SERVED_BY)
        return payload, header_len, served_by if isinstance(served_by, str) else None


class InferFastPath:
    """ASGI app answering ``POST /v2/models/{m}[/versions/{v}]/infer`` directly.

    Inference is the one hot route; taking it before Starlette's middleware stack and
    router saves about a fifth of the server's CPU per request. Every other request,
    and any infer path that does not parse, goes to the Starlette app unchanged.
    """

    def __init__(self, infer: InferHandler, fallback: ASGIApp) -> None:
        self.infer = infer
        self.fallback = fallback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Route: the infer fast path, or the fallback app."""
        if scope["type"] == "http" and scope["method"] == "POST":
            target = infer_target(scope["path"])
            if target is not None:
                await self.infer.serve(scope, receive, send, *target)
                return
        await self.fallback(scope, receive, send)
