"""ModelManager: the one object the rest of the server asks about models.

A façade over the manager's parts, each with one job: the registry (which models and
versions exist, which record serves a request, pins), admission (reservations and
eviction under the device budgets), the loader (single-flight loads, restarts, the
state machine), the prefetcher (what to load ahead of need) and the task owner (every
background task, cancelled on close). Unloading, eviction and removal live here, as
they coordinate several parts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import Any

from modelyard.clock import Clock, MonotonicClock
from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import ServerSettings
from modelyard.errors import ModelStateConflictError, NotSupportedError, ServerError
from modelyard.manager.adapters import adapters_using
from modelyard.manager.admission import Admission
from modelyard.manager.anticipation import Anticipation
from modelyard.manager.budget import MemoryBudget, SharedFile
from modelyard.manager.devices import DeviceTable, default_budget_bytes
from modelyard.manager.episodes import hot_weights
from modelyard.manager.events import EventLog
from modelyard.manager.eviction import DemandTracker, EvictionPolicy, demand_scale, make_policy
from modelyard.manager.learning import RequestEvents
from modelyard.manager.loader import InstanceFactory, Loader
from modelyard.manager.placement import Placer
from modelyard.manager.prefetch import MarkovPredictor, Prefetcher
from modelyard.manager.records import ModelEntry, ModelRecord, Replica
from modelyard.manager.registry import ModelRegistry
from modelyard.manager.replicas import ReplicaReady, ReplicaScaler, ReplicaStopped
from modelyard.manager.request_log import RequestLog
from modelyard.manager.states import RESIDENT, ModelState
from modelyard.manager.tasks import TaskOwner
from modelyard.protocol.names import check_model_name
from modelyard.workers.instance import ReleasesEarly

__all__ = ["InstanceFactory", "ModelManager", "default_budget_bytes"]

log = logging.getLogger("modelyard.manager")

_MIB = 1024 * 1024


class ModelManager:
    """Loads, unloads, evicts and restarts models; answers which version serves a request."""

    def __init__(
        self,
        settings: ServerSettings,
        instance_factory: InstanceFactory,
        *,
        policy: EvictionPolicy | None = None,
        events: EventLog | None = None,
        on_ready: Callable[[ModelRecord], Awaitable[None]] | None = None,
        on_unloaded: Callable[[ModelRecord], None] | None = None,
        on_replica_ready: ReplicaReady | None = None,
        on_replica_stopped: ReplicaStopped | None = None,
        clock: Clock | None = None,
        devices: DeviceTable | None = None,
    ) -> None:
        self._settings = settings
        self._unloading: dict[int, asyncio.Event] = {}
        """Records being unloaded (by ``id``) → set once that unload has ended: a second
        unload of the same version waits for the first instead of cutting its drain short."""
        self.clock: Clock = clock or MonotonicClock()
        """Where every lifecycle time (state changes, backoffs, load timings) is read."""
        self.events = events or EventLog()
        self.registry = ModelRegistry(settings, self.events, self.clock)
        self.tasks = TaskOwner()
        self.devices = devices or DeviceTable(settings.devices)
        """Every configured device: budget, kind, and why it cannot be used if so."""
        budget = MemoryBudget(self.devices.budgets())
        self.demand = DemandTracker(settings.demand_half_life_s)
        """Recent demand per model version: the hot-model rule (docs/caching.md)."""
        self.admission = Admission(
            budget,
            policy
            or make_policy(
                settings.eviction_policy,
                half_life_s=settings.demand_half_life_s,
                period_s=settings.eviction_period_s,
            ),
            self.records,
            lambda victim, reason: self._spawn_evict(victim, reason),
            self.clock,
            evict_replica=lambda owner, replica, reason: self._evict_replica(
                owner, replica, reason
            ),
            demand=self.demand,
            hot_fraction=0.1 if settings.protect_hot else 0.0,
        )
        self.demand.scale = demand_scale(self.admission.policy)  # the hot rule's time of day
        self.placer = Placer(self.devices, self.admission, self.events)
        self._loader = Loader(
            settings,
            instance_factory,
            registry=self.registry,
            admission=self.admission,
            placer=self.placer,
            tasks=self.tasks,
            events=self.events,
            clock=self.clock,
            on_ready=on_ready,
            on_unloaded=on_unloaded,
        )
        self._loader.footprints.unload = lambda record, why: self._unload(record, reason=why)
        self._loader.footprints.evict = lambda record, why: self.evict(record, reason=why)
        self.scaler = ReplicaScaler(
            records=self.records,
            loader=self._loader,
            admission=self.admission,
            tasks=self.tasks,
            events=self.events,
            clock=self.clock,
            on_ready=on_replica_ready,
            on_stopped=on_replica_stopped,
        )
        self.anticipation = Anticipation(
            settings,
            registry=self.registry,
            admission=self.admission,
            tasks=self.tasks,
            events=self.events,
            clock=self.clock,
            load=lambda r: self._loader.load(r, prefetch=True),
            evict=self._spawn_evict,
            free_bytes=self._free_bytes_for,
        )
        self.anticipation.prefetcher.pair(self.admission.policy)  # pre-warmed: evict first
        hot_weight = hot_weights(self.admission.policy)  # the hot rule's bursts (episodes)
        self.learning = RequestEvents(
            demand=self.demand,
            policy=self.admission.policy,
            after=self.anticipation.after_requests,
            hot_weight=hot_weight.run if hot_weight is not None else None,
        )
        """Requests recorded on the request path, learnt once per loop turn."""
        self.admission.settle = self.learning.flush
        self.anticipation.settle = self.learning.flush
        for cfg in settings.models:
            entry = self.add_model(cfg)
            if not entry.versions:
                # Kept (listed as FAILED with the reason), never dropped without a word.
                log.error("%s: %s", self.registry.field(entry, "path"), self.missing_reason(entry))

    # ----------------------------------------------------------------- the parts, as before

    @property
    def entries(self) -> dict[str, ModelEntry]:
        """Every registered model by name (the registry's)."""
        return self.registry.entries

    @property
    def budget(self) -> MemoryBudget:
        """The device budgets (admission's)."""
        return self.admission.budget

    @property
    def policy(self) -> EvictionPolicy:
        """The eviction policy (admission's)."""
        return self.admission.policy

    @property
    def prefetcher(self) -> Prefetcher:
        """The prefetch decisions (the anticipation's)."""
        return self.anticipation.prefetcher

    @property
    def request_log(self) -> RequestLog | None:
        """The opt-in request log (None: off)."""
        return self.anticipation.request_log

    @property
    def predictor(self) -> MarkovPredictor:
        """The prefetch predictor."""
        return self.prefetcher.predictor

    def add_model(self, config: ModelConfig) -> ModelEntry:
        """Register a model and discover its versions on disk (see the registry)."""
        return self.registry.add_model(config)

    def discover(self, name: str, config: Mapping[str, Any] | None = None) -> ModelEntry:
        """Register a repository folder the YAML does not list (see the registry)."""
        return self.registry.discover(name, config)

    def refresh_versions(self, entry: ModelEntry) -> None:
        """Create records for versions the policy serves that are not known yet."""
        self.registry.refresh_versions(entry)

    def missing_reason(self, entry: ModelEntry) -> str:
        """Why ``entry`` has no version to serve."""
        return self.registry.missing_reason(entry)

    def records(self) -> Iterable[ModelRecord]:
        """Every known model version."""
        return self.registry.records()

    def entry(self, name: str) -> ModelEntry:
        """The model called ``name``; ModelNotFoundError if unknown."""
        return self.registry.entry(name)

    def resolve(self, name: str, version: str | None) -> ModelRecord:
        """The record serving ``name`` at ``version`` (a version, an alias, or the default)."""
        return self.registry.resolve(name, version)

    def record_for(self, name: str, version: str) -> ModelRecord:
        """The record of a version on disk, created if the policy did not list it."""
        return self.registry.record_for(name, version)

    def on_restart_failed(self, refresh: Callable[[], Awaitable[object]]) -> None:
        """Have ``refresh`` re-read the usable devices whenever a restart fails."""
        self._loader.refresh_devices = refresh

    def estimate_bytes(self, record: ModelRecord) -> int:
        """Private reservation before a load (see admission)."""
        return self.admission.estimate_bytes(record)

    def mapped_files(self, record: ModelRecord) -> list[SharedFile]:
        """The weight files ``record``'s replica will memory-map."""
        return self.admission.mapped_files(record)

    async def ensure_ready(
        self, record: ModelRecord, *, deadline: float | None, cold_start: bool = True
    ) -> ModelRecord:
        """Return ``record`` once READY, starting one load if none is running.

        ``deadline`` is on :attr:`clock`; see :meth:`Loader.ensure_ready`.
        """
        return await self._loader.ensure_ready(record, deadline=deadline, cold_start=cold_start)

    def pin(self, name: str, pinned: bool = True) -> ModelEntry:
        """Pin (never evict) or unpin every version of ``name``, including later ones."""
        return self.registry.set_pinned(name, pinned)

    # ----------------------------------------------------------------- lifecycle

    def preloads(self) -> tuple[list[ModelRecord], list[str]]:
        """The versions to preload, and one line per model with ``preload: true`` that
        cannot serve before any load is tried (no version, or a default version that is
        not there), naming the file, field and reason. No I/O: known at construction."""
        records: list[ModelRecord] = []
        problems: list[str] = []
        for e in self.entries.values():
            if not e.config.preload:
                continue
            if not e.versions:
                problems.append(f"{self.registry.field(e, 'path')}: {self.missing_reason(e)}")
                continue
            try:
                records.append(self.resolve(e.config.name, None))
            except ServerError as exc:
                problems.append(f"{self.registry.field(e, 'default_version')}: {exc}")
        return records, problems

    async def start(self) -> list[str]:
        """Preload the models whose config asks for it, concurrently.

        Returns one line per model with ``preload: true`` that cannot serve (no version,
        or a failed load), naming the file, field and reason; the caller decides whether
        that stops the start (``exit_on_error``). Those models stay listed as FAILED.
        """
        self.scaler.start()
        self.anticipation.start()
        preloads, problems = self.preloads()
        results = await asyncio.gather(
            *(self.ensure_ready(r, deadline=None, cold_start=False) for r in preloads),
            return_exceptions=True,
        )
        for record, result in zip(preloads, results, strict=True):
            if isinstance(result, BaseException):
                log.error("preload of %s failed: %s", record.key, result)
                entry = self.entries[record.key.name]
                problems.append(f"{self.registry.field(entry)}: preload of {record.key}: {result}")
        return problems

    async def close(self) -> None:
        """Unload everything and stop background tasks."""
        # Pending requests are learnt before the tasks close: a prefetch a late flush
        # started would otherwise load (and reserve) after the unloads below.
        self.learning.close()
        await self.tasks.close()
        self.anticipation.close()
        await asyncio.gather(
            *(self._unload(r, reason="server shutting down") for r in self.records()),
            return_exceptions=True,
        )

    async def evict(self, record: ModelRecord, *, reason: str) -> None:
        """Drain ``record``'s requests, then unload it (counts as an eviction)."""
        if record.state is not ModelState.READY:
            return
        record.stats.evictions += 1
        self.learning.flush()  # the policy's bookkeeping of a victim reads what it learnt
        if record.prefetched_at is not None:
            record.prefetched_at = None
            record.stats.prefetch_wasted += 1
        self.admission.policy.on_evict(record)
        self.events.add("evicted", record.key, reason)
        log.info("evicting %s: %s", record.key, reason)
        await self._unload(record, reason=f"evicted: {reason}")

    async def unload(self, name: str, version: str | None = None) -> None:
        """Unload every loaded version of ``name`` (or just ``version``)."""
        self._check_control_mode("unload")
        entry = self.entry(name)
        targets = [entry.versions[version]] if version else list(entry.versions.values())
        for record in targets:
            if record.state in (ModelState.LOADING, ModelState.WARMING):
                raise ModelStateConflictError(
                    f"model {record.key} is {record.state.value}; unload it once the load ends",
                    retry_after_s=1.0,
                )
        await asyncio.gather(*(self._unload(r, reason="unload requested") for r in targets))

    async def _unload(self, record: ModelRecord, *, reason: str) -> None:
        """Drain ``record`` (its admitted requests finish), then stop and forget it.

        One unload per version at a time: an unload, eviction or removal that finds one
        under way waits for it to end. It used to find the version DRAINING, skip the
        drain and close the scheduler under the first one's requests (503 "closed")."""
        running = self._unloading.get(id(record))
        if running is not None:
            await running.wait()
            return
        if record.state not in (ModelState.READY, ModelState.FAILED, ModelState.DRAINING):
            return
        done = self._unloading[id(record)] = asyncio.Event()
        try:
            await self._drain_and_stop(record, reason=reason)
        finally:
            del self._unloading[id(record)]
            done.set()

    async def _drain_and_stop(self, record: ModelRecord, *, reason: str) -> None:
        instance = record.instance
        was_ready = record.state is ModelState.READY
        if was_ready:  # no adapter attaches to it from now on (its load waits)
            self._loader.set_state(record, ModelState.DRAINING, reason)
        # A base's adapters run in its worker: they go first, each releasing its own.
        adapters = adapters_using(record, self.records())
        if adapters:
            why = f"its base {record.key} is unloading ({reason})"
            await asyncio.gather(*(self._unload(a, reason=why) for a in adapters))
        if was_ready:
            if record.replicas:
                await self.scaler.stop_all(record, reason)
            await record.first.drain()
            # Streams of a generative model hold a route lease from routing to their last
            # token: an eviction used to stop the worker under them (503 "this replica
            # was stopped" mid-stream, bench_llm_sizes.py table).
            while record.route_leases > 0:
                await asyncio.sleep(0.005)
        if record.replicas:  # replicas of a model that failed or is already draining
            await self.scaler.stop_all(record, reason)
        if record.state is ModelState.DRAINING:
            self._loader.set_state(record, ModelState.UNLOADING, reason)
        record.instance = None
        try:
            if self._loader.on_unloaded is not None:
                self._loader.on_unloaded(record)
            if instance is not None:
                if isinstance(instance, ReleasesEarly):
                    instance.set_release_callback(partial(self._released, record))
                await instance.stop()
        finally:
            self.admission.release(record)
            was_failed = record.state is ModelState.FAILED
            self._loader.set_state(record, ModelState.UNLOADED, "" if was_failed else reason)
            if instance is not None:
                record.stats.unloads += 1
                self.events.add("unloaded", record.key, reason)
            async with self.admission.changed:
                self.admission.changed.notify_all()

    async def _released(self, record: ModelRecord, freed: int, unmapped: bool) -> None:
        """A stopping worker closed its runtime: what that measurably freed leaves the
        budget now, a load waiting for room may go on; the rest leaves at the exit."""
        device = record.device
        if device not in self.admission.budget.devices or self.devices[device].parsed.is_cuda:
            return  # the bytes measured are the host's, not this device's
        back = self.admission.budget.give_back(device, record.key, freed, unmapped=unmapped)
        log.debug("%s gave back %.1f MiB before its worker's exit", record.key, back / 2**20)
        if back:
            async with self.admission.changed:
                self.admission.changed.notify_all()

    async def remove_version(self, record: ModelRecord, *, reason: str) -> None:
        """Forget a version whose folder is gone, whatever its state.

        Unlike :meth:`unload`, a load in progress is no conflict: it is cancelled (its
        files are gone), its worker stopped and its reservation released; a loaded
        version is drained and unloaded. The record leaves the model first, so no new
        request routes to it; requests waiting for its load get a typed error.
        """
        entry = self.entries.get(record.key.name)
        if entry is not None and entry.versions.get(record.key.version) is record:
            del entry.versions[record.key.version]
        task = record.load_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._unload(record, reason=reason)
        self.learning.flush()  # its requests are learnt before it is forgotten
        self.demand.forget(record.key)
        self.events.add("removed", record.key, reason)

    async def load(
        self, name: str, version: str | None = None, config: Mapping[str, Any] | None = None
    ) -> ModelRecord:
        """Explicit load (repository API); waits for the load to finish.

        A model folder the YAML does not list is registered first (see :meth:`discover`);
        if its load then fails, the registration is taken back, so a failed remote load
        leaves the repository as it was.
        """
        self._check_control_mode("load")
        check_model_name(name)
        previous = self.entries.get(name)
        registers = bool(config) or previous is None
        if registers:
            self.discover(name, config)
        try:
            record = self.resolve(name, version)
            return await self.ensure_ready(record, deadline=None, cold_start=False)
        except ServerError:
            current = self.entries.get(name)
            if registers and (
                current is None or not any(r.state in RESIDENT for r in current.versions.values())
            ):
                self.registry.restore(name, previous)
            raise

    def _check_control_mode(self, verb: str) -> None:
        if self._settings.model_control_mode == "none":
            raise NotSupportedError(
                f"{verb} over the API is disabled: the server runs with model_control_mode "
                "'none' (only the declared models, loaded as configured)"
            )

    def _spawn_evict(self, victim: ModelRecord, reason: str) -> None:
        self.tasks.spawn(self.evict(victim, reason=reason))

    def _evict_replica(self, owner: ModelRecord, replica: Replica, reason: str) -> None:
        owner.stats.evictions += 1
        self.scaler.remove(owner, replica, f"evicted: {reason}")

    def _free_bytes_for(self, record: ModelRecord) -> int:
        """The most free budget on a usable device ``record`` may be placed on."""
        free = [
            self.budget.device(name).free_bytes
            for name in self.devices.allowed(record.config)
            if self.devices[name].is_usable
        ]
        return max(free, default=0)

    def touch(self, record: ModelRecord) -> None:
        """Note a request: LRU recency, the request count and a prefetch hit now; the
        rest (demand, the policy, the request log, the predictors) is learnt at the end
        of the loop's turn (:class:`~modelyard.manager.learning.RequestEvents`)."""
        now = self.clock.monotonic()
        stats = record.stats
        stats.last_used = now
        stats.requests += 1
        if record.prefetched_at is not None:
            Anticipation.count_hit(record, now)
        self.learning.record(record, now)
