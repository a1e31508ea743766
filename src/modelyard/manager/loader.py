"""Loading: one load per model version at a time, bounded by its ``load_timeout_s``.

:meth:`Loader.ensure_ready` is how anything gets a model READY: concurrent callers
share one load task (single flight through ``record.load_task``), each waiting within
its own deadline. A load verifies the manifest, is admitted by the budget, starts
the instance and measures it; a failed load is retried only after its backoff, and a
worker that dies is restarted with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from modelyard.clock import Clock
from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import ServerSettings
from modelyard.errors import (
    DeadlineExceededError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    ServerError,
)
from modelyard.manager.adapters import is_adapter
from modelyard.manager.admission import Admission
from modelyard.manager.events import EventLog
from modelyard.manager.footprints import FootprintCommitter, footprint_note
from modelyard.manager.placement import Placer
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.manager.registry import ModelRegistry
from modelyard.manager.relocate import leave_lost_device, relocate
from modelyard.manager.replica import first_replica_state
from modelyard.manager.start_request import start_request
from modelyard.manager.states import ModelState, can_transition
from modelyard.manager.tasks import TaskOwner
from modelyard.repository.manifest import has_manifest, load_public_key, verify_manifest
from modelyard.workers.adapter_instance import AdapterInstance
from modelyard.workers.instance import InstanceInfo, ModelInstance
from modelyard.workers.process import ProcessInstance

log = logging.getLogger("modelyard.manager")

InstanceFactory = Callable[[ModelConfig], ModelInstance]
"""Makes an unstarted instance for a model (inline or process, by its config)."""

_MIB = 1024 * 1024
_RESTART_BACKOFF_S = (0.05, 0.25, 1.0, 2.0, 5.0)
# How often one caller may see its model loaded and evicted again before giving up.
_ENSURE_ATTEMPTS = 4


def _load_failure(record: ModelRecord) -> str:
    # Reasons from the worker already say "failed to load"; don't say it twice.
    if "failed to load" in record.reason:
        return record.reason
    return f"model {record.key} failed to load: {record.reason}"


class Loader:
    """Loads, warms and restarts model instances; the state machine's one writer."""

    def __init__(
        self,
        settings: ServerSettings,
        factory: InstanceFactory,
        *,
        registry: ModelRegistry,
        admission: Admission,
        placer: Placer,
        tasks: TaskOwner,
        events: EventLog,
        clock: Clock,
        on_ready: Callable[[ModelRecord], Awaitable[None]] | None = None,
        on_unloaded: Callable[[ModelRecord], None] | None = None,
    ) -> None:
        self._settings = settings
        self._factory = factory
        self._registry = registry
        self._admission = admission
        self.placer = placer
        self._tasks = tasks
        self.events = events
        self._clock = clock
        self.on_ready = on_ready
        self.on_unloaded = on_unloaded
        # Re-reads the usable devices (Ray: the node table) after a failed restart, so
        # that the next attempt moves off a node that died rather than try it again.
        self.refresh_devices: Callable[[], Awaitable[object]] | None = None
        self._public_keys = [load_public_key(k) for k in settings.manifest_public_keys]
        self._slots = asyncio.Semaphore(settings.load_slots) if settings.load_slots else None
        self._unverified_said = False
        self._restarts: dict[ModelKey, asyncio.Task[None]] = {}
        """The restart in flight of each version whose worker died."""
        self.footprints = FootprintCommitter(admission, placer.devices, tasks, fail=self.fail)
        """Commits measured footprints to the budget (after READY, for worker processes)."""

    def _say_unverified(self, record: ModelRecord) -> None:
        # Most repositories have no manifests at all: one warning per start says so, and
        # the rest go to debug, rather than one warning per model burying the log.
        if self._unverified_said:
            log.debug("%s has no manifest; loading it unverified", record.key)
            return
        self._unverified_said = True
        log.warning(
            "%s has no manifest; loading it unverified (said once: other models without "
            "one are logged at debug level; `modelyard manifest MODEL_DIR` writes one, "
            "require_manifest: true refuses them)",
            record.key,
        )

    def set_state(self, record: ModelRecord, state: ModelState, reason: str = "") -> None:
        if record.state is not state and not can_transition(record.state, state):
            log.warning("unexpected transition %s: %s → %s", record.key, record.state, state)
        record.state = state
        record.reason = reason
        record.state_since = self._clock.monotonic()
        record.first.state = first_replica_state(state)
        record.first.device = record.device

    async def ensure_ready(
        self, record: ModelRecord, *, deadline: float | None, cold_start: bool = True
    ) -> ModelRecord:
        """Return ``record`` once READY, starting one load if none is running.

        Concurrent callers share the one load task; each waits only until its own
        ``deadline`` (monotonic seconds, None: until the load ends), and a caller giving
        up neither cancels nor fails the load, which only the model's own
        ``load_timeout_s`` bounds. A failed model is retried by requests only once its
        backoff has passed (or its files changed); ``cold_start=False`` (an explicit load)
        retries at once.
        """
        if record.is_ready:
            return record
        self._check_loadable(record, cold_start)
        started = self._clock.monotonic()
        counted = False
        try:
            # A model evicted again between its load finishing and this caller waking
            # up (memory pressure) is simply loaded again, within the deadline.
            for _ in range(_ENSURE_ATTEMPTS):
                # A worker that died is being restarted (maybe on another node, once one
                # sent to a dying node failed): wait for that, within the deadline, rather
                # than race it with a load of our own or fail the request.
                task = self._restarts.get(record.key) or record.load_task
                if task is None or task.done():
                    task = self._tasks.spawn(self.load(record))
                    record.load_task = task
                    if cold_start and not counted:
                        record.stats.cold_starts += 1
                        counted = True
                await self._wait_for_load(record, task, deadline, cold_start)
                if record.state is ModelState.FAILED:
                    wait_s = record.backoff.wait_s(self._clock.monotonic(), record.path)
                    raise ModelLoadError(_load_failure(record), retry_after_s=wait_s or None)
                if record.is_ready:
                    return record
                if self._tasks.closing:
                    break
        finally:
            if cold_start:
                record.stats.cold_start_s_total += self._clock.monotonic() - started
        raise ModelNotReadyError(f"model {record.key} is not ready: {record.reason}")

    def _check_loadable(self, record: ModelRecord, cold_start: bool) -> None:
        """Raise when ``record`` is not to be loaded now: the server is closing, the
        version was removed, or it failed and its backoff has not passed (an explicit
        load, not ``cold_start``, retries at once)."""
        if self._tasks.closing:
            raise ModelNotReadyError("server is shutting down")
        entry = self._registry.entries.get(record.key.name)
        if entry is None or entry.versions.get(record.key.version) is not record:
            raise ModelNotFoundError(f"model {record.key} was removed from the repository")
        if record.state is ModelState.FAILED:
            if not cold_start:
                record.backoff.reset()
            wait_s = record.backoff.wait_s(self._clock.monotonic(), record.path)
            if wait_s > 0:
                # Don't retry a broken model on every request: say why, and when to retry.
                raise ModelLoadError(_load_failure(record), retry_after_s=wait_s)

    async def _wait_for_load(
        self,
        record: ModelRecord,
        task: asyncio.Task[None],
        deadline: float | None,
        cold_start: bool,
    ) -> None:
        """Wait for the shared load ``task`` until ``deadline`` without cancelling it."""
        timeout = None if deadline is None else max(0.0, deadline - self._clock.monotonic())
        record.requests_awaiting_load += int(cold_start)
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            raise DeadlineExceededError(
                f"model {record.key} is still loading; the request's deadline passed"
            ) from None
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise  # this caller was cancelled, not the load
            raise ModelNotReadyError(
                f"the load of {record.key} was stopped: {record.reason or 'cancelled'}"
            ) from None
        finally:
            record.requests_awaiting_load -= int(cold_start)

    def fail(self, record: ModelRecord, reason: str, event: str) -> None:
        """Mark a genuine load failure: FAILED with its reason, retried after a backoff."""
        self.set_state(record, ModelState.FAILED, reason)
        delay = record.backoff.failed(self._clock.monotonic(), record.path)
        self.events.add(event, record.key, reason)
        log.error("%s of %s: %s; requests may retry it in %.0f s", event, record.key, reason, delay)

    async def load(self, record: ModelRecord, *, prefetch: bool = False) -> None:
        """Load ``record`` (the one shared load task), bounded by its ``load_timeout_s``.

        No request's deadline reaches in here: callers wait on this task each within
        their own deadline, so an impatient caller cannot fail the load for the others.
        """
        async with record.lock:
            if record.is_ready:
                return
            # Wait out an eviction in progress before loading again.
            while record.state in (ModelState.DRAINING, ModelState.UNLOADING):
                async with self._admission.changed:
                    await self._admission.changed.wait()
            t0 = self._clock.monotonic()
            deadline = t0 + record.config.load_timeout_s
            if is_adapter(record) and not await self._base_ready(record, deadline):
                return
            if not await self._verify(record):
                return
            need = self._admission.estimate_bytes(record)
            if not is_adapter(record) and not self._place(record, need, prefetch):
                return
            if not await self._admit(record, need, deadline, prefetch):
                return
            self.set_state(record, ModelState.LOADING, _loading_reason(record))
            if await self._start_within(record, t0, deadline):
                self._loaded(record, t0)

    async def _base_ready(self, record: ModelRecord, deadline: float) -> bool:
        """Load a LoRA adapter's base first (the one load of the weights) and place the
        adapter on the base's device; False: the base failed (the adapter FAILED, with
        the base's reason)."""
        assert record.config.base is not None
        try:
            # The base's file too, for the estimate (the context's size from its header).
            record.base_file = self._registry.base_file(record.config.base)
            base = self._registry.resolve(record.config.base, None)
            await self.ensure_ready(base, deadline=deadline, cold_start=False)
        except ServerError as exc:
            self.fail(record, f"its base {record.config.base!r}: {exc}", "load_failed")
            return False
        record.device = base.device
        return True

    async def _adapter_instance(self, record: ModelRecord) -> AdapterInstance:
        """An unstarted instance of adapter ``record`` in its base's worker (the base
        loaded again first if it went meanwhile: a restart after the base's worker died)."""
        assert record.config.base is not None
        base = self._registry.resolve(record.config.base, None)
        deadline = self._clock.monotonic() + record.config.load_timeout_s
        await self.ensure_ready(base, deadline=deadline, cold_start=False)
        instance = base.instance
        if not isinstance(instance, ProcessInstance):
            raise ModelLoadError(
                f"model {record.key}: a LoRA adapter is served in its base's worker process; "
                f"the base {base.key} does not run in one (isolation: process)"
            )
        return AdapterInstance(instance, base.key.name, load_timeout_s=record.config.load_timeout_s)

    async def _verify(self, record: ModelRecord) -> bool:
        """Check ``record``'s manifest if it has one (or one is required); False: it
        failed (the model is FAILED with the reason)."""
        try:
            if self._settings.require_manifest or has_manifest(record.path):
                verified = await asyncio.to_thread(
                    verify_manifest,
                    record.path,
                    public_keys=self._public_keys,
                    require=self._settings.require_manifest,
                )
            else:
                # No manifest to hash: one stat, not a thread hop (1-5 ms on a busy
                # machine, on every switch's path).
                verified = False
        except ServerError as exc:
            self.fail(record, str(exc), "verify_failed")
            return False
        if not verified and record.stats.loads == 0:
            self._say_unverified(record)
        return True

    def _place(self, record: ModelRecord, need: int, prefetch: bool) -> bool:
        """Choose ``record``'s device; False: a prefetch with nowhere to go, or a
        failure (FAILED). A refusal (no room now) is raised to the waiting requests."""
        gone = leave_lost_device(record, self.placer, self._admission)
        try:
            placement = self.placer.place(record, need, may_evict=not prefetch)
        except ModelLoadError as exc:
            if prefetch:
                return False
            # No allowed device can run it (a CUDA device missing and no fallback in
            # its list): a genuine failure, retried after the backoff.
            self.fail(record, str(exc), "load_failed")
            return False
        except ServerError as exc:
            if prefetch:
                return False
            self._refused(record, exc)
            raise
        record.device = placement.device
        if gone:  # a cluster node was lost
            self.events.add("moved", record.key, f"from {gone} to {placement.reason}")
        elif placement.had_choice:  # one allowed device: nothing was decided
            self.events.add("placed", record.key, placement.reason)
            log.info("placing %s: %s", record.key, placement.reason)
        return True

    async def _admit(self, record: ModelRecord, need: int, deadline: float, prefetch: bool) -> bool:
        """Reserve ``record``'s memory on its device by ``deadline``; False: a prefetch
        that no longer fits, or the wait ran out (FAILED). A refusal is raised."""
        try:
            # A GGUF model on a GPU: its layers split between the GPU and the host.
            await self.placer.offload.admit(record, need, deadline, may_evict=not prefetch)
        except DeadlineExceededError:
            if prefetch:
                return False
            self.fail(
                record,
                f"model {record.key} waited for memory longer than its load timeout "
                f"({record.config.load_timeout_s * 1000:g} ms)",
                "load_failed",
            )
            return False
        except ServerError as exc:
            if prefetch:
                return False  # a guess that no longer fits is simply dropped
            # A refusal is not the model's fault: the next request asks the budget
            # again (that costs no load), so no backoff.
            self._refused(record, exc)
            raise
        return True

    def _refused(self, record: ModelRecord, exc: ServerError) -> None:
        self.set_state(record, ModelState.FAILED, str(exc))
        self.events.add("load_refused", record.key, str(exc))

    async def _start_within(self, record: ModelRecord, t0: float, deadline: float) -> bool:
        """Start ``record``'s instance (in a load slot) by ``deadline``; False: it
        failed (FAILED, its reservation released). Cancellation propagates."""
        try:
            async with asyncio.timeout(max(0.0, deadline - self._clock.monotonic())):
                async with self._slots or contextlib.nullcontext():
                    # The wait for a slot is queueing, not the load's own time.
                    record.timings.queue_wait_s = self._clock.monotonic() - t0
                    await self._start_instance(record)
        except BaseException as exc:
            # Stop what was started before giving the memory back (invariant 1).
            await self.drop_instance(record)
            self._admission.release(record)
            if isinstance(exc, asyncio.CancelledError):
                # Removed, or the server is closing: not the model's fault.
                self.set_state(record, ModelState.FAILED, "load cancelled")
                raise
            self.fail(record, _start_failure(record, exc), "load_failed")
            if not isinstance(exc, Exception):
                raise
            return False
        return True

    def _loaded(self, record: ModelRecord, t0: float) -> None:
        record.backoff.reset()
        record.timings.total_s = self._clock.monotonic() - t0
        record.stats.loads += 1
        self.events.add(
            "loaded",
            record.key,
            f"in {record.timings.total_s * 1000:.1f} ms, {footprint_note(record)}",
            duration_s=record.timings.total_s,
        )
        log.info(
            "loaded %s in %.1f ms (queue %.1f, start %.1f, load %.1f, warm-up %.1f ms); "
            "footprint %s",
            record.key,
            record.timings.total_s * 1000,
            record.timings.queue_wait_s * 1000,
            record.timings.process_start_s * 1000,
            record.timings.runtime_load_s * 1000,
            record.timings.warmup_s * 1000,
            footprint_note(record),
        )

    def _is_base(self, record: ModelRecord) -> bool:
        """True when a configured LoRA adapter names ``record``'s model as its base."""
        name = record.key.name
        return any(e.config.base == name for e in self._registry.entries.values())

    async def spawn(
        self, record: ModelRecord, device: str, *, defer_footprint: bool = False
    ) -> tuple[ModelInstance, InstanceInfo, int]:
        """Start and warm up one worker of ``record`` on ``device``.

        Returns the instance, what it reported, and its footprint on the device: the
        worker's USS for CPU devices; for ``cuda:N``, the device memory NVML reports
        for the worker's process (the USS when NVML cannot tell). With
        ``defer_footprint`` an instance that can measures later (``info.footprint_pending``).
        """
        if is_adapter(record):  # a context in its base's worker, not a worker
            instance: ModelInstance = await self._adapter_instance(record)
        else:
            instance = self._factory(record.config)
        request = start_request(
            record, device, self.placer, self._admission, serves_adapters=self._is_base(record)
        )
        if defer_footprint:
            request = dataclasses.replace(request, defer_footprint=True)
        try:
            info = await instance.start(request)
        except ServerError:
            await instance.stop()
            raise
        except Exception as exc:
            await instance.stop()
            raise ModelLoadError(f"model {record.key} failed to load: {exc}") from exc
        except BaseException:
            await instance.stop()  # cancelled (load timeout, removal, close): no orphan
            raise
        if info.footprint_pending:
            return instance, info, 0
        return instance, info, self.footprints.device_bytes(device, info)

    async def _start_instance(self, record: ModelRecord) -> None:
        # Off the load's path where it can be (a CPU worker): the model serves on its
        # reservation and the footprint is committed right after (manager/footprints.py).
        defer = not self.placer.devices[record.device].parsed.is_cuda
        instance, info, footprint = await self.spawn(record, record.device, defer_footprint=defer)
        record.instance = instance
        record.info = info
        record.timings.process_start_s = info.process_start_s
        record.timings.runtime_load_s = info.load_s
        record.timings.warmup_s = info.warmup_s
        self.set_state(record, ModelState.WARMING)
        if not info.footprint_pending:
            try:
                await self.footprints.commit(record, footprint)
            except ServerError:
                await instance.stop()
                record.instance = None
                raise
        instance.set_exit_callback(lambda reason: self.on_instance_exit(record, instance, reason))
        if self.on_ready is not None:
            await self.on_ready(record)
        self.set_state(record, ModelState.READY)
        if info.footprint_pending:
            # A request waiting for this load is sent now: its first answer comes first.
            self.footprints.later(record, instance, record.requests_awaiting_load > 0)
        async with self._admission.changed:
            self._admission.changed.notify_all()

    async def drop_instance(self, record: ModelRecord) -> None:
        """Stop the instance (and close the scheduler) of a load that did not finish."""
        instance, record.instance = record.instance, None
        if record.scheduler is not None and self.on_unloaded is not None:
            self.on_unloaded(record)
        if instance is not None:
            await instance.stop()

    def on_instance_exit(self, record: ModelRecord, instance: ModelInstance, reason: str) -> None:
        if record.instance is not instance or self._tasks.closing:
            return
        if record.state not in (ModelState.READY, ModelState.WARMING):
            return
        record.stats.restarts += 1
        record.instance = None
        self.set_state(record, ModelState.LOADING, f"worker died ({reason}); restarting")
        self.events.add("crashed", record.key, reason)
        log.warning("worker of %s died (%s); restarting", record.key, reason)
        task = self._tasks.spawn(self._restart(record, instance, reason))
        self._restarts[record.key] = task
        task.add_done_callback(lambda t: self._forget_restart(record.key, t))

    def _forget_restart(self, key: ModelKey, task: asyncio.Task[None]) -> None:
        if self._restarts.get(key) is task:
            del self._restarts[key]

    async def _restart(self, record: ModelRecord, dead: ModelInstance, reason: str) -> None:
        await dead.stop()
        for attempt, delay in enumerate(_RESTART_BACKOFF_S):
            await asyncio.sleep(delay)
            if self._tasks.closing or record.state is not ModelState.LOADING:
                return
            try:
                async with record.lock:
                    # A request may have loaded it meanwhile (ensure_ready → _load holds
                    # this lock); starting another worker would orphan that one.
                    if self._tasks.closing or record.state is not ModelState.LOADING:
                        return
                    if not self.placer.devices[record.device].is_usable:  # a node was lost
                        await relocate(record, self.placer, self._admission, self.events)
                    await self._start_instance(record)
                self.events.add("restarted", record.key, f"after {attempt + 1} attempt(s)")
                log.info("restarted %s after %d attempt(s)", record.key, attempt + 1)
                return
            except ServerError as exc:
                log.warning("restart %d of %s failed: %s", attempt + 1, record.key, exc)
                if self.refresh_devices is not None:
                    with contextlib.suppress(Exception):  # else the periodic read tells
                        await self.refresh_devices()
        self._admission.release(record)
        self.fail(record, f"worker died ({reason}); restarts failed", "restart_failed")


def _loading_reason(record: ModelRecord) -> str:
    """The reason a load shows while it runs: a restart's ("worker died …") or a
    retried failure's stays visible, so the index never hides why it is not ready."""
    if record.state is ModelState.LOADING:
        return record.reason
    if record.state is ModelState.FAILED:
        return f"retrying after: {record.reason}"
    return ""


def _start_failure(record: ModelRecord, exc: BaseException) -> str:
    """Why starting ``record``'s instance failed, as its FAILED reason says it."""
    if isinstance(exc, TimeoutError):
        return (
            f"model {record.key} did not load within its load timeout "
            f"({record.config.load_timeout_s * 1000:g} ms)"
        )
    if isinstance(exc, ServerError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
