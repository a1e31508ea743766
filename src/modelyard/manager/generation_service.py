"""The manager's generation verbs: what the generation front end asks of the manager.

A generation takes the road every request takes: the router resolves the version,
leases it (hot-loading it within the deadline) and picks one of its ready replicas; the
request then goes through that replica's scheduler (a
:class:`~modelyard.scheduling.generation_scheduler.GenerationScheduler`: admission,
breaker, slots, deadlines) to that replica's worker. The front end
(``frontends/generation.py``) validates and counts; it never sees a record, a router
or a worker.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import replace

from modelyard.errors import InvalidInputError, ModelNotReadyError
from modelyard.manager.llm_memory import context_length_of
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.manager.router import Router
from modelyard.protocol.generate import (
    GenerateChunk,
    GenerateRequest,
    GenerationTarget,
    check_max_tokens,
)
from modelyard.scheduling.generation_scheduler import GenerationLoad, GenerationScheduler
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


class GenerationService:
    """Resolve, route and stream generation requests onto the replicas of a version."""

    def __init__(self, manager: ModelManager, router: Router) -> None:
        self._manager = manager
        self._router = router

    def is_generative(self, name: str) -> bool:
        """True when ``name`` is a configured generative model."""
        entry = self._manager.entries.get(name)
        return entry is not None and entry.config.is_generative

    def target(self, name: str, version: str | None) -> GenerationTarget:
        """The version ``name`` at ``version`` (a version, an alias or the default)
        resolves to now (ModelNotFoundError when unknown)."""
        record = self._router.resolve(name, version)
        return GenerationTarget(
            name=record.key.name,
            version=record.key.version,
            runtime=record.config.runtime,
            generative=record.config.is_generative,
            context_length=context_length(record),
        )

    async def stream(
        self,
        target: GenerationTarget,
        request: GenerateRequest,
        *,
        started: float,
        client_timeout_s: float | None,
    ) -> AsyncGenerator[GenerateChunk, None]:
        """The chunks of ``request`` on the replica the router leases: routed (lease,
        hot load within the deadline), then that replica's generation scheduler. The
        lease holds for the whole stream; closing the iterator early cancels the job in
        the worker. Each chunk carries the version that ran it."""
        record = self._record(target)
        async with self._router.route_request(record, started, client_timeout_s) as route:
            # The worker's own context length is known once it is loaded.
            check_max_tokens(request, context_length(record), record.key.name)
            end = None if client_timeout_s is None else started + client_timeout_s
            chunks = route.target.stream(
                request, priority=request.priority, deadline=route.deadline, end=end
            )
            try:
                async for chunk in chunks:
                    yield replace(chunk, model_version=record.key.version)
            finally:
                await chunks.aclose()

    async def run_task(
        self,
        target: GenerationTarget,
        request: GenerateRequest,
        *,
        started: float,
        client_timeout_s: float | None,
    ) -> GenerateChunk:
        """``tokenize``/``detokenize``: routed like a generation, answered at once by the
        leased replica's worker in one chunk (no sequence slot, no queue)."""
        record = self._record(target)
        async with self._router.route_request(record, started, client_timeout_s) as route:
            chunk = await route.target.run_task(request, route.deadline)
        return replace(chunk, model_version=record.key.version)

    def load(self, name: str, version: str) -> GenerationLoad | None:
        """The streams of a generative version over its replicas, read live (None: not
        a known generative version)."""
        entry = self._manager.entries.get(name)
        record = None if entry is None else entry.versions.get(version)
        if record is None or not record.config.is_generative:
            return None
        return GenerationLoad(lambda: _schedulers(record))

    async def counters(self, name: str, version: str | None = None) -> GenerationCounters:
        """The worker's own counters of a loaded generative model (tokens it generated,
        active sequences, KV-cache bytes); ModelNotReadyError when it is not loaded."""
        record = self._router.resolve(name, version)
        instance = record.instance
        if not record.is_ready or not isinstance(instance, GenerativeInstance):
            raise ModelNotReadyError(f"model {record.key} is not a loaded generative model")
        return await instance.generation_counters()

    def _record(self, target: GenerationTarget) -> ModelRecord:
        record = self._router.resolve(target.name, target.version)
        if record.key != ModelKey(target.name, target.version):
            raise InvalidInputError(f"model {target.name!r} has no version {target.version!r}")
        return record


def _schedulers(record: ModelRecord) -> list[GenerationScheduler]:
    return [r.generation for r in record.serving() if r.generation is not None]
