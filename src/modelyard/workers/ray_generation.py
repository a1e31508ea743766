"""GenerativeActor: a generative model (``llama_cpp``, ``transformers``) as a Ray actor.

The actor side of Ray mode's token streams; ``ray_instance.py`` wraps this class with
``ray.remote`` as a threaded actor (several calls at once), so this module needs no Ray
import and runs as plain Python in tests. It does what a generative worker process does
(``workers/main.py``): the runtime's own generation thread decodes every running job
together and reports chunks to a sink; here the sink puts each job's chunks on that
job's queue, and :meth:`GenerativeActor.generate`, a generator that Ray streams to the
server as it yields, takes them off. A job the server stops early is cancelled in the
runtime and its generator ended, so no actor thread waits for chunks that never come.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
import traceback
from collections.abc import Iterator

import psutil

from modelyard.errors import ErrorCode, ModelLoadError, ServerError
from modelyard.protocol.generate import TokenLogprob
from modelyard.runtimes import create_generative_runtime
from modelyard.runtimes.base import RuntimeSpec
from modelyard.runtimes.errors import classify_runtime_error
from modelyard.runtimes.generation import GenerationJob, GenerationStats, GenerativeRuntime
from modelyard.workers.cluster_nodes import local_device
from modelyard.workers.messages import Chunk, ErrorInfo
from modelyard.workers.ray_files import NodeFiles, version_files

__all__ = ["GenerativeActor", "GenerativeLoaded"]

_Item = Chunk | ErrorInfo | None
"""A job's queue holds its chunks, then a chunk with a finish reason, an error, or
``None`` (the server cancelled it: nothing more comes)."""


@dataclasses.dataclass(frozen=True, slots=True)
class GenerativeLoaded:
    """What a loaded generative actor reports back."""

    load_s: float
    warmup_s: float
    footprint_bytes: int
    """The actor process's USS after the load (and warm-up, when it ran)."""
    stats: GenerationStats
    pid: int
    verified: bool
    store_fetch: str = ""
    """``fetched`` or ``cached`` from ``ray.model_store``; empty: the server's path."""


class _QueueSink:
    """The runtime's :class:`~modelyard.runtimes.generation.GenerationSink`: one queue per
    job, written from the generation thread, read by that job's ``generate`` call."""

    def __init__(self) -> None:
        self._queues: dict[int, queue.SimpleQueue[_Item]] = {}
        self._lock = threading.Lock()

    def open(self, seq: int) -> queue.SimpleQueue[_Item]:
        with self._lock:
            q = self._queues[seq] = queue.SimpleQueue()
        return q

    def close(self, seq: int) -> None:
        with self._lock:
            self._queues.pop(seq, None)

    def _put(self, seq: int, item: _Item) -> None:
        with self._lock:
            q = self._queues.get(seq)
        if q is not None:
            q.put(item)

    def chunk(
        self,
        seq: int,
        text: str,
        token_ids: list[int],
        finish_reason: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        logprobs: tuple[TokenLogprob, ...] = (),
    ) -> None:
        chunk = Chunk(
            seq, text, tuple(token_ids), finish_reason, prompt_tokens, completion_tokens, logprobs
        )
        self._put(seq, chunk)

    def failed(self, seq: int, code: str, message: str) -> None:
        self._put(seq, ErrorInfo(code, message))

    def end(self, seq: int) -> None:
        """Job ``seq`` was cancelled: its generator stops waiting."""
        self._put(seq, None)


class GenerativeActor:
    """One loaded generative model version on one node; many streams at once."""

    def __init__(self) -> None:
        self._runtime: GenerativeRuntime | None = None
        self._sink = _QueueSink()

    def load(
        self,
        spec: RuntimeSpec,
        public_keys: list[str],
        require_manifest: bool,
        warm_up: bool,
        files: NodeFiles | None = None,
    ) -> tuple[GenerativeLoaded | None, ErrorInfo | None]:
        """Verify, load (and warm up, unless a request waits) ``spec`` here, its files
        fetched from the model store first when ``files`` names one."""
        try:
            found = version_files(spec, files, public_keys, require_manifest)
            spec = found.spec
            local = local_device(spec.device)
            spec = dataclasses.replace(spec, device="cuda:0" if local.startswith("cuda") else local)
            t0 = time.perf_counter()
            runtime = create_generative_runtime(spec.kind)
            runtime.load(spec)
            t1 = time.perf_counter()
            if warm_up:
                runtime.warm_up()
        except ServerError as exc:
            return None, ErrorInfo(exc.code.value, exc.message)
        except Exception as exc:
            message = f"model {spec.model_name!r} failed to load: {type(exc).__name__}: {exc}"
            return None, ErrorInfo(ModelLoadError.code.value, message, traceback.format_exc())
        runtime.start(self._sink)
        self._runtime = runtime
        loaded = GenerativeLoaded(
            load_s=t1 - t0,
            warmup_s=time.perf_counter() - t1 if warm_up else 0.0,
            footprint_bytes=psutil.Process().memory_full_info().uss,
            stats=runtime.stats(),
            pid=os.getpid(),
            verified=found.verified,
            store_fetch=found.store_fetch,
        )
        return loaded, None

    def generate(self, job: GenerationJob) -> Iterator[Chunk | ErrorInfo]:
        """Run ``job``, yielding its chunks as the runtime produces them; the last is a
        chunk with a finish reason or an error."""
        runtime = self._runtime
        if runtime is None:
            yield ErrorInfo(ErrorCode.MODEL_NOT_READY.value, "the model is not loaded")
            return
        q = self._sink.open(job.seq)
        try:
            try:
                runtime.submit(job)
            except Exception as exc:  # as a worker process reports it: as data
                err = exc if isinstance(exc, ServerError) else classify_runtime_error(exc)
                yield ErrorInfo(err.code.value, err.message)
                return
            while True:
                item = q.get()
                if item is None:
                    return
                yield item
                if isinstance(item, ErrorInfo) or item.finish_reason is not None:
                    return
        finally:
            self._sink.close(job.seq)

    def cancel(self, seq: int) -> None:
        """Stop job ``seq`` in the runtime and end its generator."""
        if self._runtime is not None:
            self._runtime.cancel(seq)
        self._sink.end(seq)

    def stats(self) -> GenerationStats:
        """The runtime's counters now."""
        if self._runtime is None:
            raise RuntimeError("the model is not loaded")
        return self._runtime.stats()

    def close(self) -> None:
        """Stop the generation thread and free the model (before the actor is killed)."""
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.close()
