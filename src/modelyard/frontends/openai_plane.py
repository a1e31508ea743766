"""The OpenAI-compatible verbs on top of the data plane, whatever the transport.

Requests arrive already parsed (:mod:`modelyard.protocol.openai`); this module routes
them through :class:`~modelyard.frontends.dataplane.DataPlane` exactly as every other
request goes (resolve, hot-load within the deadline, queue, run), and builds OpenAI's
answers (:mod:`modelyard.protocol.openai_answers`). It never touches the manager.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from modelyard.errors import DeadlineExceededError, InvalidInputError
from modelyard.frontends.dataplane import DataPlane
from modelyard.protocol.generate import (
    ChatMessage,
    GenerateChunk,
    GenerateRequest,
    SamplingParams,
    TokenLogprob,
)
from modelyard.protocol.json_tensors import array_from_nested
from modelyard.protocol.openai import (
    MAX_SEED,
    ChatCompletionBody,
    CompletionBody,
    DetokenizeBody,
    EmbeddingBody,
    OpenAIRequestError,
    TokenizeBody,
    split_model,
)
from modelyard.protocol.openai_answers import (
    assistant_message,
    chat_answer,
    chat_choice,
    chat_logprobs,
    completion_answer,
    completion_logprobs,
    embeddings_answer,
    model_card,
    model_list,
    new_id,
    now_s,
    stream_event,
    system_fingerprint,
    text_choice,
    tokenize_answer,
    usage,
    usage_chunk,
)
from modelyard.protocol.openai_tools import call_schema, read_calls
from modelyard.protocol.types import InferInput, InferRequest, TensorMetadata

COMPLETION_MAX_TOKENS = 16
"""``max_tokens`` of ``/v1/completions`` when not given: OpenAI's (and llama.cpp's) default.
Chat completions default to the rest of the context, as OpenAI's do."""

GenerateBody = CompletionBody | ChatCompletionBody


def generate_request(
    body: GenerateBody, timeout_s: float | None, index: int = 0
) -> GenerateRequest:
    """The protocol-neutral request for choice ``index`` of a completion or chat body.

    Sampling defaults are OpenAI's: temperature 1, top_p 1; 0 is greedy. Each choice is
    a sequence of its own; with a ``seed``, choice ``i`` draws with ``seed + i``.
    """
    name, version = split_model(body.model)
    chat_context: str | None = None
    if isinstance(body, ChatCompletionBody):
        limit = body.completion_limit()
        prompt = None
        messages: tuple[ChatMessage, ...] | None = tuple(
            ChatMessage(role, text) for role, text in body.chat_messages()
        )
        logprobs = body.top_logprobs_count()
        schema = _chat_schema(body)
        chat_context = body.chat_context()
    else:
        limit = COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        prompt = body.prompt_text()
        messages = None
        logprobs = body.logprobs
        schema = None
    seed = None if body.seed is None else (body.seed + index) % (MAX_SEED + 1)
    sampling = SamplingParams(
        max_tokens=limit,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        seed=seed,
        stop=body.stop_strings(),
        frequency_penalty=body.frequency_penalty or 0.0,
        presence_penalty=body.presence_penalty or 0.0,
        logit_bias=body.logit_bias_pairs(),
        json_schema=schema,
        logprobs=logprobs,
    )
    return GenerateRequest(
        model=name,
        version=version,
        prompt=prompt,
        messages=messages,
        sampling=sampling,
        priority=body.priority,
        timeout_s=timeout_s,
        chat_context=chat_context,
    )


def _chat_schema(body: ChatCompletionBody) -> str | None:
    """The schema the answer must match: a required tool call's, or ``response_format``'s."""
    mode = body.tool_mode
    if mode == "required" or mode.startswith("function:"):
        only = mode.removeprefix("function:") if mode != "required" else None
        return call_schema(body.tools or [], only)
    return None if body.response_format is None else body.response_format.schema_text()


@dataclass(slots=True)
class _Choice:
    """What one choice generated so far."""

    parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    last: GenerateChunk | None = None


class OpenAIPlane:
    """``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``, ``/v1/embeddings``,
    ``/tokenize``, ``/detokenize``."""

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
        """The whole completion (``stream: false``): its ``n`` choices, with ``usage``."""
        tasks = [
            asyncio.create_task(self._collect(generate_request(body, timeout_s, i)))
            for i in range(body.choices)
        ]
        try:
            results = await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()  # one choice failed: the others stop too
        # The answer's size, roughly: the text, and ~64 bytes per logprob entry in JSON.
        self.dp.check_response_bytes(
            sum(len(p) for r in results for p in r.parts)
            + 64 * sum(1 + len(lp.top) for r in results for lp in r.logprobs)
        )
        lasts = [r.last for r in results]
        counts = usage(*_counts(lasts))
        fingerprint = _fingerprint(body, lasts[0])
        if isinstance(body, ChatCompletionBody):
            choices = [_chat_final(body, i, r) for i, r in enumerate(results)]
            return chat_answer(
                new_id("chatcmpl"), now_s(), body.model, choices, counts, fingerprint
            )
        echo = body.prompt_text() if body.echo else ""
        choices = [
            text_choice(
                i,
                echo + "".join(r.parts),
                _finish(r.last),
                None if body.logprobs is None else completion_logprobs(r.logprobs, len(echo)),
            )
            for i, r in enumerate(results)
        ]
        return completion_answer(new_id("cmpl"), now_s(), body.model, choices, counts, fingerprint)

    async def _collect(self, request: GenerateRequest) -> _Choice:
        chunks = self.dp.generate(request)
        choice = _Choice()
        try:
            async for chunk in chunks:
                choice.parts.append(chunk.text)
                choice.logprobs.extend(chunk.logprobs)
                choice.last = chunk
        finally:
            await _close(chunks)
        return choice

    async def stream(
        self, body: GenerateBody, timeout_s: float | None
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The events of a streamed completion, ``[DONE]`` excluded.

        Nothing is yielded before the model produced its first piece, so every error a
        request can meet before generating (unknown model, too long for the context,
        queue full, deadline) comes out of the first ``anext``, before any event.
        Closing this iterator closes the generation under it. A chat with tools sends
        each choice's answer in one piece at its end (only then is it known whether the
        model called a tool).
        """
        writer = _EventWriter(body)
        chunks = _merged(
            [self.dp.generate(generate_request(body, timeout_s, i)) for i in range(body.choices)]
        )
        try:
            async for index, chunk in chunks:
                for event in writer.events(index, chunk):
                    yield event
        finally:
            await _close(chunks)
        if body.include_usage:
            yield writer.usage_event()

    async def tokenize(self, body: TokenizeBody, timeout_s: float | None) -> dict[str, Any]:
        """``POST /tokenize``: the model's own token ids of ``content``."""
        name, version = split_model(self._tokenizer_model(body.model))
        request = GenerateRequest(
            model=name,
            version=version,
            prompt=body.content,
            messages=None,
            sampling=SamplingParams(),
            timeout_s=timeout_s,
            task="tokenize",
            add_special=body.add_special,
        )
        chunk = await self.dp.generation_task(request)
        return tokenize_answer(chunk.token_ids, chunk.logprobs if body.with_pieces else None)

    async def detokenize(self, body: DetokenizeBody, timeout_s: float | None) -> dict[str, Any]:
        """``POST /detokenize``: the text of token ids."""
        name, version = split_model(self._tokenizer_model(body.model))
        request = GenerateRequest(
            model=name,
            version=version,
            prompt=None,
            messages=None,
            sampling=SamplingParams(),
            timeout_s=timeout_s,
            task="detokenize",
            token_ids=tuple(body.tokens),
        )
        chunk = await self.dp.generation_task(request)
        return {"content": chunk.text}

    def _tokenizer_model(self, model: str | None) -> str:
        """``model``, or the only generative model when it is not given."""
        if model is not None:
            return model
        names = [m.name for m in self.dp.generative_models()]
        if len(names) != 1:
            raise OpenAIRequestError(
                f"'model' is required: this server has {len(names)} generative models", "model"
            )
        return names[0]

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
        self.dp.check_elements(request.inputs)
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


def _counts(lasts: list[GenerateChunk | None]) -> tuple[int, int]:
    """``(prompt_tokens, completion_tokens)`` of every choice together (running totals,
    final on each choice's last chunk): the prompt once, the completions summed."""
    prompt = max((c.prompt_tokens for c in lasts if c is not None), default=0)
    return prompt, sum(c.completion_tokens for c in lasts if c is not None)


def _finish(last: GenerateChunk | None) -> str | None:
    return None if last is None else last.finish_reason


def _fingerprint(body: GenerateBody, last: GenerateChunk | None) -> str | None:
    if last is None:
        return None
    return system_fingerprint(split_model(body.model)[0], last.model_version)


def _chat_final(body: ChatCompletionBody, index: int, result: _Choice) -> dict[str, Any]:
    """A chat choice: the assistant's text, or its tool calls when it made some."""
    message, finish = _assistant("".join(result.parts), body, _finish(result.last))
    logprobs = chat_logprobs(result.logprobs) if body.logprobs else None
    return chat_choice(index, message, finish, logprobs)


def _assistant(
    text: str, body: ChatCompletionBody, finish: str | None
) -> tuple[dict[str, Any], str | None]:
    if body.tool_mode == "none":
        return assistant_message(text, []), finish
    content, calls = read_calls(text, body.tools or [])
    if not calls:
        return assistant_message(text, []), finish
    return assistant_message(content, [c.as_dict() for c in calls]), "tool_calls"


class _EventWriter:
    """Turns each choice's chunks into OpenAI's stream events, in order."""

    def __init__(self, body: GenerateBody) -> None:
        self.body = body
        self.chat = isinstance(body, ChatCompletionBody)
        self.id = new_id("chatcmpl" if self.chat else "cmpl")
        self.created = now_s()
        self.started: set[int] = set()
        self.held: dict[int, _Choice] = {}
        """A chat with tools: each choice's text, held until its end."""
        self.lasts: dict[int, GenerateChunk] = {}

    def events(self, index: int, chunk: GenerateChunk) -> list[dict[str, Any]]:
        """The events ``chunk`` of choice ``index`` makes (possibly none)."""
        self.lasts[index] = chunk
        first = index not in self.started
        self.started.add(index)
        fp = _fingerprint(self.body, chunk)
        if isinstance(self.body, ChatCompletionBody):
            choices = self._chat(self.body, index, chunk, first)
        else:
            choices = self._completion(self.body, index, chunk, first)
        events = [
            stream_event(self.id, self.created, self.body.model, self.chat, c, fp) for c in choices
        ]
        if self.body.include_usage:  # OpenAI's content chunks carry "usage": null then
            for event in events:
                event["usage"] = None
        return events

    def _chat(
        self, body: ChatCompletionBody, index: int, chunk: GenerateChunk, first: bool
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if first:  # OpenAI's first chat event says who speaks
            out.append(chat_choice(index, {"role": "assistant", "content": ""}, None, delta=True))
        finish = chunk.finish_reason
        if body.tool_mode != "none":
            held = self.held.setdefault(index, _Choice())
            held.parts.append(chunk.text)
            held.logprobs.extend(chunk.logprobs)
            if finish is None:
                return out
            message, finish = _assistant("".join(held.parts), body, finish)
            del message["role"]
            for call_index, call in enumerate(message.get("tool_calls", [])):
                call["index"] = call_index
            logprobs = chat_logprobs(held.logprobs) if body.logprobs else None
            out.append(chat_choice(index, message, None, logprobs, delta=True))
        elif chunk.text:
            logprobs = chat_logprobs(chunk.logprobs) if body.logprobs else None
            out.append(chat_choice(index, {"content": chunk.text}, None, logprobs, delta=True))
        if finish is not None:
            out.append(chat_choice(index, {}, finish, delta=True))
        return out

    def _completion(
        self, body: CompletionBody, index: int, chunk: GenerateChunk, first: bool
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if first and body.echo:
            out.append(text_choice(index, body.prompt_text(), None))
        if chunk.text or chunk.finish_reason is not None:
            logprobs = None
            if body.logprobs is not None:
                held = self.held.setdefault(index, _Choice())
                offset = sum(len(p) for p in held.parts)
                held.parts.append(chunk.text)
                logprobs = completion_logprobs(chunk.logprobs, offset)
            out.append(text_choice(index, chunk.text, chunk.finish_reason, logprobs))
        return out

    def usage_event(self) -> dict[str, Any]:
        """The last event of ``include_usage``: every choice's counts."""
        counts = usage(*_counts(list(self.lasts.values())))
        return usage_chunk(self.id, self.created, self.body.model, self.chat, counts)


async def _merged(
    streams: list[AsyncGenerator[GenerateChunk, None]],
) -> AsyncGenerator[tuple[int, GenerateChunk], None]:
    """``(choice index, chunk)`` of several generations as they come; the first error
    ends all of them. One stream is passed through without a task."""
    if len(streams) == 1:
        try:
            async for chunk in streams[0]:
                yield 0, chunk
        finally:
            await _close(streams[0])
        return
    inbox: asyncio.Queue[tuple[int, GenerateChunk | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncGenerator[GenerateChunk, None]) -> None:
        try:
            async for chunk in stream:
                await inbox.put((index, chunk))
            await inbox.put((index, None))
        except Exception as exc:
            await inbox.put((index, exc))
        finally:
            await _close(stream)

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    open_streams = len(tasks)
    try:
        while open_streams:
            index, item = await inbox.get()
            if item is None:
                open_streams -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _close(chunks: AsyncIterator[Any]) -> None:
    """Close a generation early (stops it in the worker); a no-op once it ended."""
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        await aclose()
