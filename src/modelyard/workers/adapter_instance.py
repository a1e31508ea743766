"""AdapterInstance: a LoRA adapter served inside its base model's worker process.

An adapter (``base:`` in the YAML) gets no worker of its own: its instance is a handle
into the base's :class:`~modelyard.workers.process.ProcessInstance`. Starting it asks
that worker to read the adapter over the model it already has loaded and to create a
context for it (:class:`~modelyard.workers.messages.AttachAdapter`); its generations run
there, in that context; stopping it frees the adapter and its context, the base and its
worker serving on. If the base's worker dies, the adapter's instance dies with it (its
exit callback fires), and the manager restarts it over the restarted base.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator

import numpy as np

from modelyard.errors import InvalidInputError, ModelNotReadyError, ModelStateConflictError
from modelyard.protocol.generate import GenerateChunk, GenerateRequest
from modelyard.workers.instance import ExitCallback, GenerationCounters, InstanceInfo, StartRequest
from modelyard.workers.process import ProcessInstance

_DETACH_TIMEOUT_S = 30.0


class AdapterInstance:
    """A LoRA adapter's context in its base's worker (see the module docstring)."""

    def __init__(
        self, base: ProcessInstance, base_name: str, *, load_timeout_s: float = 300.0
    ) -> None:
        self._base = base
        self._base_name = base_name
        self._load_timeout_s = load_timeout_s
        self._name = ""
        self._attached = False
        self._started = False
        self._callback: ExitCallback | None = None

    @property
    def is_alive(self) -> bool:
        """True while attached to a live base worker."""
        return self._attached and self._base.is_alive

    @property
    def pid(self) -> int | None:
        """The process it runs in: its base's worker."""
        return self._base.pid

    @property
    def base(self) -> ProcessInstance:
        """The base model's instance whose worker serves this adapter."""
        return self._base

    async def start(self, request: StartRequest) -> InstanceInfo:
        """Attach the adapter to the base's worker (ModelLoadError if it refuses it:
        the base serves on)."""
        if self._started:
            raise ModelStateConflictError("this instance has already been started")
        self._started = True
        self._name = request.spec.model_name
        t0 = time.perf_counter()
        attached = await self._base.attach_adapter(
            request.spec, warm_up=not request.awaited, timeout_s=self._load_timeout_s
        )
        self._attached = True
        self._base.add_exit_listener(self._on_base_exit)
        pid = self._base.pid
        return InstanceInfo(
            inputs=[],
            outputs=[],
            supports_batching=False,
            # What the attach added to the worker: the adapter's tensors and the
            # context's KV cache (llama.cpp clears it as it creates it: resident at
            # once). Its compute buffers become resident at its first decode (a few MiB,
            # measured in bench/bench_lora.py), the per-context overhead.
            footprint_bytes=max(attached.private_bytes, attached.kv_cache_bytes),
            process_start_s=0.0,
            load_s=attached.load_s,
            warmup_s=0.0,
            # Not the worker's pid: the process's memory (NVML's per-process figure on a
            # GPU) is the base's to account for; the adapter's is measured at its attach.
            pid=None,
            details={
                "worker_pid": pid,
                "adapter_of": self._base_name,
                "attach_s": time.perf_counter() - t0,
                "adapter_private_bytes": attached.private_bytes,
                "context_length": attached.context_length,
                "parallel": attached.parallel,
                "kv_cache_bytes": attached.kv_cache_bytes,
            },
        )

    async def infer(self, inputs: dict[str, np.ndarray], timeout_s: float) -> dict[str, np.ndarray]:
        """An adapter generates text; it runs no tensor batches."""
        raise InvalidInputError(f"model {self._name!r} generates text; use a generate API")

    def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        """Stream one generation in the adapter's context in the base's worker."""
        if not self.is_alive:
            raise ModelNotReadyError(f"model {self._name!r} is not attached to a serving base")
        return self._base.generate_with(self._name, request)

    async def generation_counters(self, timeout_s: float = 5.0) -> GenerationCounters:
        """The adapter's context's counters (asked over the base worker's channel)."""
        if not self.is_alive:
            raise ModelNotReadyError(f"model {self._name!r} is not attached to a serving base")
        return await self._base.counters_of(self._name, timeout_s)

    async def stop(self) -> None:
        """Free the adapter and its context in the base's worker; the worker stays."""
        if not self._attached:
            return
        self._attached = False
        await self._base.detach_adapter(self._name, _DETACH_TIMEOUT_S)

    def set_exit_callback(self, callback: ExitCallback) -> None:
        """Called once if the base's worker dies while the adapter is attached."""
        self._callback = callback

    def _on_base_exit(self, reason: str) -> None:
        if not self._attached:
            return
        self._attached = False
        if self._callback is not None:
            self._callback(f"its base's worker died ({reason})")
