"""ProcessInstance: one model replica in its own worker process.

The server process never imports the model's code: the runtime lives in a worker
forked from the warm fork server (see ``factory.py``). Inputs and outputs cross
through the worker's shared region; only small typed messages go over its socket,
read by the event loop's reader callback (no thread hop per request).

Failure handling, in one place:

* the worker dies (signal, OOM kill, exit): the request in flight fails at once with
  WorkerCrashedError saying why, later calls fail the same way, ``is_alive`` turns
  False and the exit callback fires once with the reason;
* the worker overruns ``infer(timeout_s)``: it is SIGKILLed, the call raises
  DeadlineExceededError once the process has gone, and the callback fires with
  "killed after overrunning its deadline";
* the model raises: the worker sends ErrorInfo data and the parent rebuilds the typed
  error (``error_from_code``); the worker keeps serving.

The manager, not this class, restarts a dead replica by creating a new instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Final

import numpy as np
import psutil

from modelyard.errors import (
    DeadlineExceededError,
    InternalError,
    InvalidInputError,
    ModelLoadError,
    ModelStateConflictError,
    ServerError,
    WorkerCrashedError,
)
from modelyard.protocol.generate import GenerateChunk, GenerateRequest
from modelyard.runtimes import GENERATIVE_KINDS
from modelyard.runtimes.base import RuntimeSpec
from modelyard.runtimes.llama_backend import mapped_gguf
from modelyard.runtimes.warmup import make_warmup_inputs
from modelyard.workers.channel import LoopChannel, SharedRegion, socket_pair
from modelyard.workers.exits import rebuild_error
from modelyard.workers.footprint import (
    MemorySample,
    sample_memory,
    sample_with_mapped,
    weight_files,
)
from modelyard.workers.handle import WorkerStartError
from modelyard.workers.instance import (
    ExitCallback,
    GenerationCounters,
    InstanceInfo,
    StartRequest,
)
from modelyard.workers.limits import MemoryLimitError
from modelyard.workers.messages import (
    AdapterAttached,
    AdapterDetached,
    AttachAdapter,
    DetachAdapter,
    Failed,
    Hello,
    Infer,
    InferDone,
    Load,
    Loaded,
)
from modelyard.workers.worker_link import WorkerLink

_log = logging.getLogger(__name__)

_MIB: Final = 1024 * 1024


class ProcessInstance(WorkerLink):
    """A model served from its own worker process (``isolation: process``).

    The worker's channel, handle, limit and the reaction to its events are
    :class:`~modelyard.workers.worker_link.WorkerLink`'s; this class starts the worker
    and the model, serves calls, measures memory and stops the worker.
    """

    _info: InstanceInfo | None = None
    _spec: RuntimeSpec | None = None
    _kv_cache_bytes = 0
    _adapter_bytes: dict[str, int] | None = None
    """The private bytes each attached LoRA adapter added to the worker (at its attach)."""
    _exit_listeners: list[ExitCallback] | None = None

    # ------------------------------------------------------------------ generation

    def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        """Stream one generation from the worker (a generative model); closing the
        iterator early cancels it there; WorkerCrashedError if the worker dies."""
        if not self.is_alive:
            raise self._not_serving()
        return self._streams.generate(request)

    async def generation_counters(self, timeout_s: float = 5.0) -> GenerationCounters:
        """The worker's own generation counters (asked over its channel)."""
        if not self.is_alive:
            raise self._not_serving()
        return await self._streams.counters(timeout_s)

    # -------------------------------------------------------------------- adapters

    async def attach_adapter(
        self, spec: RuntimeSpec, *, warm_up: bool, timeout_s: float
    ) -> AdapterAttached:
        """Serve the LoRA adapter in ``spec``'s folder in this worker, over its loaded
        model, under ``spec.model_name`` (``workers/adapter_contexts.py``).

        ModelLoadError when the worker refuses it (a corrupt adapter, or one made for
        another model): the worker and its model serve on.
        """
        if not self.is_alive:
            raise self._not_serving()
        name = spec.model_name
        reply = await self._streams.ask(
            lambda seq: AttachAdapter(seq, spec, warm_up), timeout_s, f"adapter {name!r} loaded"
        )
        if isinstance(reply, Failed):
            raise ModelLoadError(reply.error.message)
        if not isinstance(reply, AdapterAttached):
            raise InternalError(f"unexpected reply to AttachAdapter: {reply!r}")
        if self._adapter_bytes is None:
            self._adapter_bytes = {}
        self._adapter_bytes[name] = reply.private_bytes
        return reply

    async def detach_adapter(self, name: str, timeout_s: float) -> int:
        """Free adapter ``name`` and its context in the worker; the bytes that freed (0
        when the worker is gone: its exit freed them)."""
        if self._adapter_bytes is not None:
            self._adapter_bytes.pop(name, None)
        if not self.is_alive:
            return 0
        try:
            reply = await self._streams.ask(
                lambda seq: DetachAdapter(seq, name), timeout_s, f"adapter {name!r} freed"
            )
        except ServerError:
            return 0  # the worker went meanwhile
        return reply.freed_bytes if isinstance(reply, AdapterDetached) else 0

    def generate_with(
        self, adapter: str, request: GenerateRequest
    ) -> AsyncGenerator[GenerateChunk, None]:
        """:meth:`generate` in attached adapter ``adapter``'s context."""
        if not self.is_alive:
            raise self._not_serving()
        return self._streams.generate(request, adapter)

    async def counters_of(self, adapter: str, timeout_s: float = 5.0) -> GenerationCounters:
        """The generation counters of attached adapter ``adapter``'s context."""
        if not self.is_alive:
            raise self._not_serving()
        return await self._streams.counters(timeout_s, adapter)

    def add_exit_listener(self, callback: ExitCallback) -> None:
        """Also called, with the reason, if the worker dies after a successful start
        (an attached adapter's instance: it dies with the worker)."""
        if self._exit_listeners is None:
            self._exit_listeners = []
        self._exit_listeners.append(callback)

    def _fire_callback(self, reason: str) -> None:
        fired = self._callback_fired
        super()._fire_callback(reason)
        if fired or not self._exit_listeners:
            return
        listeners, self._exit_listeners = self._exit_listeners, None
        for listener in listeners:
            try:
                listener(reason)
            except Exception:
                _log.exception("exit listener of model %r failed", self._name)

    # ----------------------------------------------------------------------- start

    async def start(self, request: StartRequest) -> InstanceInfo:
        """Start a worker (or claim a spare one), load the model there, warm it up and
        measure it.

        ModelLoadError if the worker cannot start, the load or warm-up fails, the
        worker dies meanwhile, or it takes longer than ``load_timeout_s``.
        """
        try:
            return await self._start(request)
        finally:
            # The next spare is made now that this load no longer needs the CPU.
            self._factory.refill_spares()

    async def _start(self, request: StartRequest) -> InstanceInfo:
        if self._started:
            raise ModelStateConflictError("this instance has already been started")
        self._started = True
        self._name = self._streams.name = request.spec.model_name
        self._limit_bytes = request.memory_limit_bytes
        loop = self._loop = asyncio.get_running_loop()
        deadline = loop.time() + self._load_timeout_s
        t0 = time.perf_counter()
        try:
            await self._launch(loop)
            hello = await self._wait_reply(deadline, self._load_timeout_s)
            process_start_s = time.perf_counter() - t0
            if not isinstance(hello, Hello):
                raise InternalError(f"unexpected first message from the worker: {hello!r}")
            # Moving a process into a cgroup can take milliseconds; do it while the
            # worker loads instead of before (the limit is in place within that time).
            limit = asyncio.ensure_future(self._apply_limit(request.memory_limit_bytes))
            try:
                loaded = await self._load(request, deadline)
            finally:
                await limit
            t1 = time.perf_counter()
            if loaded.context_length:  # generative: its worker's one decode, 0 if skipped
                warmup_s = max(0.0, loaded.warmup_s)
            else:
                if loaded.warmup_s < 0:  # configured warm-up inputs
                    await self._warm_up(request, loaded, deadline)
                warmup_s = loaded.warmup_s if loaded.warmup_s >= 0 else time.perf_counter() - t1
            sample: MemorySample | None = None
            footprint, mapped = 0, 0
            if request.defer_footprint:
                pass  # measured once the model serves (measure_footprint)
            elif loaded.rss_bytes >= 0:  # the worker measured itself (see _load)
                sample = MemorySample(
                    loaded.rss_bytes, loaded.uss_bytes, loaded.pss_bytes, loaded.swap_bytes
                )
                footprint = sample.uss_bytes
            else:
                sample, footprint, mapped = await self._measure(request.spec)
            # llama.cpp allocates the whole KV cache at load, but its pages become
            # resident only as sequences fill it: charge it whole, as at full context.
            footprint += loaded.kv_cache_bytes
        except BaseException as exc:
            await self._abort()
            if isinstance(exc, ModelLoadError | asyncio.CancelledError):
                raise
            if isinstance(exc, DeadlineExceededError):
                raise ModelLoadError(
                    f"model {self._name!r} did not load within {self._load_timeout_s:.1f}s"
                ) from None
            if isinstance(exc, ServerError | MemoryLimitError | WorkerStartError):
                raise ModelLoadError(f"model {self._name!r} failed to start: {exc}") from exc
            if isinstance(exc, Exception):
                raise ModelLoadError(
                    f"model {self._name!r} failed to start: {type(exc).__name__}: {exc}"
                ) from exc
            raise
        self._start_watchdog()
        self.is_alive = True
        assert self._handle is not None
        details: dict[str, object] = {
            **(sample.as_details() if sample is not None else {}),
            "start_method": self._handle.start_method,
            "from_spare": self._from_spare,
            "warmed_runtimes": list(loaded.warmed),
            "memory_limit_backend": self._factory.memory_limit_backend,
            "memory_limit_bytes": request.memory_limit_bytes,
            "mapped_weight_private_bytes": mapped,
        }
        if loaded.context_length:
            details["context_length"] = loaded.context_length
            details["parallel"] = loaded.parallel
            details["kv_cache_bytes"] = loaded.kv_cache_bytes
        self._spec, self._kv_cache_bytes = request.spec, loaded.kv_cache_bytes
        self._info = InstanceInfo(
            inputs=list(loaded.inputs),
            outputs=list(loaded.outputs),
            supports_batching=loaded.supports_batching,
            # Mapped weight files are the page cache's, charged once per file by the
            # budget; the replica's own cost is the rest of its private memory.
            footprint_bytes=footprint,
            process_start_s=process_start_s,
            load_s=loaded.load_s,
            warmup_s=warmup_s,
            pid=self._handle.pid,
            details=details,
            footprint_pending=request.defer_footprint,
        )
        return self._info

    async def _launch(self, loop: asyncio.AbstractEventLoop) -> None:
        spare = self._factory.take_spare()
        if spare is not None:
            # Started ahead: its Hello waits in the channel, its group (if any) exists.
            self._from_spare = True
            self._limit = spare.limit  # released with the worker from now on
            region, ours = spare.region, spare.channel
        else:
            region = SharedRegion.create()  # grown on demand
            ours, theirs = socket_pair()
        self._region = region
        self._channel = LoopChannel(
            ours, self._on_message, self._on_channel_closed, self._on_protocol_error
        )
        self._in_flight = 0  # the worker's Hello
        if spare is not None:
            handle = spare.handle
        else:
            try:
                handle = await self._factory.launch(theirs, region)
            finally:
                theirs.close()
        self._handle = handle
        handle.exited.add_done_callback(self._on_exit)
        self._channel.open(loop)

    async def _apply_limit(self, limit_bytes: int | None) -> None:
        if limit_bytes is None:
            return
        limiter = self._factory.limiter
        if self._limit is not None:
            # A spare's group, placed ahead: one small write sets the model's limit. It
            # runs here, not in a thread (whose hop costs more): an idle spare holds far
            # less than any limit, so the kernel has nothing to reclaim as it lowers it.
            self._limit = limiter.resize(self._limit, limit_bytes)
            return
        assert self._handle is not None
        self._limit = await asyncio.to_thread(limiter.apply, self._handle.pid, limit_bytes)

    async def _load(self, request: StartRequest, deadline: float) -> Loaded:
        seq = next(self._seqs)
        spec = request.spec
        # Generated warm-up inputs: the worker warms up as it loads, and then measures
        # itself unless mapped weight files must be told apart (``_measure``).
        generative = spec.kind in GENERATIVE_KINDS
        warm_up = request.warmup_inputs is None and not generative
        measure = warm_up and not spec.share_weights and not request.defer_footprint
        # A generative model warms up (one decode) unless a request waits for this load:
        # its prompt is decoded first and does what the warm-up would, sooner.
        warm_up = warm_up or (generative and not request.awaited)
        load = Load(seq, spec, request.memory_limit_bytes, warm_up, measure)
        reply = await self._wait_reply(deadline, self._load_timeout_s, load, seq)
        if isinstance(reply, Failed):
            err = ModelLoadError(reply.error.message)
            if reply.error.traceback_text:
                err.add_note(f"worker traceback:\n{reply.error.traceback_text}")
                _log.warning("%s\n%s", reply.error.message, reply.error.traceback_text)
            raise err
        if not isinstance(reply, Loaded):
            raise InternalError(f"unexpected reply to Load: {reply!r}")
        return reply

    async def _warm_up(self, request: StartRequest, loaded: Loaded, deadline: float) -> None:
        inputs = request.warmup_inputs or make_warmup_inputs(loaded.inputs)
        try:
            await self._run(inputs, deadline, self._load_timeout_s)
        except WorkerCrashedError:
            raise
        except ServerError as exc:
            raise ModelLoadError(f"model {self._name!r} failed its warm-up: {exc}") from exc

    async def _abort(self) -> None:
        """Undo a failed start: the worker goes, and everything it held."""
        with contextlib.suppress(Exception):
            await self._kill_and_wait(None)
        self._cleanup()

    # ----------------------------------------------------------------------- infer

    async def infer(self, inputs: dict[str, np.ndarray], timeout_s: float) -> dict[str, np.ndarray]:
        """Run one batch in the worker; calls are served one at a time, in order."""
        loop = self._loop
        if not self.is_alive or loop is None:
            raise self._not_serving()
        if timeout_s <= 0:
            raise DeadlineExceededError(f"model {self._name!r}: no time left to run the request")
        deadline = loop.time() + timeout_s
        turns = self._turns  # one call at a time, no call made when nobody waits (turns.py)
        if turns.busy or turns.waiting:
            try:
                await turns.wait(deadline)
            except TimeoutError:
                raise DeadlineExceededError(
                    f"model {self._name!r}: waited {timeout_s:.3f}s for its busy worker"
                ) from None
        else:
            turns.busy = True
        try:
            if not self.is_alive:
                raise self._not_serving()
            return await self._run(inputs, deadline, timeout_s)
        finally:
            if turns.waiting:
                turns.pass_on()
            else:
                turns.busy = False

    async def _run(
        self, inputs: dict[str, np.ndarray], deadline: float, timeout_s: float
    ) -> dict[str, np.ndarray]:
        region = self._region
        if region is None:
            raise self._not_serving()
        if self._in_flight is not None:
            # A cancelled call's batch is still running; it owns the region until it ends.
            await self._wait_reply(deadline, timeout_s)
        if self._loop is not None and self._loop.time() >= deadline:
            # Never start a batch that is already late: its overrun would kill a healthy worker.
            raise DeadlineExceededError(f"model {self._name!r}: the deadline passed while queued")
        try:
            metas, _ = region.write(inputs)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"cannot send the input to the worker: {exc}") from None
        seq = next(self._seqs)
        reply = await self._wait_reply(deadline, timeout_s, Infer(seq, region.size, metas), seq)
        if self._region is not region:
            raise self._crashed()  # the worker died just after answering; its region is gone
        if isinstance(reply, InferDone):
            region.remap(reply.region_bytes)
            return region.read(reply.tensors, copy=True)
        if isinstance(reply, Failed):
            raise rebuild_error(reply.error)
        raise InternalError(f"unexpected reply from the worker: {reply!r}")

    # ------------------------------------------------------------------------ stop

    async def stop(self) -> None:
        """Ask the worker to exit; SIGKILL after the factory's grace period.

        Returns once the process has gone, its region is unmapped and its cgroup removed;
        the release callback, if set, runs before that if the worker reports what closing
        its runtime freed (``set_release_callback``).
        """
        if self._stopping:
            return
        self._stopping = True
        self.is_alive = False
        handle = self._handle
        if handle is not None and not handle.exited.done():
            try:
                async with asyncio.timeout(self._factory.config.stop_grace_s):
                    await self._stop_and_wait(handle)
            except TimeoutError:
                await self._kill_and_wait("killed after not exiting within its stop grace")
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
        self._cleanup()

    # ---------------------------------------------------------------------- memory

    async def sample_memory(self) -> MemorySample:
        """The worker's RSS, USS and PSS now (read from /proc in a thread)."""
        pid = self.pid
        if pid is None or self._handle is None or self._handle.exited.done():
            raise self._not_serving()
        try:
            return await asyncio.to_thread(sample_memory, pid)
        except psutil.NoSuchProcess:
            raise self._not_serving() from None

    async def measure_footprint(self, *, after_first_answer: bool = False) -> InstanceInfo:
        """The start's info with the footprint measured (a start that deferred it), once
        the model's first request has had its first answer if asked (``answers.py``)."""
        if after_first_answer:
            await self._after_first_answers()
        info, spec = self._info, self._spec
        if info is None or spec is None or not self.is_alive:
            raise self._not_serving()
        sample, footprint, mapped = await self._measure(spec)
        # Adapters attached meanwhile are charged to their own records (their bytes as
        # measured at their attach), not to the model whose worker they share.
        footprint = max(0, footprint - sum((self._adapter_bytes or {}).values()))
        details = {**info.details, **sample.as_details(), "mapped_weight_private_bytes": mapped}
        self._info = dataclasses.replace(
            info,
            footprint_bytes=footprint + self._kv_cache_bytes,
            details=details,
            footprint_pending=False,
        )
        return self._info

    async def _measure(self, spec: RuntimeSpec) -> tuple[MemorySample, int, int]:
        """The worker's memory sample, its USS less the mapped weight files' private
        pages, and those pages.

        Only ``share_weights`` ONNX workers and ``llama_cpp`` workers (their GGUF file)
        map their weights; for the others it is ``(sample, USS, 0)``. For those that do,
        everything comes from one read of ``smaps`` (a worker with llama.cpp loaded has a
        thousand mappings: the kernel takes milliseconds to write each read).
        """
        pid = self.pid
        gguf = spec.kind == "llama_cpp"
        if not ((spec.share_weights and spec.kind == "onnx") or gguf) or pid is None:
            sample = await self.sample_memory()
            return sample, sample.uss_bytes, 0

        def measure() -> tuple[MemorySample, int]:
            folder = Path(spec.version_dir)
            if gguf:
                paths = [str(mapped_gguf(spec).resolve())]
            else:
                paths = [f.path for f in weight_files(folder)]
            return sample_with_mapped(pid, paths)

        try:
            sample, mapped = await asyncio.to_thread(measure)
        except psutil.NoSuchProcess:
            raise self._not_serving() from None
        return sample, max(0, sample.uss_bytes - mapped), mapped

    def _start_watchdog(self) -> None:
        limit = self._limit
        if limit is None or not limit.needs_watchdog:
            return
        interval = self._factory.config.watchdog_interval_s
        self._watchdog = asyncio.get_running_loop().create_task(
            self._watch_memory(limit.limit_bytes, interval), name=f"memory-watchdog-{self.pid}"
        )

    async def _watch_memory(self, limit_bytes: int, interval_s: float) -> None:
        while self._handle is not None and not self._handle.exited.done():
            await asyncio.sleep(interval_s)
            try:
                sample = await self.sample_memory()
            except ServerError:
                return
            if sample.uss_bytes > limit_bytes:
                await self._kill_and_wait(
                    f"killed by OOM watchdog: {sample.uss_bytes // _MIB} MiB private memory "
                    f"(memory limit {limit_bytes // _MIB} MiB)"
                )
                return
