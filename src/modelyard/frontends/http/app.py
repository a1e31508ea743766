"""The REST front end: Open Inference Protocol routes plus ``/predict``; nothing else.

Each handler decodes, calls the data plane, encodes. Every ServerError becomes the
protocol's ``{"error": ...}`` body through one handler; anything unforeseen becomes
a 500 with its message, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelyard.config.limits import LimitsConfig
from modelyard.errors import (
    DeadlineExceededError,
    InternalError,
    InvalidInputError,
    ModelNotReadyError,
    PayloadTooLargeError,
    RequestCancelledError,
    ServerError,
)
from modelyard.frontends.auth import Authorizer
from modelyard.frontends.dataplane import DataPlane
from modelyard.frontends.http.auth import AuthLayer
from modelyard.frontends.http.codec import (
    HEADER_LENGTH,
    decode_request,
    encode_response,
)
from modelyard.frontends.http.errors import error_response
from modelyard.frontends.http.openapi import openapi_routes
from modelyard.protocol.documents import json_object
from modelyard.protocol.json_tensors import array_from_nested, json_nested
from modelyard.protocol.tensors import json_data
from modelyard.protocol.types import (
    TIMEOUT_HEADER,
    InferInput,
    InferRequest,
    earliest,
    header_timeout_s,
)

log = logging.getLogger("modelyard.http")

Handler = Callable[[Request], Awaitable[Response]]
_WATCH_AFTER_S = 0.002
"""A request still unanswered after this long is watched for its client disconnecting."""
T = TypeVar("T")
JSON = {"content-type": "application/json"}


def json_response(doc: object, status: int = 200) -> Response:
    """A JSON response serialised with orjson (numpy arrays allowed)."""
    return Response(
        orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status, headers=JSON
    )


async def _cancel_on_disconnect(receive: Receive, task: asyncio.Task[Any]) -> None:
    # The body has been read, so the next ASGI message can only be the disconnect.
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            task.cancel()
            return


async def _unless_disconnected(receive: Receive, work: Coroutine[Any, Any, T]) -> T:
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


def _infer_headers(header_len: int | None) -> dict[str, str]:
    if header_len is None:
        return JSON
    return {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(header_len),
    }


def _schedule_policy(doc: dict[str, Any], header_ms: str | None) -> tuple[int | None, float | None]:
    """``/predict``'s ``priority`` and client timeout (seconds), as the infer route reads them."""
    priority = doc.get("priority")
    if priority is not None and (
        not isinstance(priority, int) or isinstance(priority, bool) or priority < 1
    ):
        raise InvalidInputError("'priority' must be a positive integer (1 is the highest)")
    timeout_us = doc.get("timeout")
    if timeout_us is not None and (
        not isinstance(timeout_us, int | float) or isinstance(timeout_us, bool) or timeout_us <= 0
    ):
        raise InvalidInputError("'timeout' must be a positive number of microseconds")
    timeout_s = None if timeout_us is None else float(timeout_us) / 1e6
    if header_ms is not None:
        timeout_s = earliest(timeout_s, header_timeout_s(header_ms))
    return priority, timeout_s


def _guard(handler: Handler) -> Handler:
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except ServerError as exc:
            return error_response(exc)
        except Exception as exc:  # the server must keep serving whatever happened
            log.exception("unhandled error in %s %s", request.method, request.url.path)
            return error_response(InternalError(f"internal error: {type(exc).__name__}: {exc}"))

    return wrapped


class RestApi:
    """Route handlers bound to one data plane."""

    def __init__(self, dataplane: DataPlane, max_request_bytes: int) -> None:
        self.dp = dataplane
        self.max_request_bytes = max_request_bytes

    async def _body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        limit = self.max_request_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLargeError(
                f"request body of {int(declared)} bytes is over the {limit}-byte limit"
            )
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLargeError(f"request body is over the {limit}-byte limit")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _json_body(self, request: Request, *, allow_empty: bool = True) -> dict[str, Any]:
        body = await self._body(request)
        return json_object(body, allow_empty=allow_empty)

    # ------------------------------------------------------------------ health / metadata

    async def live(self, request: Request) -> Response:
        """200 while the process is up."""
        return json_response({"live": self.dp.live()})

    async def ready(self, request: Request) -> Response:
        """200 when serving, 503 while starting or shutting down."""
        ok = self.dp.ready()
        return json_response({"ready": ok}, 200 if ok else 503)

    async def server_metadata(self, request: Request) -> Response:
        """``GET /v2``."""
        return json_response(self.dp.server_metadata())

    async def model_metadata(self, request: Request) -> Response:
        """``GET /v2/models/{m}[/versions/{v}]``; loads the model to learn its tensors."""
        p = request.path_params
        return json_response(await self.dp.model_metadata_loaded(p["model"], p.get("version")))

    async def model_ready(self, request: Request) -> Response:
        """200 when that model version can serve now, 400 when not (as Triton)."""
        p = request.path_params
        ok = self.dp.model_ready(p["model"], p.get("version"))
        return json_response({"name": p["model"], "ready": ok}, 200 if ok else 400)

    # ------------------------------------------------------------------ inference

    async def infer(self, request: Request) -> Response:
        """``POST /v2/models/{m}[/versions/{v}]/infer`` through Starlette (the fast path in
        :class:`InferFastPath` normally answers these before routing)."""
        p = request.path_params
        body = await self._body(request)
        payload, header_len = await self.infer_body(
            p["model"],
            p.get("version"),
            body,
            request.headers.get(HEADER_LENGTH),
            request.headers.get(TIMEOUT_HEADER),
            request.receive,
        )
        return Response(payload, headers=_infer_headers(header_len))

    async def infer_body(
        self,
        model: str,
        version: str | None,
        body: bytes,
        header_length: str | None,
        timeout_ms: str | None,
        receive: Receive,
    ) -> tuple[bytes, int | None]:
        """Decode, infer (cancelled if the client disconnects), encode: the response body
        and, for binary outputs, the JSON header's length."""
        req = decode_request(body, header_length, model, version, self.dp.max_request_elements)
        if timeout_ms is not None:
            req.timeout_s = earliest(req.timeout_s, header_timeout_s(timeout_ms))
        resp = await _unless_disconnected(receive, self.dp.infer(req))
        payload, header_len = encode_response(resp, req)
        self.dp.check_response_bytes(len(payload))
        return payload, header_len

    async def predict(self, request: Request) -> Response:
        """``POST /predict {"model", "version"?, "inputs": {name: nested list}} | "text"``.

        Optional ``"priority"`` (1 is the highest) and ``"timeout"`` (µs), and the
        ``X-Modelyard-Timeout-Ms`` header, mean what they mean on the infer route.
        """
        started = time.monotonic()
        doc = await self._json_body(request, allow_empty=False)
        model = doc.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidInputError("'model' must be a non-empty string")
        version = doc.get("version")
        if version is not None:
            version = str(version)
        priority, timeout_s = _schedule_policy(doc, request.headers.get(TIMEOUT_HEADER))
        meta = await self.dp.model_metadata_loaded(model, version, timeout_s)
        specs: list[dict[str, Any]] = meta["inputs"]  # type: ignore[assignment]
        raw = doc.get("inputs")
        if raw is None and "text" in doc:
            if len(specs) != 1 or specs[0]["datatype"] != "BYTES":
                raise InvalidInputError(
                    f"'text' needs a model with one BYTES input; {model!r} has "
                    f"{', '.join(s['name'] + ':' + s['datatype'] for s in specs)}"
                )
            text = doc["text"]
            texts = [text] if isinstance(text, str) else text
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise InvalidInputError("'text' must be a string or a list of strings")
            raw = {specs[0]["name"]: texts}
        if not isinstance(raw, dict) or not raw:
            raise InvalidInputError("'inputs' must be an object of input name → nested list")
        by_name = {s["name"]: s for s in specs}
        inputs = []
        for name, value in raw.items():
            spec = by_name.get(name)
            if spec is None:
                raise InvalidInputError(
                    f"model {model!r} has no input {name!r}; inputs are: {', '.join(by_name)}"
                )
            arr = array_from_nested(name, spec["datatype"], value)
            # A single example is promoted to a batch of one when the model wants a batch.
            if arr.ndim == len(spec["shape"]) - 1:
                arr = arr[np.newaxis, ...]
            inputs.append(InferInput(name, spec["datatype"], tuple(arr.shape), arr))
        if timeout_s is not None:
            # The client's deadline covers the whole call, the load and decoding included.
            timeout_s -= time.monotonic() - started
            if timeout_s <= 0:
                raise DeadlineExceededError(f"the request's deadline passed before {model!r} ran")
        req = InferRequest(
            model_name=model,
            model_version=version,
            inputs=inputs,
            priority=priority,
            timeout_s=timeout_s,
        )
        resp = await self.dp.infer(req)
        answer = json_response(
            {
                "model": resp.model_name,
                "version": resp.model_version,
                "outputs": {
                    # BYTES outputs may hold str or bytes (runtimes differ): json_data
                    # handles both, as the v2 infer route does.
                    o.name: json_data(o) if o.datatype == "BYTES" else json_nested(o.array)
                    for o in resp.outputs
                },
            }
        )
        self.dp.check_response_bytes(len(answer.body))
        return answer

    # ------------------------------------------------------------------ repository

    async def repository_index(self, request: Request) -> Response:
        """``POST /v2/repository/index {"ready": bool}``."""
        doc = await self._json_body(request)
        return json_response(self.dp.repository_index(bool(doc.get("ready", False))))

    async def repository_load(self, request: Request) -> Response:
        """``POST /v2/repository/models/{m}/load``: returns once loaded (or failed).

        A model folder the YAML does not list can be loaded too, optionally with
        ``{"parameters": {"config": {...model fields...}}}``.
        """
        doc = await self._json_body(request)
        params = doc.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidInputError("'parameters' must be an object")
        name = request.path_params["model"]
        await self.dp.load(name, params.get("config"))
        if not self.dp.model_ready(name, None):
            raise ModelNotReadyError(f"model {name!r} did not become ready")
        return Response(b"", status_code=200)

    async def repository_unload(self, request: Request) -> Response:
        """``POST /v2/repository/models/{m}/unload``."""
        await self._json_body(request)
        await self.dp.unload(request.path_params["model"])
        return Response(b"", status_code=200)

    def routes(self) -> list[BaseRoute]:
        """Every route of the REST API."""
        g = _guard
        m = "/v2/models/{model}"
        mv = "/v2/models/{model}/versions/{version}"
        return [
            Route("/v2/health/live", g(self.live), methods=["GET"]),
            Route("/v2/health/ready", g(self.ready), methods=["GET"]),
            Route("/v2", g(self.server_metadata), methods=["GET"]),
            Route(m, g(self.model_metadata), methods=["GET"]),
            Route(mv, g(self.model_metadata), methods=["GET"]),
            Route(m + "/ready", g(self.model_ready), methods=["GET"]),
            Route(mv + "/ready", g(self.model_ready), methods=["GET"]),
            Route(m + "/infer", g(self.infer), methods=["POST"]),
            Route(mv + "/infer", g(self.infer), methods=["POST"]),
            Route("/predict", g(self.predict), methods=["POST"]),
            Route("/v2/repository/index", g(self.repository_index), methods=["POST"]),
            Route("/v2/repository/models/{model}/load", g(self.repository_load), methods=["POST"]),
            Route(
                "/v2/repository/models/{model}/unload", g(self.repository_unload), methods=["POST"]
            ),
        ]


async def _not_found(request: Request, exc: Exception) -> Response:
    return json_response({"error": f"no route for {request.method} {request.url.path}"}, 404)


async def _method_not_allowed(request: Request, exc: Exception) -> Response:
    return json_response({"error": f"{request.method} is not allowed on {request.url.path}"}, 405)


class BodyLimit:
    """ASGI middleware: every request body is bounded, whatever route reads it.

    A declared ``Content-Length`` over the limit is answered 413 before the app runs;
    a chunked body is counted as it arrives and the read fails with
    PayloadTooLargeError once over it, so no handler ever holds more than the limit.
    """

    def __init__(self, app: ASGIApp, limit_bytes: int, what: str) -> None:
        self.app = app
        self.limit_bytes = limit_bytes
        self.what = what

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app with a counting ``receive``; answer 413 when over the limit."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_bytes
        for key, value in scope["headers"]:
            if key == b"content-length" and value.isdigit() and int(value) > limit:
                exc = PayloadTooLargeError(
                    f"request body of {int(value)} bytes is over the {limit}-byte limit "
                    f"({self.what})"
                )
                await error_response(exc)(scope, receive, send)
                return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise PayloadTooLargeError(
                        f"request body is over the {limit}-byte limit ({self.what})"
                    )
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched_send)
        except PayloadTooLargeError as exc:
            if started:
                raise
            await error_response(exc)(scope, receive, send)


_INFER_PREFIX = "/v2/models/"
_INFER_SUFFIX = "/infer"


class InferFastPath:
    """ASGI app answering ``POST /v2/models/{m}[/versions/{v}]/infer`` directly.

    Inference is the one hot route; taking it before Starlette's middleware stack and
    router saves about a fifth of the server's CPU per request. Every other request,
    and any infer path that does not parse, goes to the Starlette app unchanged.
    """

    def __init__(self, api: RestApi, fallback: ASGIApp) -> None:
        self.api = api
        self.fallback = fallback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Route: the infer fast path, or the fallback app."""
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            if path.startswith(_INFER_PREFIX) and path.endswith(_INFER_SUFFIX):
                parts = path[len(_INFER_PREFIX) : -len(_INFER_SUFFIX)].split("/")
                if len(parts) == 1 and parts[0]:
                    await self._infer(scope, receive, send, parts[0], None)
                    return
                if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
                    await self._infer(scope, receive, send, parts[0], parts[2])
                    return
        await self.fallback(scope, receive, send)

    async def _infer(
        self, scope: Scope, receive: Receive, send: Send, model: str, version: str | None
    ) -> None:
        header_length = timeout_ms = None
        declared = -1
        for key, value in scope["headers"]:
            if key == b"inference-header-content-length":
                header_length = value.decode("latin-1")
            elif key == b"x-modelyard-timeout-ms":
                timeout_ms = value.decode("latin-1")
            elif key == b"content-length" and value.isdigit():
                declared = int(value)
        try:
            body = await self._body(receive, declared)
            payload, header_len = await self.api.infer_body(
                model, version, body, header_length, timeout_ms, receive
            )
        except ServerError as exc:
            await error_response(exc)(scope, receive, send)
            return
        except Exception as exc:  # the server must keep serving whatever happened
            log.exception("unhandled error in POST %s", scope["path"])
            err = InternalError(f"internal error: {type(exc).__name__}: {exc}")
            await error_response(err)(scope, receive, send)
            return
        headers = [(b"content-length", str(len(payload)).encode())]
        if header_len is None:
            headers.append((b"content-type", b"application/json"))
        else:
            headers.append((b"content-type", b"application/octet-stream"))
            headers.append((b"inference-header-content-length", str(header_len).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _body(self, receive: Receive, declared: int) -> bytes:
        limit = self.api.max_request_bytes
        if declared > limit:
            raise PayloadTooLargeError(
                f"request body of {declared} bytes is over the {limit}-byte limit"
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestCancelledError("the client disconnected while sending its request")
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLargeError(f"request body is over the {limit}-byte limit")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


_DATA_ROUTES = ("/predict",)
"""Routes besides infer whose bodies carry tensors (the larger limit)."""


class _RouteLimits:
    """Picks the body limit by route: tensors get ``max_request_bytes``, the rest less."""

    def __init__(self, app: ASGIApp, data_limit: int, control_limit: int) -> None:
        self.data = BodyLimit(app, data_limit, "max_request_bytes")
        self.control = BodyLimit(app, control_limit, "limits.max_control_body_bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        is_data = path in _DATA_ROUTES or (
            path.startswith(_INFER_PREFIX) and path.endswith(_INFER_SUFFIX)
        )
        await (self.data if is_data else self.control)(scope, receive, send)


def create_app(
    dataplane: DataPlane,
    max_request_bytes: int,
    extra_routes: list[BaseRoute] | None = None,
    authorizer: Authorizer | None = None,
    *,
    max_control_body_bytes: int | None = None,
) -> ASGIApp:
    """The ASGI app: the token check (when ``authorizer`` has tokens), the infer fast
    path, then the protocol routes, ``GET /openapi.json`` and ``extra_routes`` (metrics,
    dashboard, admin) in Starlette, every body bounded: inference bodies by
    ``max_request_bytes``, every other route's by ``max_control_body_bytes``."""
    api = RestApi(dataplane, max_request_bytes)
    app = Starlette(
        routes=[*api.routes(), *openapi_routes(), *(extra_routes or [])],
        exception_handlers={404: _not_found, 405: _method_not_allowed},
    )
    control = max_control_body_bytes or LimitsConfig().max_control_body_bytes
    fast: ASGIApp = InferFastPath(
        api, _RouteLimits(app, max_request_bytes, min(control, max_request_bytes))
    )
    if authorizer is not None and authorizer.is_enabled:
        return AuthLayer(authorizer, fast)
    return fast
