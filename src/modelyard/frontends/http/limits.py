"""Body limits by route: every request body is bounded before a handler holds it."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelyard.errors import PayloadTooLargeError
from modelyard.frontends.http.fastpath import is_infer_path
from modelyard.frontends.http.openai_errors import error_response_at


def is_generate_path(path: str) -> bool:
    """True for the generate extension's routes (their bodies carry prompts)."""
    return path.startswith("/v2/models/") and path.endswith(("/generate", "/generate_stream"))


_DATA_ROUTES = frozenset(
    {
        "/predict",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/embeddings",
        "/tokenize",
        "/detokenize",
    }
)
"""Routes besides infer and generate whose bodies carry tensors or prompts (the larger limit)."""


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
                await error_response_at(scope["path"], exc)(scope, receive, send)
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
            await error_response_at(scope["path"], exc)(scope, receive, send)


class RouteLimits:
    """Picks the body limit by route: tensors get ``max_request_bytes``, the rest less."""

    def __init__(self, app: ASGIApp, data_limit: int, control_limit: int) -> None:
        self.app = app
        """The app both limits wrap (the Starlette routes)."""
        self.data = BodyLimit(app, data_limit, "max_request_mb")
        self.control = BodyLimit(app, control_limit, "limits.max_control_body_mb")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app under the limit of the request's route."""
        path: str = scope.get("path", "")
        is_data = path in _DATA_ROUTES or is_infer_path(path) or is_generate_path(path)
        await (self.data if is_data else self.control)(scope, receive, send)
