"""Text generation for generative models: the data plane's ``generate`` and its helpers.

A generation request takes the inference road up to the worker: validate, route (lease,
hot load within the deadline), then the model's generation gate (``parallel`` slots, a
priority queue bounded by ``max_queue_size``, the request's deadline) instead of the
tensor batcher, then the instance's stream. Closing the stream early (the client went
away, a deadline passed) closes the instance's stream, which cancels the job in the worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import replace
from typing import Any

from modelyard.clock import Clock
from modelyard.errors import (
    DeadlineExceededError,
    InternalError,
    InvalidInputError,
    ModelNotReadyError,
)
from modelyard.manager.llm_memory import context_length_of
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.manager.router import Router, check_client_timeout
from modelyard.observability.metrics import OK, Metrics, outcome_code
from modelyard.protocol.generate import (
    BROWNOUT_KEY,
    SAMPLING_KEYS,
    GenerateChunk,
    GenerateRequest,
    check_generate_request,
    sampling_from_params,
)
from modelyard.protocol.names import check_model_name, check_version_name
from modelyard.scheduling.brownout import brownout_cap
from modelyard.scheduling.generation_gate import GenerationGate, Ticket
from modelyard.workers.instance import GenerationCounters, GenerativeInstance


def context_length(record: ModelRecord) -> int | None:
    """Tokens per sequence of a generative model: as its worker reported it once loaded,
    else from its file's header; None for other models."""
    if not record.config.is_generative:
        return None
    info = record.info
    if info is not None:
        n_ctx = info.details.get("context_length")
        if isinstance(n_ctx, int) and n_ctx > 0:
            return n_ctx
    return context_length_of(record)


class Generation:
    """Generation requests of one server: validation, gates, deadlines, metrics."""

    def __init__(
        self,
        manager: ModelManager,
        router: Router,
        metrics: Metrics | None,
        clock: Clock,
        check_response_bytes: Callable[[int], None],
    ) -> None:
        self.manager = manager
        self.router = router
        self.metrics = metrics
        self.clock = clock
        self.check_response_bytes = check_response_bytes
        self.is_serving: Callable[[], bool] = lambda: True
        """Set by the data plane: False while starting or shutting down."""
        self._gates: dict[ModelKey, GenerationGate] = {}

    def is_generative(self, name: str) -> bool:
        """True when ``name`` is a configured generative model."""
        entry = self.manager.entries.get(name)
        return entry is not None and entry.config.is_generative

    async def predict_text(
        self,
        doc: Mapping[str, Any],
        model: str,
        version: str | None,
        priority: int | None,
        timeout_s: float | None,
    ) -> dict[str, object]:
        """``/predict`` for a generative model: ``{"text", "parameters"?}`` (sampling
        parameters also at the top level) → ``{"model", "version", "text",
        "finish_reason", "usage"}``."""
        text = doc.get("text")
        if not isinstance(text, str):
            raise InvalidInputError(f"model {model!r} generates text: send 'text' as a string")
        params = doc.get("parameters") or {}
        if not isinstance(params, Mapping):
            raise InvalidInputError("'parameters' must be an object")
        merged = {k: v for k, v in doc.items() if k in SAMPLING_KEYS} | dict(params)
        request = GenerateRequest(
            model=model,
            version=version,
            prompt=text,
            messages=None,
            sampling=sampling_from_params(merged),
            priority=priority,
            timeout_s=timeout_s,
        )
        return await self.generate_text(request)

    async def generate_text(self, request: GenerateRequest) -> dict[str, object]:
        """The whole generation as one answer: ``{"model", "version", "text",
        "finish_reason", "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}``,
        plus ``"max_tokens_capped_to"`` when brownout capped the request."""
        parts: list[str] = []
        last: GenerateChunk | None = None
        stream = self.generate(request)
        try:
            async for chunk in stream:
                parts.append(chunk.text)
                last = chunk
        finally:
            await stream.aclose()
        if last is None:
            raise InternalError(f"model {request.model!r} produced no answer")
        text = "".join(parts)
        self.check_response_bytes(len(text))
        answer: dict[str, object] = {
            "model": request.model,
            "version": last.model_version,
            "text": text,
            "finish_reason": last.finish_reason,
            "usage": {
                "prompt_tokens": last.prompt_tokens,
                "completion_tokens": last.completion_tokens,
                "total_tokens": last.prompt_tokens + last.completion_tokens,
            },
        }
        if last.max_tokens_capped_to is not None:
            answer[BROWNOUT_KEY] = last.max_tokens_capped_to
        return answer

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        """Generate text for ``request``, one :class:`GenerateChunk` per piece produced.

        An async generator; the last chunk carries ``finish_reason`` and the token counts.
        Typed errors before the first chunk: ModelNotFoundError (unknown model),
        InvalidInputError (not a generative model; a prompt or ``max_tokens`` beyond the
        context, with the arithmetic), OverloadedError (queue full),
        DeadlineExceededError (no first token by the deadline). An error after the first
        chunk is raised from the iterator (WorkerCrashedError when the worker died).
        Closing the iterator early (the client went away) stops generation in the worker.

        Deadlines: the first token must come within the model's ``timeout_s`` (a load
        waited for does not count), and the client's ``timeout_s`` caps the whole stream.
        Brownout: a request that finds the model overloaded on arrival (see
        :mod:`modelyard.scheduling.brownout`) runs with ``max_tokens`` capped at the
        model's ``brownout_max_tokens``; its chunks carry ``max_tokens_capped_to``.
        """
        if not self.is_serving():
            raise ModelNotReadyError("server is not ready (starting or shutting down)")
        started = self.clock.monotonic()
        name = check_model_name(request.model)
        record = self.manager.resolve(name, check_version_name(request.version))
        if not record.config.is_generative:
            raise InvalidInputError(
                f"model {request.model!r} does not generate text (runtime "
                f"{record.config.runtime!r}); use the inference API"
            )
        check_generate_request(request)
        client_timeout_s = check_client_timeout(request.timeout_s)
        self._check_max_tokens(record, request)
        metrics = self.metrics
        code: str = OK
        first_at: float | None = None
        last: GenerateChunk | None = None
        try:
            async with self.router.route_request(record, started, client_timeout_s) as route:
                self._check_max_tokens(record, request)
                gate = self._gate(record)
                priority = record.config.priority if request.priority is None else request.priority
                capped = self._brownout(record, gate, request)
                if capped is not None:
                    request = replace(
                        request, sampling=replace(request.sampling, max_tokens=capped)
                    )
                async with gate.slot(priority, route.deadline) as ticket:
                    if capped is not None and metrics is not None:
                        metrics.brownout(record.key.name)  # admitted: not refused below
                    end = None if client_timeout_s is None else started + client_timeout_s
                    stream = self._resumable(record, request, gate, ticket, route.deadline, end)
                    try:
                        async for raw in stream:
                            if first_at is None:
                                first_at = self.clock.monotonic()
                            chunk = replace(
                                raw, model_version=record.key.version, max_tokens_capped_to=capped
                            )
                            last = chunk
                            yield chunk
                            if chunk.finish_reason is not None:
                                return
                    finally:
                        await stream.aclose()
        except BaseException as exc:
            code = outcome_code(exc)
            raise
        finally:
            if metrics is not None:
                now = self.clock.monotonic()
                metrics.request_done(record.key.name, record.key.version, code, now - started)
                if last is not None and first_at is not None:
                    metrics.generation_done(
                        record.key.name,
                        record.key.version,
                        ttft_s=first_at - started,
                        decode_s=now - first_at,
                        prompt_tokens=last.prompt_tokens,
                        completion_tokens=last.completion_tokens,
                    )

    async def _resumable(
        self,
        record: ModelRecord,
        request: GenerateRequest,
        gate: GenerationGate,
        ticket: Ticket,
        first_deadline: float | None,
        end: float | None,
    ) -> AsyncGenerator[GenerateChunk, None]:
        """The instance's chunks for ``request``, across preemptions: when a more
        important request wants the slot (``ticket.preempt_requested``, seen between two
        chunks), the sequence stops in the worker, the slot is given up until it comes
        back, and the sequence resumes from the tokens already sent."""
        sent: list[int] = []
        first_at: float | None = None
        while True:
            instance = record.instance
            if not isinstance(instance, GenerativeInstance):
                raise ModelNotReadyError(f"model {record.key} is not ready")
            again = replace(request, resume_token_ids=tuple(sent)) if sent else request
            stream = instance.generate(again)
            try:
                while not ticket.preempt_requested:
                    limit = first_deadline if first_at is None else end
                    chunk = await self._next_chunk(record, stream, limit, first_at)
                    if first_at is None:
                        first_at = self.clock.monotonic()
                    sent += chunk.token_ids
                    yield chunk
                    if chunk.finish_reason is not None:
                        return
            finally:
                await stream.aclose()  # early: cancels generation in the worker
            if self.metrics is not None:
                self.metrics.preempted(record.key.name)
            await gate.pause(ticket, end if first_at is not None else first_deadline)

    async def run_task(self, request: GenerateRequest) -> GenerateChunk:
        """``tokenize`` or ``detokenize`` (``request.task``): routed like a generation
        (resolve, hot-load within the deadline) but answered by the worker at once, in
        one chunk, without a generation slot or the gate's queue."""
        if not self.is_serving():
            raise ModelNotReadyError("server is not ready (starting or shutting down)")
        started = self.clock.monotonic()
        name = check_model_name(request.model)
        record = self.manager.resolve(name, check_version_name(request.version))
        if not record.config.is_generative:
            raise InvalidInputError(
                f"model {request.model!r} has no tokenizer here (runtime "
                f"{record.config.runtime!r}); tokenize needs a generative model"
            )
        client_timeout_s = check_client_timeout(request.timeout_s)
        async with self.router.route_request(record, started, client_timeout_s) as route:
            instance = record.instance
            if not isinstance(instance, GenerativeInstance):
                raise ModelNotReadyError(f"model {record.key} is not ready")
            stream = instance.generate(request)
            try:
                chunk = await self._next_chunk(record, stream, route.deadline, None)
            finally:
                await stream.aclose()
        self.check_response_bytes(len(chunk.text) + 16 * len(chunk.token_ids))
        return replace(chunk, model_version=record.key.version)

    async def _next_chunk(
        self,
        record: ModelRecord,
        stream: AsyncIterator[GenerateChunk],
        deadline: float | None,
        first_at: float | None,
    ) -> GenerateChunk:
        timeout = None if deadline is None else deadline - self.clock.monotonic()
        try:
            async with asyncio.timeout(None if timeout is None else max(0.0, timeout)):
                return await anext(stream)
        except TimeoutError:
            what = "its first token" if first_at is None else "the end of its stream"
            raise DeadlineExceededError(
                f"model {record.key} did not produce {what} by the request's deadline"
            ) from None
        except StopAsyncIteration:
            raise InternalError(f"model {record.key} ended a stream without a finish") from None

    def _check_max_tokens(self, record: ModelRecord, request: GenerateRequest) -> None:
        # The worker checks prompt + max_tokens once the prompt is tokenized; a
        # max_tokens that alone exceeds the context is refused before any queueing.
        n_ctx = context_length(record)
        wanted = request.sampling.max_tokens
        if n_ctx is not None and wanted is not None and wanted >= n_ctx:
            raise InvalidInputError(
                f"max_tokens {wanted} + a prompt of at least 1 token > the context of "
                f"{n_ctx} tokens per sequence of model {record.key.name!r}: ask for at most "
                f"{n_ctx - 1} new tokens"
            )

    def _brownout(
        self, record: ModelRecord, gate: GenerationGate, request: GenerateRequest
    ) -> int | None:
        # Decided on arrival, before the request joins the queue: the state it finds.
        gen = record.config.generation
        return brownout_cap(
            request.sampling.max_tokens,
            gen.brownout_max_tokens,
            running=gate.running,
            slots=gate.slots,
            queued=gate.queued,
            queue_depth=gen.brownout_queue_depth,
        )

    def _gate(self, record: ModelRecord) -> GenerationGate:
        gate = self._gates.get(record.key)
        if gate is None:
            cfg = record.config
            gate = GenerationGate(
                str(record.key),
                cfg.generation.parallel,
                cfg.max_queue_size,
                self.clock,
                preempt=cfg.generation.preempt,
            )
            self._gates[record.key] = gate
        return gate

    def generation_gate(self, name: str, version: str) -> GenerationGate | None:
        """The admission gate of a generative model version (None before its first
        request): its running and queued streams."""
        return self._gates.get(ModelKey(name, version))

    async def counters(self, name: str, version: str | None = None) -> GenerationCounters:
        """The worker's own counters of a loaded generative model (tokens it generated,
        active sequences, KV-cache bytes); ModelNotReadyError when it is not loaded."""
        record = self.manager.resolve(check_model_name(name), check_version_name(version))
        instance = record.instance
        if not record.is_ready or not isinstance(instance, GenerativeInstance):
            raise ModelNotReadyError(f"model {record.key} is not a loaded generative model")
        return await instance.generation_counters()
