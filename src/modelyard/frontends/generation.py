"""Text generation for generative models: the data plane's ``generate`` and its helpers.

The front-end half of a generation: validate the request, then hand it to the
manager's generation verbs (:class:`GenerationBackend`, ``manager/generation_service.py``),
which take the road every request takes: the router resolves and leases the version
(hot-loading it within the deadline) and picks a replica, whose generation scheduler
(admission, circuit breaker, ``parallel`` slots, a priority queue bounded by
``max_queue_size``, deadlines, brownout, preemption) runs it on that replica's worker.
Here: the serving check, names, the request's own limits, metrics, and the whole-answer
form. Closing the stream early (the client went away, a deadline passed) closes the
replica's stream, which cancels the job in the worker.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, Protocol

from modelyard.clock import Clock
from modelyard.errors import InternalError, InvalidInputError, ModelNotReadyError
from modelyard.observability.metrics import OK, Metrics, outcome_code
from modelyard.protocol.generate import (
    BROWNOUT_KEY,
    SAMPLING_KEYS,
    GenerateChunk,
    GenerateRequest,
    GenerationTarget,
    check_generate_request,
    check_max_tokens,
    sampling_from_params,
)
from modelyard.protocol.names import check_model_name, check_version_name
from modelyard.protocol.types import check_client_timeout
from modelyard.scheduling.generation_scheduler import GenerationLoad


class GenerationBackend(Protocol):
    """What generation needs from the manager (``GenerationService`` provides it)."""

    def is_generative(self, name: str) -> bool:
        """True when ``name`` is a configured generative model."""
        ...

    def target(self, name: str, version: str | None) -> GenerationTarget:
        """The version a request for ``name`` at ``version`` resolves to now."""
        ...

    def stream(
        self,
        target: GenerationTarget,
        request: GenerateRequest,
        *,
        started: float,
        client_timeout_s: float | None,
    ) -> AsyncGenerator[GenerateChunk, None]:
        """Route, lease a replica and stream ``request`` through its scheduler."""
        ...

    async def run_task(
        self,
        target: GenerationTarget,
        request: GenerateRequest,
        *,
        started: float,
        client_timeout_s: float | None,
    ) -> GenerateChunk:
        """``tokenize``/``detokenize`` on a leased replica's worker."""
        ...

    def load(self, name: str, version: str) -> GenerationLoad | None:
        """A generative version's streams over its replicas, read live."""
        ...


class Generation:
    """Generation requests of one server: validation and metrics; the rest is the
    backend's (routing, the replica's scheduler, its worker)."""

    def __init__(
        self,
        backend: GenerationBackend,
        metrics: Metrics | None,
        clock: Clock,
        check_response_bytes: Callable[[int], None],
    ) -> None:
        self.backend = backend
        self.metrics = metrics
        self.clock = clock
        self.check_response_bytes = check_response_bytes
        self.is_serving: Callable[[], bool] = lambda: True
        """Set by the data plane: False while starting or shutting down."""

    def is_generative(self, name: str) -> bool:
        """True when ``name`` is a configured generative model."""
        return self.backend.is_generative(name)

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
        context, with the arithmetic), OverloadedError (queue full), CircuitOpenError
        (the replica's breaker is open after failures), DeadlineExceededError (no first
        token by the deadline). An error after the first chunk is raised from the
        iterator (WorkerCrashedError when the worker died). Closing the iterator early
        (the client went away) stops generation in the worker.

        Deadlines: the first token must come within the model's ``timeout_s`` (a load
        waited for does not count), and the client's ``timeout_s`` caps the whole stream.
        Brownout: a request that finds its replica overloaded on arrival (see
        :mod:`modelyard.scheduling.brownout`) runs with ``max_tokens`` capped at the
        model's ``brownout_max_tokens``; its chunks carry ``max_tokens_capped_to``.
        """
        started = self.clock.monotonic()
        target = self._target(
            request, "does not generate text (runtime {runtime!r}); use the inference API"
        )
        check_generate_request(request)
        client_timeout_s = check_client_timeout(request.timeout_s)
        check_max_tokens(request, target.context_length, target.name)
        metrics = self.metrics
        code: str = OK
        first_at: float | None = None
        last: GenerateChunk | None = None
        stream = self.backend.stream(
            target, request, started=started, client_timeout_s=client_timeout_s
        )
        try:
            async for chunk in stream:
                if first_at is None:
                    first_at = self.clock.monotonic()
                last = chunk
                yield chunk
                if chunk.finish_reason is not None:
                    return
        except BaseException as exc:
            code = outcome_code(exc)
            raise
        finally:
            await stream.aclose()  # early: cancels generation in the worker
            if metrics is not None:
                self._count(metrics, target, code, started, first_at, last)

    def _count(
        self,
        metrics: Metrics,
        target: GenerationTarget,
        code: str,
        started: float,
        first_at: float | None,
        last: GenerateChunk | None,
    ) -> None:
        now = self.clock.monotonic()
        metrics.request_done(target.name, target.version, code, now - started)
        if last is not None and first_at is not None:
            metrics.generation_done(
                target.name,
                target.version,
                ttft_s=first_at - started,
                decode_s=now - first_at,
                prompt_tokens=last.prompt_tokens,
                completion_tokens=last.completion_tokens,
            )

    async def run_task(self, request: GenerateRequest) -> GenerateChunk:
        """``tokenize`` or ``detokenize`` (``request.task``): routed like a generation
        (resolve, hot-load within the deadline) but answered by the worker at once, in
        one chunk, without a generation slot or the queue."""
        started = self.clock.monotonic()
        target = self._target(
            request,
            "has no tokenizer here (runtime {runtime!r}); tokenize needs a generative model",
        )
        client_timeout_s = check_client_timeout(request.timeout_s)
        chunk = await self.backend.run_task(
            target, request, started=started, client_timeout_s=client_timeout_s
        )
        self.check_response_bytes(len(chunk.text) + 16 * len(chunk.token_ids))
        return chunk

    def _target(self, request: GenerateRequest, refusal: str) -> GenerationTarget:
        """The version ``request`` resolves to, refused unless the server serves and the
        model generates text (``refusal``: why not, with ``{runtime}``)."""
        if not self.is_serving():
            raise ModelNotReadyError("server is not ready (starting or shutting down)")
        name = check_model_name(request.model)
        target = self.backend.target(name, check_version_name(request.version))
        if not target.generative:
            raise InvalidInputError(
                f"model {request.model!r} " + refusal.format(runtime=target.runtime)
            )
        return target

    def generation_gate(self, name: str, version: str) -> GenerationLoad | None:
        """The streams of a generative model version over its replicas, read live
        (running, queued, preemptions); None when it is not a generative version."""
        return self.backend.load(name, version)
