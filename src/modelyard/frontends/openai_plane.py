"""The OpenAI-compatible verbs on top of the data plane, whatever the transport.

Requests arrive already parsed (:mod:`modelyard.protocol.openai`); this module routes
them through :class:`~modelyard.frontends.dataplane.DataPlane` exactly as every other
request goes (resolve, hot-load within the deadline, queue, run), and builds OpenAI's
answers (:mod:`modelyard.protocol.openai_answers`). It never touches the manager.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import numpy as np

from modelyard.errors import DeadlineExceededError, InvalidInputError
from modelyard.frontends.dataplane import DataPlane
from modelyard.protocol.generate import (
    ChatMessage,
    GenerateChunk,
    GenerateRequest,
    SamplingParams,
)
from modelyard.protocol.json_tensors import array_from_nested
from modelyard.protocol.openai import (
    ChatCompletionBody,
    CompletionBody,
    EmbeddingBody,
    OpenAIRequestError,
    split_model,
)
from modelyard.protocol.openai_answers import (
    chat_answer,
    chat_chunk,
    completion_answer,
    completion_chunk,
    embeddings_answer,
    model_card,
    model_list,
    new_id,
    now_s,
    usage,
    usage_chunk,
)
from modelyard.protocol.types import InferInput, InferRequest, TensorMetadata

COMPLETION_MAX_TOKENS = 16
"""``max_tokens`` of ``/v1/completions`` when not given: OpenAI's (and llama.cpp's) default.
Chat completions default to the rest of the context, as OpenAI's do."""

GenerateBody = CompletionBody | ChatCompletionBody


def generate_request(body: GenerateBody, timeout_s: float | None) -> GenerateRequest:
    """The protocol-neutral request for a completion or chat body.

    Sampling defaults are OpenAI's: temperature 1, top_p 1; 0 is greedy.
    """
    name, version = split_model(body.model)
    if isinstance(body, ChatCompletionBody):
        limit = body.completion_limit()
        prompt = None
        messages: tuple[ChatMessage, ...] | None = tuple(
            ChatMessage(role, text) for role, text in body.chat_messages()
        )
    else:
        limit = COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        prompt = body.prompt_text()
        messages = None
    sampling = SamplingParams(
        max_tokens=limit,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        seed=body.seed,
        stop=body.stop_strings(),
    )
    return GenerateRequest(
        model=name,
        version=version,
        prompt=prompt,
        messages=messages,
        sampling=sampling,
        priority=body.priority,
        timeout_s=timeout_s,
    )


class OpenAIPlane:
    """``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``, ``/v1/embeddings``."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dp = dataplane
        self.created = now_s()
        """``created`` of every model card: when this server started."""

    def models(self) -> dict[str, Any]:
        """Every model a request may name (loaded or not: naming one loads it)."""
        names = sorted({row["name"] for row in self.dp.repository_index()})
        return model_list(names, self.created)

    def model(self, model: str) -> dict[str, Any]:
        """One model's card; ModelNotFoundError when the server has no such model."""
        name, version = split_model(model)
        self.dp.model_ready(name, version)  # resolves: unknown names and versions raise
        return model_card(model, self.created)

    async def complete(self, body: GenerateBody, timeout_s: float | None) -> dict[str, Any]:
        """The whole completion (``stream: false``), with its ``usage``."""
        chunks = self.dp.generate(generate_request(body, timeout_s))
        parts: list[str] = []
        last: GenerateChunk | None = None
        try:
            async for chunk in chunks:
                parts.append(chunk.text)
                last = chunk
        finally:
            await _close(chunks)
        finish = None if last is None else last.finish_reason
        counts = usage(*_counts(last))
        answer = chat_answer if isinstance(body, ChatCompletionBody) else completion_answer
        prefix = "chatcmpl" if isinstance(body, ChatCompletionBody) else "cmpl"
        return answer(new_id(prefix), now_s(), body.model, "".join(parts), finish, counts)

    async def stream(
        self, body: GenerateBody, timeout_s: float | None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The events of a streamed completion, ``[DONE]`` excluded.

        Nothing is yielded before the model produced its first piece, so every error a
        request can meet before generating (unknown model, too long for the context,
        queue full, deadline) comes out of the first ``anext``, before any event.
        Closing this iterator closes the generation under it.
        """
        chunks = self.dp.generate(generate_request(body, timeout_s))
        is_chat = isinstance(body, ChatCompletionBody)
        answer_id, created = new_id("chatcmpl" if is_chat else "cmpl"), now_s()
        include_usage = body.include_usage
        last: GenerateChunk | None = None
        try:
            first = True
            async for chunk in chunks:
                last = chunk
                if is_chat:
                    if first:  # OpenAI's first chat event says who speaks
                        role = {"role": "assistant", "content": ""}
                        event = chat_chunk(answer_id, created, body.model, role, None)
                        yield _with_usage(event, include_usage)
                    first = False
                    if chunk.text:
                        event = chat_chunk(
                            answer_id, created, body.model, {"content": chunk.text}, None
                        )
                        yield _with_usage(event, include_usage)
                    if chunk.finish_reason is not None:
                        event = chat_chunk(answer_id, created, body.model, {}, chunk.finish_reason)
                        yield _with_usage(event, include_usage)
                elif chunk.text or chunk.finish_reason is not None:
                    event = completion_chunk(
                        answer_id, created, body.model, chunk.text, chunk.finish_reason
                    )
                    yield _with_usage(event, include_usage)
        finally:
            await _close(chunks)
        if include_usage:
            yield usage_chunk(answer_id, created, body.model, is_chat, usage(*_counts(last)))

    async def embeddings(self, body: EmbeddingBody, timeout_s: float | None) -> dict[str, Any]:
        """One vector per text, from a model with one BYTES input and an FP32 [n, d] output.

        ``timeout_s`` (the client's own deadline, None: the model's) bounds the whole
        call, a load included, as on ``/predict``.
        """
        started = self.dp.clock.monotonic()
        name, version = split_model(body.model)
        if self.dp.model_metadata(name, version).generative:  # refused without loading it
            raise OpenAIRequestError(
                f"model {name!r} generates text; embeddings need a text encoder", "model"
            )
        meta = await self.dp.model_metadata_loaded(name, version, timeout_s)
        text_input = _text_input(name, meta.inputs)
        vector_output, tokens_output = _vector_outputs(name, meta.outputs)
        texts = body.texts()
        if timeout_s is not None:
            timeout_s -= self.dp.clock.monotonic() - started
            if timeout_s <= 0:
                raise DeadlineExceededError(f"the request's deadline passed before {name!r} ran")
        array = array_from_nested(text_input, "BYTES", texts)
        request = InferRequest(
            model_name=name,
            model_version=version,
            inputs=[InferInput(text_input, "BYTES", array.shape, array)],
            priority=body.priority,
            timeout_s=timeout_s,
        )
        response = await self.dp.infer(request)
        outputs = {o.name: o.array for o in response.outputs}
        vectors = np.asarray(outputs[vector_output], dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(texts):
            raise InvalidInputError(
                f"model {name!r} answered shape {list(vectors.shape)} for {len(texts)} texts; "
                "an embedding model answers one vector per text"
            )
        if body.dimensions is not None and body.dimensions != vectors.shape[1]:
            raise OpenAIRequestError(
                f"model {name!r} makes {vectors.shape[1]}-dimensional embeddings; "
                f"'dimensions' must be {vectors.shape[1]} or left out",
                "dimensions",
            )
        tokens = 0
        if tokens_output is not None:
            tokens = int(np.asarray(outputs[tokens_output]).sum())
        self.dp.check_response_bytes(vectors.nbytes * 3)  # JSON floats: ~3x the raw bytes
        return embeddings_answer(body.model, vectors, tokens, body.encoding_format)


def _text_input(model: str, inputs: tuple[TensorMetadata, ...]) -> str:
    if len(inputs) != 1 or inputs[0].datatype != "BYTES":
        raise OpenAIRequestError(
            f"model {model!r} is not a text embedding model: embeddings need one BYTES "
            f"input; it has {', '.join(i.name + ':' + i.datatype for i in inputs) or 'none'}",
            "model",
        )
    return inputs[0].name


def _vector_outputs(model: str, outputs: tuple[TensorMetadata, ...]) -> tuple[str, str | None]:
    """The FP32 [n, d] output (``embedding`` when several) and an optional INT* [n]
    output of token counts (``tokens``), which becomes ``usage``."""
    vectors = [o for o in outputs if o.datatype == "FP32" and len(o.shape) == 2]
    if not vectors:
        raise OpenAIRequestError(
            f"model {model!r} is not an embedding model: it has no FP32 [batch, width] output",
            "model",
        )
    chosen = next((o for o in vectors if o.name == "embedding"), vectors[0])
    counts = next((o for o in outputs if o.name == "tokens" and o.datatype.startswith("INT")), None)
    return chosen.name, None if counts is None else counts.name


def _counts(last: GenerateChunk | None) -> tuple[int, int]:
    """``(prompt_tokens, completion_tokens)``: running totals, final on the last chunk."""
    return (0, 0) if last is None else (last.prompt_tokens, last.completion_tokens)


def _with_usage(event: dict[str, Any], include_usage: bool) -> dict[str, Any]:
    # With include_usage, OpenAI's content chunks carry "usage": null until the last one.
    if include_usage:
        event["usage"] = None
    return event


async def _close(chunks: AsyncIterator[GenerateChunk]) -> None:
    """Close a generation early (stops it in the worker); a no-op once it ended."""
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        await aclose()
