"""InlineInstance: the runtime in the server process, for tiny models.

Inference runs in a worker thread (``asyncio.to_thread``) so the event loop never
blocks; ONNX Runtime releases the GIL while it computes.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import psutil

from modelyard.errors import DeadlineExceededError, ModelLoadError
from modelyard.runtimes import Runtime, create_runtime
from modelyard.runtimes.errors import classify_runtime_error
from modelyard.runtimes.warmup import make_warmup_inputs
from modelyard.workers.instance import ExitCallback, InstanceInfo, StartRequest

_ON_LOOP_MAX_S = 0.0005
"""Calls shorter than this (smoothed) run on the event loop instead of a thread."""
_EWMA_ALPHA = 0.1
_ON_LOOP_GIVE_UP_S = 0.005
"""A call on the loop that takes longer than this sends the model back to threads."""
_ON_LOOP_RUNTIMES = frozenset({"onnx", "sklearn"})


class InlineInstance:
    """A model served from inside the server process (``isolation: inline``)."""

    def __init__(self) -> None:
        self._runtime: Runtime | None = None
        self._ewma_s = float("inf")
        """Smoothed duration of one call; starts unknown (thread) until warm-up says."""
        self._on_loop_allowed = False
        """Only graph runtimes (fixed cost per call) may run on the loop; user code never."""

    @property
    def is_alive(self) -> bool:
        """True once loaded and until stopped."""
        return self._runtime is not None

    def set_exit_callback(self, callback: ExitCallback) -> None:
        """Inline instances cannot die on their own; nothing to register."""

    async def start(self, request: StartRequest) -> InstanceInfo:
        """Load and warm up in a thread; footprint is the process's RSS delta."""
        return await asyncio.to_thread(self._start_sync, request)

    def _start_sync(self, request: StartRequest) -> InstanceInfo:
        proc = psutil.Process()
        rss_before = proc.memory_info().rss
        t0 = time.perf_counter()
        runtime = create_runtime(request.spec.kind)
        try:
            runtime.load(request.spec)
            t1 = time.perf_counter()
            runtime.infer(request.warmup_inputs or make_warmup_inputs(runtime.inputs))
        except Exception as exc:
            runtime.close()
            raise ModelLoadError(
                f"model {request.spec.model_name!r} failed to load: {type(exc).__name__}: {exc}"
            ) from exc
        t2 = time.perf_counter()
        self._ewma_s = t2 - t1
        self._on_loop_allowed = request.spec.kind in _ON_LOOP_RUNTIMES
        self._runtime = runtime
        return InstanceInfo(
            inputs=runtime.inputs,
            outputs=runtime.outputs,
            supports_batching=runtime.supports_batching,
            footprint_bytes=max(0, proc.memory_info().rss - rss_before),
            load_s=t1 - t0,
            warmup_s=t2 - t1,
            pid=proc.pid,
        )

    async def infer(self, inputs: dict[str, np.ndarray], timeout_s: float) -> dict[str, np.ndarray]:
        """Run on the event loop when the model is tiny, else in a thread.

        A thread hop costs tens of microseconds; for a model whose calls take less than
        ``_ON_LOOP_MAX_S`` that is most of the request, so such calls run on the loop
        (blocking it that briefly). A thread cannot be killed, so an overrun only fails
        the request.
        """
        runtime = self._runtime
        if runtime is None:
            raise ModelLoadError("model is not loaded")
        if self._on_loop_allowed and self._ewma_s < _ON_LOOP_MAX_S:
            t0 = time.perf_counter()
            try:
                outputs = runtime.infer(inputs)
            except Exception as exc:
                raise classify_runtime_error(exc) from exc
            took = time.perf_counter() - t0
            if took > _ON_LOOP_GIVE_UP_S:
                # Input-dependent cost after all: never block the loop with it again.
                self._on_loop_allowed = False
            self._ewma_s += (took - self._ewma_s) * _EWMA_ALPHA
            return outputs
        try:
            async with asyncio.timeout(timeout_s):
                t0 = time.perf_counter()
                outputs = await asyncio.to_thread(runtime.infer, inputs)
                self._ewma_s += (time.perf_counter() - t0 - self._ewma_s) * _EWMA_ALPHA
                return outputs
        except TimeoutError:
            raise DeadlineExceededError(
                f"inference ran past its deadline ({timeout_s:.3f}s)"
            ) from None
        except Exception as exc:
            raise classify_runtime_error(exc) from exc

    async def stop(self) -> None:
        """Drop the runtime; its memory goes back to this process's allocator."""
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.close()
