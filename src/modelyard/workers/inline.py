"""InlineInstance: the runtime in the server process, for tiny models.

Inference runs in a worker thread (``asyncio.to_thread``) so the event loop never
blocks; ONNX Runtime releases the GIL while it computes. A graph model whose calls cost
less than ``_ON_LOOP_MAX_S`` runs on the loop instead. Call costs are the calling
thread's **CPU** time, measured around the runtime call alone: the wall time of a thread
hop, or of a call preempted on a busy machine, says nothing about the model, and counting
it kept tiny models on threads for good once the machine was loaded.
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
from modelyard.workers.huge_pages import trim_heap
from modelyard.workers.instance import ExitCallback, InstanceInfo, StartRequest

_ON_LOOP_MAX_S = 0.0005
"""Calls shorter than this (smoothed) run on the event loop instead of a thread."""
_EWMA_ALPHA = 0.1
_ON_LOOP_GIVE_UP_S = 0.005
"""A call that costs more CPU than this sends the model to threads for good."""
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
        self._ewma_s = t2 - t1  # wall time: a first guess, replaced call by call
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
            try:
                return self._timed_infer(runtime, inputs)
            except Exception as exc:
                raise classify_runtime_error(exc) from exc
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.to_thread(self._timed_infer, runtime, inputs)
        except TimeoutError:
            raise DeadlineExceededError(
                f"inference ran past its deadline ({timeout_s:.3f}s)"
            ) from None
        except Exception as exc:
            raise classify_runtime_error(exc) from exc

    def _timed_infer(
        self, runtime: Runtime, inputs: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """``runtime.infer`` on this thread, its CPU time folded into the call estimate."""
        t0 = time.thread_time()
        outputs = runtime.infer(inputs)
        took = time.thread_time() - t0
        if took > _ON_LOOP_GIVE_UP_S:
            # Input-dependent cost after all: never block the loop with it again.
            self._on_loop_allowed = False
        self._ewma_s += (took - self._ewma_s) * _EWMA_ALPHA
        return outputs

    async def stop(self) -> None:
        """Drop the runtime; its memory goes back to this process's allocator, and the
        allocator's free memory to the system (the server lives on after an unload)."""
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.close()
            del runtime
            trim_heap()
