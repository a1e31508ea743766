"""The KServe v2 generate extension, as Triton serves it.

``POST /v2/models/{m}[/versions/{v}]/generate`` answers one JSON object;
``…/generate_stream`` answers server-sent events, one per piece of text, as the worker
produces them. The request is ``{"text_input": "...", "parameters": {...}}``; sampling
parameters (``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``;
Triton's ``random_seed``, ``stop_words``) may also sit at the top level, as Triton maps
top-level fields to the model's inputs. ``priority`` and ``timeout`` (µs), and the
``X-Modelyard-Timeout-Ms`` header, mean what they mean on the infer route.

Answers: ``{"model_name", "model_version", "text_output"}`` plus ``finish_reason`` and
the token counts; under brownout (the model overloaded, see
:mod:`modelyard.scheduling.brownout`) also ``max_tokens_capped_to`` (on every event of a
stream) and the ``X-Modelyard-Brownout: max_tokens=N`` header. A failure before the
first event is an ordinary error response (404, 400, 429, 504…); a failure after it is a
last event ``{"error": "...", "code": ...}``, since the status line has gone already. A
client that disconnects closes the stream, which stops generation in the worker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from modelyard.errors import InternalError, InvalidInputError, ServerError
from modelyard.frontends.dataplane import DataPlane
from modelyard.frontends.http.bodies import json_response, read_json
from modelyard.frontends.http.errors import answer_error, log
from modelyard.protocol.generate import (
    BROWNOUT_HEADER,
    BROWNOUT_KEY,
    SAMPLING_KEYS,
    GenerateChunk,
    GenerateRequest,
    brownout_header,
    sampling_from_params,
)
from modelyard.protocol.types import (
    TIMEOUT_HEADER,
    earliest,
    header_timeout_s,
    priority_param,
    timeout_param_s,
)

_ALLOWED_EXTRA = frozenset({"stream", "priority", "timeout"})


def generate_request(
    doc: Mapping[str, Any], model: str, version: str | None, timeout_header: str | None
) -> GenerateRequest:
    """A :class:`GenerateRequest` from a generate-extension body."""
    text = doc.get("text_input")
    if not isinstance(text, str):
        raise InvalidInputError("'text_input' must be a string")
    params = doc.get("parameters") or {}
    if not isinstance(params, Mapping):
        raise InvalidInputError("'parameters' must be an object")
    merged: dict[str, Any] = {k: v for k, v in doc.items() if k != "parameters"}
    merged.update(params)
    merged.pop("text_input", None)
    unknown = sorted(set(merged) - SAMPLING_KEYS - _ALLOWED_EXTRA)
    if unknown:
        raise InvalidInputError(
            f"unknown generate parameter(s): {', '.join(unknown)}; known: "
            f"{', '.join(sorted(SAMPLING_KEYS | _ALLOWED_EXTRA))}"
        )
    stream = merged.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidInputError("'stream' must be a boolean")
    timeout_s = timeout_param_s(merged.get("timeout"))
    if timeout_header is not None:
        timeout_s = earliest(timeout_s, header_timeout_s(timeout_header))
    return GenerateRequest(
        model=model,
        version=version,
        prompt=text,
        messages=None,
        sampling=sampling_from_params(merged),
        priority=priority_param(merged.get("priority")),
        timeout_s=timeout_s,
    )


def _event(chunk: GenerateChunk, model: str) -> dict[str, object]:
    doc: dict[str, object] = {
        "model_name": model,
        "model_version": chunk.model_version,
        "text_output": chunk.text,
    }
    if chunk.max_tokens_capped_to is not None:
        doc[BROWNOUT_KEY] = chunk.max_tokens_capped_to
    if chunk.finish_reason is not None:
        doc["finish_reason"] = chunk.finish_reason
        doc["prompt_tokens"] = chunk.prompt_tokens
        doc["completion_tokens"] = chunk.completion_tokens
    return doc


def _sse(doc: Mapping[str, object]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


class GenerateApi:
    """The two generate routes, bound to one data plane."""

    def __init__(self, dataplane: DataPlane, max_request_bytes: int) -> None:
        self.dp = dataplane
        self.max_request_bytes = max_request_bytes

    async def _request(self, request: Request) -> GenerateRequest:
        doc = await read_json(request, self.max_request_bytes, allow_empty=False)
        p = request.path_params
        return generate_request(
            doc, p["model"], p.get("version"), request.headers.get(TIMEOUT_HEADER)
        )

    async def generate(self, request: Request) -> Response:
        """``POST …/generate``: the whole text in one answer."""
        try:
            gen = await self._request(request)
            answer = await self.dp.generate_text(gen)
            doc: dict[str, object] = {
                "model_name": answer["model"],
                "model_version": answer["version"],
                "text_output": answer["text"],
                "finish_reason": answer["finish_reason"],
                **_usage(answer["usage"]),
            }
            if BROWNOUT_KEY in answer:
                doc[BROWNOUT_KEY] = answer[BROWNOUT_KEY]
            response = json_response(doc)
            mark_brownout(response, answer)
            return response
        except Exception as exc:
            return answer_error(exc, request.method, request.url.path)

    async def generate_stream(self, request: Request) -> Response:
        """``POST …/generate_stream``: server-sent events, one per piece of text.

        The first chunk is awaited before the status line, so a request that fails
        before any text (unknown model, bad parameter, queue full, deadline) gets its
        proper status code rather than a 200 with an error event.
        """
        try:
            gen = await self._request(request)
            stream = self.dp.generate(gen)
            try:
                first = await anext(stream)
            except StopAsyncIteration:
                raise InternalError("the model produced no answer") from None
            except BaseException:
                await stream.aclose()
                raise
        except Exception as exc:
            return answer_error(exc, request.method, request.url.path)
        headers = {"cache-control": "no-cache"}
        if first.max_tokens_capped_to is not None:
            headers[BROWNOUT_HEADER] = brownout_header(first.max_tokens_capped_to)
        return StreamingResponse(
            self._events(first, stream, gen.model),
            media_type="text/event-stream",
            headers=headers,
        )

    async def _events(
        self,
        first: GenerateChunk,
        stream: AsyncIterator[GenerateChunk],
        model: str,
    ) -> AsyncIterator[bytes]:
        # Starlette closes this generator when the client disconnects; the finally
        # closes the data plane's stream, which cancels generation in the worker.
        try:
            yield _sse(_event(first, model))
            if first.finish_reason is not None:
                return
            async for chunk in stream:
                yield _sse(_event(chunk, model))
        except ServerError as exc:
            yield _sse({"error": exc.message, "code": exc.code.value})
        except Exception as exc:  # the status line has gone: report in the stream
            log.error("generate_stream of %r failed", model, exc_info=exc)
            yield _sse(
                {"error": f"internal error: {type(exc).__name__}: {exc}", "code": "internal"}
            )
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()


def mark_brownout(response: Response, answer: Mapping[str, object]) -> None:
    """Set :data:`BROWNOUT_HEADER` on ``response`` when brownout capped the generation
    behind ``answer`` (a ``generate_text`` answer; its key says so)."""
    capped = answer.get(BROWNOUT_KEY)
    if isinstance(capped, int):
        response.headers[BROWNOUT_HEADER] = brownout_header(capped)


def _usage(usage: object) -> dict[str, object]:
    if not isinstance(usage, Mapping):
        return {}
    return {
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
    }
