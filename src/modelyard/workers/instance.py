"""The ModelInstance contract: one loaded replica of one model version.

The manager and scheduler talk only to this interface; whether the runtime lives in
the server process (:class:`~modelyard.workers.inline.InlineInstance`) or in a worker
process (``workers/process.py``) is the instance's business.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from modelyard.protocol.generate import GenerateChunk, GenerateRequest
from modelyard.runtimes.base import RuntimeSpec, TensorSpec
from modelyard.runtimes.generation import GenerationStats


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """What a started instance reports: its tensors and what the load cost."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    supports_batching: bool
    footprint_bytes: int
    """Measured resident memory the model holds (RSS/USS delta or worker RSS)."""
    process_start_s: float = 0.0
    load_s: float = 0.0
    warmup_s: float = 0.0
    pid: int | None = None
    details: dict[str, object] = field(default_factory=dict)
    footprint_pending: bool = False
    """True when ``footprint_bytes`` is not measured yet (``StartRequest.defer_footprint``):
    :meth:`DeferredFootprint.measure_footprint` gives it once the model serves."""


@dataclass(frozen=True, slots=True)
class StartRequest:
    """Everything needed to bring up one instance."""

    spec: RuntimeSpec
    warmup_inputs: dict[str, np.ndarray] | None = None
    """Explicit warm-up samples; None generates them from metadata."""
    memory_limit_bytes: int | None = None
    """Kernel-enforced limit for a process instance (ignored inline)."""
    defer_footprint: bool = False
    """Leave the footprint measurement out of the start when the instance can: the model
    serves on its admission reservation at once and the manager asks for the measured
    footprint right after (see :class:`DeferredFootprint`). Instances that cannot defer
    measure in ``start`` as before."""
    awaited: bool = False
    """A request waits for this start: a generative model skips its warm-up decode, as
    the request's prompt, decoded next, does the same work (allocates the compute
    buffers before the footprint, which waits for that first answer, is measured)."""


@runtime_checkable
class DeferredFootprint(Protocol):
    """An instance that can measure its footprint after ``start`` (a worker process)."""

    async def measure_footprint(self, *, after_first_answer: bool = False) -> InstanceInfo:
        """The started instance's info with ``footprint_bytes`` measured now (and the
        memory sample in ``details``), or once the first request sent right after the
        start has had its first answer (``after_first_answer``); ServerError once the
        instance is gone."""
        ...


ExitCallback = Callable[[str], None]
"""Called once, with a reason, when an instance dies on its own (crash, OOM kill)."""

ReleaseCallback = Callable[[int, bool], Awaitable[None]]
"""Awaited during a stop, before the exit, when the worker has closed its runtime:
``(private bytes given back, weight file unmapped)`` (``workers/release.py``)."""


@runtime_checkable
class ReleasesEarly(Protocol):
    """An instance whose stop may give memory back before its process has exited."""

    def set_release_callback(self, callback: ReleaseCallback) -> None:
        """Register what the next :meth:`ModelInstance.stop` calls once the worker has
        closed its runtime and said what that freed (its exit then frees the rest)."""
        ...


class ModelInstance(Protocol):
    """One running replica of one model version."""

    @property
    def is_alive(self) -> bool:
        """True while the instance can take requests."""
        ...

    async def start(self, request: StartRequest) -> InstanceInfo:
        """Load and warm up the model; raise ModelLoadError (or a ServerError) on failure."""
        ...

    async def infer(self, inputs: dict[str, np.ndarray], timeout_s: float) -> dict[str, np.ndarray]:
        """Run one batch; WorkerCrashedError if the instance dies meanwhile,
        DeadlineExceededError if it overruns ``timeout_s`` (a process is then killed)."""
        ...

    async def stop(self) -> None:
        """Release the model; for a process instance the process exits."""
        ...

    def set_exit_callback(self, callback: ExitCallback) -> None:
        """Register the callback fired when the instance dies unexpectedly."""
        ...


GenerationCounters = GenerationStats
"""A generative worker's own counters, read from the worker itself (``generated_tokens``
counts cancelled streams too: the figure that shows a cancelled stream really stopped)."""


@runtime_checkable
class GenerativeInstance(Protocol):
    """An instance of a generative model (``llama_cpp``, ``transformers``)."""

    def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        """Stream the chunks of one generation; closing the iterator early cancels it in
        the worker. WorkerCrashedError from the iterator if the worker dies meanwhile."""
        ...

    async def generation_counters(self, timeout_s: float = 5.0) -> GenerationCounters:
        """The worker's counters now (asked over its channel)."""
        ...
