"""The OpenAI-compatible REST routes: ``/v1/models``, ``/v1/completions``,
``/v1/chat/completions`` (server-sent events with ``stream: true``), ``/v1/embeddings``,
and llama.cpp's ``/tokenize`` and ``/detokenize``.

Handlers read the body, parse it strictly (:mod:`modelyard.protocol.openai`), call
:class:`~modelyard.frontends.openai_plane.OpenAIPlane` and write its answer. Every
failure is OpenAI's error object with the status of its kind. A stream starts only once
the first piece of text exists, so an error before it (unknown model, a prompt too long
for the context, queue full) is an ordinary 4xx/5xx answer; an error after it is one
last ``data: {"error": ...}`` event. A client that goes away stops the generation.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from modelyard.errors import InternalError, ServerError
from modelyard.frontends.dataplane import DataPlane
from modelyard.frontends.http.bodies import json_response, read_json
from modelyard.frontends.http.errors import guarded
from modelyard.frontends.http.fastpath import unless_disconnected
from modelyard.frontends.http.openai_errors import openai_error_response
from modelyard.frontends.openai_plane import GenerateBody, OpenAIPlane
from modelyard.protocol.openai import (
    ChatCompletionBody,
    CompletionBody,
    DetokenizeBody,
    EmbeddingBody,
    TokenizeBody,
    parse_body,
)
from modelyard.protocol.openai_answers import error_object
from modelyard.protocol.types import TIMEOUT_HEADER, header_timeout_s

log = logging.getLogger("modelyard.http")

Handler = Callable[[Request], Awaitable[Response]]


def _guarded(handler: Handler) -> Handler:
    return guarded(handler, openai_error_response)


class EventStream(Response):
    """``text/event-stream``: one ``data: {json}`` event per chunk, then ``data: [DONE]``.

    Sending stops, and ``events`` is closed (which stops generation in the worker), as
    soon as the client disconnects. An error raised by ``events`` mid-stream is sent as
    one last ``data: {"error": ...}`` event, without ``[DONE]``.
    """

    def __init__(
        self, first: dict[str, Any] | None, events: AsyncGenerator[dict[str, Any], None]
    ) -> None:
        super().__init__(status_code=200, media_type="text/event-stream")
        self.first = first
        self.events = events
        self.path = ""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream the events; close the source whatever happens."""
        self.path = scope.get("path", "")
        try:
            await unless_disconnected(receive, self._send_all(send))
        except ServerError:
            pass  # the client disconnected: nobody is left to answer
        finally:
            await self.events.aclose()

    async def _send_all(self, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        if self.first is not None:
            await send(_event(self.first))
        try:
            async for event in self.events:
                await send(_event(event))
        except ServerError as exc:
            await send(_event(error_object(exc), more=False))
            return
        except Exception as exc:  # the server keeps serving; the client gets the reason
            log.error("unhandled error in stream %s", self.path, exc_info=exc)
            failure = InternalError(f"internal error: {type(exc).__name__}: {exc}")
            await send(_event(error_object(failure), more=False))
            return
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def _event(doc: dict[str, Any], more: bool = True) -> dict[str, Any]:
    return {
        "type": "http.response.body",
        "body": b"data: " + orjson.dumps(doc) + b"\n\n",
        "more_body": more,
    }


class OpenAIApi:
    """The ``/v1`` route handlers over one data plane."""

    def __init__(self, dataplane: DataPlane, max_request_bytes: int) -> None:
        self.plane = OpenAIPlane(dataplane)
        self.max_request_bytes = max_request_bytes

    async def _body(self, request: Request) -> dict[str, object]:
        return await read_json(request, self.max_request_bytes, allow_empty=False)

    @staticmethod
    def _timeout_s(request: Request) -> float | None:
        value = request.headers.get(TIMEOUT_HEADER)
        return None if value is None else header_timeout_s(value)

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``: every model a request may name."""
        return json_response(self.plane.models())

    async def model(self, request: Request) -> Response:
        """``GET /v1/models/{model}``: one model, 404 when unknown."""
        return json_response(self.plane.model(request.path_params["model"]))

    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``."""
        return await self._generate(request, parse_body(CompletionBody, await self._body(request)))

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        body = parse_body(ChatCompletionBody, await self._body(request))
        body.completion_limit()  # both limits given: refused before anything runs
        return await self._generate(request, body)

    async def _generate(self, request: Request, body: GenerateBody) -> Response:
        timeout_s = self._timeout_s(request)
        if not body.stream:
            work = self.plane.complete(body, timeout_s)
            return json_response(await unless_disconnected(request.receive, work))
        events = self.plane.stream(body, timeout_s)

        async def first_event() -> dict[str, Any] | None:
            return await anext(events, None)

        try:
            # The first event exists only once the model produced text: every error
            # before it is an ordinary answer with its status.
            first = await unless_disconnected(request.receive, first_event())
        except BaseException:
            await events.aclose()
            raise
        return EventStream(first, events)

    async def embeddings(self, request: Request) -> Response:
        """``POST /v1/embeddings``."""
        body = parse_body(EmbeddingBody, await self._body(request))
        work = self.plane.embeddings(body, self._timeout_s(request))
        return json_response(await unless_disconnected(request.receive, work))

    async def tokenize(self, request: Request) -> Response:
        """``POST /tokenize`` (llama.cpp's server's shape, plus ``model``)."""
        body = parse_body(TokenizeBody, await self._body(request))
        work = self.plane.tokenize(body, self._timeout_s(request))
        return json_response(await unless_disconnected(request.receive, work))

    async def detokenize(self, request: Request) -> Response:
        """``POST /detokenize``."""
        body = parse_body(DetokenizeBody, await self._body(request))
        work = self.plane.detokenize(body, self._timeout_s(request))
        return json_response(await unless_disconnected(request.receive, work))

    def routes(self) -> list[BaseRoute]:
        """Every ``/v1`` route."""
        g = _guarded
        return [
            Route("/v1/models", g(self.models), methods=["GET"]),
            Route("/v1/models/{model}", g(self.model), methods=["GET"]),
            Route("/v1/completions", g(self.completions), methods=["POST"]),
            Route("/v1/chat/completions", g(self.chat_completions), methods=["POST"]),
            Route("/v1/embeddings", g(self.embeddings), methods=["POST"]),
            Route("/tokenize", g(self.tokenize), methods=["POST"]),
            Route("/detokenize", g(self.detokenize), methods=["POST"]),
        ]
