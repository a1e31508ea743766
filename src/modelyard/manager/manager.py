"""ModelManager: owns every model's lifecycle under the device budgets.

One load per model version at a time (single flight through ``record.load_task``),
loads admitted only as far as their reservations fit, evictions that drain first,
and restarts with backoff when a worker dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import ServerSettings
from modelyard.errors import (
    DeadlineExceededError,
    InvalidInputError,
    MemoryBudgetError,
    ModelLoadError,
    ModelNotFoundError,
    ModelNotReadyError,
    ModelStateConflictError,
    ServerError,
)
from modelyard.manager.budget import MemoryBudget, SharedFile
from modelyard.manager.events import EventLog
from modelyard.manager.eviction import EvictionPolicy, make_policy, select_victims
from modelyard.manager.prefetch import MarkovPredictor
from modelyard.manager.records import (
    DEFAULT_ALIAS,
    AliasRoute,
    ModelEntry,
    ModelKey,
    ModelRecord,
)
from modelyard.manager.states import RESIDENT, ModelState, can_transition
from modelyard.repository.layout import dir_size_bytes, guess_runtime, served_versions
from modelyard.repository.manifest import load_public_key, verify_manifest
from modelyard.runtimes.base import RuntimeSpec
from modelyard.workers.footprint import weight_files
from modelyard.workers.instance import ModelInstance, StartRequest

log = logging.getLogger("modelyard.manager")

InstanceFactory = Callable[[ModelConfig], ModelInstance]
"""Makes an unstarted instance for a model (inline or process, by its config)."""

_MIB = 1024 * 1024
# A loaded ONNX model holds roughly its file size plus the runtime's buffers; the
# guess only has to be in the right range until the measured footprint replaces it.
_SIZE_GUESS_FACTOR = 1.2
_SIZE_GUESS_BASE_BYTES = 4 * _MIB
_RESTART_BACKOFF_S = (0.05, 0.25, 1.0, 2.0, 5.0)
# A model whose load failed is not retried by requests for this long.
_FAILED_RETRY_S = 10.0
# How often one caller may see its model loaded and evicted again before giving up.
_ENSURE_ATTEMPTS = 4


def _load_failure(record: ModelRecord) -> str:
    # Reasons from the worker already say "failed to load"; don't say it twice.
    if "failed to load" in record.reason:
        return record.reason
    return f"model {record.key} failed to load: {record.reason}"


def default_budget_bytes() -> int:
    """Half of the host's physical memory."""
    import psutil

    return int(psutil.virtual_memory().total // 2)


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
    ) -> None:
        self._settings = settings
        self._factory = instance_factory
        self.policy: EvictionPolicy = policy or make_policy(settings.eviction_policy)
        self.events = events or EventLog()
        self._on_ready = on_ready
        self._on_unloaded = on_unloaded
        self.budget = MemoryBudget(
            {
                d.name: int(d.memory_budget_mb * _MIB)
                if d.memory_budget_mb
                else default_budget_bytes()
                for d in settings.devices
            }
        )
        self.entries: dict[str, ModelEntry] = {}
        self._budget_changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._rng = random.Random()
        self.predictor = MarkovPredictor()
        self._public_keys = [load_public_key(k) for k in settings.manifest_public_keys]
        for cfg in settings.models:
            self.add_model(cfg)

    # ----------------------------------------------------------------- discovery

    def add_model(self, config: ModelConfig) -> ModelEntry:
        """Register a model and discover its versions on disk."""
        path = self._settings.model_path(config)
        entry = ModelEntry(config=config, path=path)
        self.entries[config.name] = entry
        self.refresh_versions(entry)
        default = config.default_version
        if default is None and entry.versions:
            default = max(entry.versions, key=int)
        if default is not None:
            # Unversioned requests follow this alias; it moves only by a switch (API or
            # poll), so a new version folder never takes traffic before it is verified.
            self.record_for(config.name, default)
            entry.aliases[DEFAULT_ALIAS] = AliasRoute(((default, 1.0),))
        return entry

    def discover(self, name: str, config: Mapping[str, Any] | None = None) -> ModelEntry:
        """Register a model folder of the repository that the YAML does not list.

        ``config`` holds model fields as in the YAML (``name`` and ``path`` default to the
        folder name; ``runtime`` is guessed from the files). This is how a model is added
        without a restart: ``POST /v2/repository/models/{m}/load`` with an optional
        ``{"parameters": {"config": …}}``, as Triton's explicit mode does. A known model
        with a ``config`` has its configuration replaced, once it is not loaded.
        """
        existing = self.entries.get(name)
        if existing is not None and not config:
            return existing
        if existing is not None and any(r.state in RESIDENT for r in existing.versions.values()):
            raise ModelStateConflictError(
                f"model {name!r} is loaded; unload it before loading it with a new config"
            )
        fields: dict[str, Any] = {"name": name, "path": name, **(config or {})}
        if "runtime" not in fields:
            fields["runtime"] = guess_runtime(self._settings.repository_root / fields["path"])
        try:
            model_config = ModelConfig.model_validate(fields)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}"
                for e in exc.errors()
            )
            raise InvalidInputError(f"invalid config for model {name!r}: {problems}") from None
        if model_config.name != name:
            raise InvalidInputError(f"config names model {model_config.name!r}, not {name!r}")
        if not self._settings.model_path(model_config).is_dir():
            raise ModelNotFoundError(f"model {name!r} is not in the repository")
        entry = self.add_model(model_config)
        if not entry.versions:
            raise ModelNotFoundError(
                f"model {name!r} has no version folders (<model>/<version>/…) in {entry.path}"
            )
        self.events.add("discovered", next(iter(entry.versions.values())).key, "added by load")
        return entry

    def refresh_versions(self, entry: ModelEntry) -> None:
        """Create records for versions the policy serves that are not known yet."""
        for v in served_versions(entry.path, entry.config.version_policy):
            key = ModelKey(entry.config.name, str(v))
            if key.version not in entry.versions:
                entry.versions[key.version] = ModelRecord(
                    key=key,
                    config=entry.config,
                    path=entry.path / key.version,
                    pinned=entry.config.pinned,
                )

    def records(self) -> Iterable[ModelRecord]:
        """Every known model version."""
        for entry in self.entries.values():
            yield from entry.versions.values()

    def entry(self, name: str) -> ModelEntry:
        """The model called ``name``; ModelNotFoundError if unknown."""
        try:
            return self.entries[name]
        except KeyError:
            raise ModelNotFoundError(f"model {name!r} is not in the repository") from None

    def resolve(self, name: str, version: str | None) -> ModelRecord:
        """The record serving ``name`` at ``version`` (a version, an alias, or the default)."""
        entry = self.entry(name)
        if not version:
            route = entry.aliases.get(DEFAULT_ALIAS)
            if route is None:
                if not entry.versions:
                    raise ModelNotFoundError(
                        f"model {name!r} has no version folders in {entry.path}"
                    )
                return entry.versions[max(entry.versions, key=int)]
            version = route.pick(self._rng)
        else:
            route = entry.aliases.get(version)
            if route is not None:
                version = route.pick(self._rng)
        try:
            return entry.versions[version]
        except KeyError:
            known = ", ".join(sorted(entry.versions, key=int)) or "none"
            aliases = ", ".join(sorted(entry.aliases)) or "none"
            raise ModelNotFoundError(
                f"model {name!r} has no version {version!r} "
                f"(served versions: {known}; aliases: {aliases})"
            ) from None

    def record_for(self, name: str, version: str) -> ModelRecord:
        """The record of a version on disk, created if the policy did not list it."""
        entry = self.entry(name)
        record = entry.versions.get(version)
        if record is None:
            path = entry.path / version
            if not version.isdigit() or not path.is_dir():
                raise ModelNotFoundError(f"model {name!r} has no version folder {version!r}")
            record = ModelRecord(
                key=ModelKey(name, version),
                config=entry.config,
                path=path,
                pinned=entry.config.pinned,
            )
            entry.versions[version] = record
        return record

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Preload the models whose config asks for it, concurrently."""
        preloads = [
            self.resolve(e.config.name, None)
            for e in self.entries.values()
            if e.config.preload and e.versions
        ]
        results = await asyncio.gather(
            *(self.ensure_ready(r, deadline=None, cold_start=False) for r in preloads),
            return_exceptions=True,
        )
        for record, result in zip(preloads, results, strict=True):
            if isinstance(result, BaseException):
                log.error("preload of %s failed: %s", record.key, result)

    async def close(self) -> None:
        """Unload everything and stop background tasks."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(
            *(self._unload(r, reason="server shutting down") for r in self.records()),
            return_exceptions=True,
        )

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _set_state(self, record: ModelRecord, state: ModelState, reason: str = "") -> None:
        if record.state is not state and not can_transition(record.state, state):
            log.warning("unexpected transition %s: %s → %s", record.key, record.state, state)
        record.state = state
        record.reason = reason
        record.state_since = time.monotonic()

    async def ensure_ready(
        self, record: ModelRecord, *, deadline: float | None, cold_start: bool = True
    ) -> ModelRecord:
        """Return ``record`` once READY, starting one load if none is running.

        Concurrent callers share the one load task; each waits only until its own
        ``deadline`` (monotonic seconds), and a caller giving up does not cancel it.
        """
        if record.is_ready:
            return record
        if self._closing:
            raise ModelNotReadyError("server is shutting down")
        if (
            record.state is ModelState.FAILED
            and cold_start
            and time.monotonic() - record.state_since < _FAILED_RETRY_S
        ):
            # Don't retry a broken model on every request; an explicit load retries at once.
            raise ModelLoadError(_load_failure(record), retry_after_s=_FAILED_RETRY_S)
        started = time.monotonic()
        counted = False
        try:
            # A model evicted again between its load finishing and this caller waking
            # up (memory pressure) is simply loaded again, within the deadline.
            for _ in range(_ENSURE_ATTEMPTS):
                task = record.load_task
                if task is None or task.done():
                    task = asyncio.ensure_future(self._load(record, deadline))
                    record.load_task = task
                    if cold_start and not counted:
                        record.stats.cold_starts += 1
                        counted = True
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    await asyncio.wait_for(asyncio.shield(task), timeout)
                except TimeoutError:
                    raise DeadlineExceededError(
                        f"model {record.key} is still loading; the request's deadline passed"
                    ) from None
                if record.state is ModelState.FAILED:
                    raise ModelLoadError(_load_failure(record))
                if record.is_ready:
                    return record
                if self._closing:
                    break
        finally:
            if cold_start:
                record.stats.cold_start_s_total += time.monotonic() - started
        raise ModelNotReadyError(f"model {record.key} is not ready: {record.reason}")

    def estimate_bytes(self, record: ModelRecord) -> int:
        """Private reservation before a load: max of declared, last measured and size guess.

        A ``share_weights`` model's mapped weight files are not part of it: ``_admit``
        charges them through the budget's shared-file ledger, once per file however many
        models map it (see :meth:`mapped_files`).
        """
        files = self.mapped_files(record)
        weights = sum(f.size for f in files)
        declared = max(0, int((record.config.memory_mb or 0) * _MIB) - weights)
        measured = record.measured_bytes or 0
        private_files = max(0, dir_size_bytes(record.path) - weights)
        guess = int(private_files * _SIZE_GUESS_FACTOR) + _SIZE_GUESS_BASE_BYTES
        return max(declared, measured, guess)

    def mapped_files(self, record: ModelRecord) -> list[SharedFile]:
        """The weight files ``record``'s replica will memory-map (``share_weights`` ONNX)."""
        cfg = record.config
        if not (cfg.share_weights and cfg.runtime == "onnx"):
            return []
        return weight_files(record.path)

    async def _load(
        self, record: ModelRecord, deadline: float | None, *, prefetch: bool = False
    ) -> None:
        async with record.lock:
            if record.is_ready:
                return
            # Wait out an eviction in progress before loading again.
            while record.state in (ModelState.DRAINING, ModelState.UNLOADING):
                async with self._budget_changed:
                    await self._budget_changed.wait()
            t0 = time.monotonic()
            try:
                verified = await asyncio.to_thread(
                    verify_manifest,
                    record.path,
                    public_keys=self._public_keys,
                    require=self._settings.require_manifest,
                )
            except ServerError as exc:
                self._set_state(record, ModelState.FAILED, str(exc))
                self.events.add("verify_failed", record.key, str(exc))
                log.error("refusing %s: %s", record.key, exc)
                return
            if not verified and record.stats.loads == 0:
                log.warning("%s has no manifest; loading it unverified", record.key)
            need = self.estimate_bytes(record)
            try:
                await self._admit(record, need, deadline, may_evict=not prefetch)
            except ServerError as exc:
                if prefetch:
                    return  # a guess that no longer fits is simply dropped
                self._set_state(record, ModelState.FAILED, str(exc))
                self.events.add("load_refused", record.key, str(exc))
                raise
            # Keep a restart's reason ("worker died …") visible while this load runs.
            restarting = record.state is ModelState.LOADING
            self._set_state(record, ModelState.LOADING, record.reason if restarting else "")
            record.timings.queue_wait_s = time.monotonic() - t0
            try:
                await self._start_instance(record)
            except BaseException as exc:
                self._release(record)
                reason = (
                    str(exc) if isinstance(exc, ServerError) else f"{type(exc).__name__}: {exc}"
                )
                self._set_state(record, ModelState.FAILED, reason)
                self.events.add("load_failed", record.key, reason)
                log.error("load of %s failed: %s", record.key, reason)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return
            record.timings.total_s = time.monotonic() - t0
            record.stats.loads += 1
            self.events.add(
                "loaded",
                record.key,
                f"in {record.timings.total_s * 1000:.1f} ms, "
                f"{(record.measured_bytes or 0) / _MIB:.1f} MiB measured",
                duration_s=record.timings.total_s,
            )
            log.info(
                "loaded %s in %.1f ms (queue %.1f, start %.1f, load %.1f, warm-up %.1f ms); "
                "footprint %.1f MiB",
                record.key,
                record.timings.total_s * 1000,
                record.timings.queue_wait_s * 1000,
                record.timings.process_start_s * 1000,
                record.timings.runtime_load_s * 1000,
                record.timings.warmup_s * 1000,
                (record.measured_bytes or 0) / _MIB,
            )

    async def _start_instance(self, record: ModelRecord) -> None:
        cfg = record.config
        instance = self._factory(cfg)
        spec = RuntimeSpec(
            kind=cfg.runtime,
            version_dir=str(record.path),
            model_name=cfg.name,
            trusted=cfg.trusted,
            python_class=cfg.python_class,
            intra_op_threads=cfg.intra_op_threads,
            share_weights=cfg.share_weights,
            device=cfg.device,
            options=dict(cfg.options),
        )
        warmup = (
            {k: np.asarray(v) for k, v in cfg.warmup_inputs.items()} if cfg.warmup_inputs else None
        )
        limit = None
        if cfg.memory_limit_mb:
            limit = int(cfg.memory_limit_mb * _MIB)
        elif record.measured_bytes:
            # A margin over what the model was measured to need last time.
            limit = int(record.measured_bytes * 2 + 256 * _MIB)
        try:
            info = await instance.start(StartRequest(spec, warmup, limit))
        except ServerError:
            await instance.stop()
            raise
        except Exception as exc:
            await instance.stop()
            raise ModelLoadError(f"model {record.key} failed to load: {exc}") from exc
        record.instance = instance
        record.info = info
        record.timings.process_start_s = info.process_start_s
        record.timings.runtime_load_s = info.load_s
        record.timings.warmup_s = info.warmup_s
        self._set_state(record, ModelState.WARMING)
        record.measured_bytes = info.footprint_bytes
        device = cfg.device
        if not self.budget.resize(device, record.key, max(info.footprint_bytes, 1)):
            # Measured more than reserved and the rest does not fit: make room or give up.
            try:
                await self._admit(record, info.footprint_bytes, None)
            except ServerError:
                await instance.stop()
                record.instance = None
                raise
        record.reserved_bytes = self.budget.reserved(device, record.key)
        instance.set_exit_callback(lambda reason: self._on_instance_exit(record, instance, reason))
        if self._on_ready is not None:
            await self._on_ready(record)
        self._set_state(record, ModelState.READY)
        async with self._budget_changed:
            self._budget_changed.notify_all()

    # ----------------------------------------------------------------- budget

    def _candidates(self, loader: ModelRecord, *, loading: bool = False) -> list[ModelRecord]:
        """Models ``loader`` may evict: READY ones (or, with ``loading``, those on the way)."""
        states = (ModelState.LOADING, ModelState.WARMING) if loading else (ModelState.READY,)
        return [
            r
            for r in self.records()
            if r is not loader
            and r.config.device == loader.config.device
            and r.state in states
            and not r.pinned
            and r.config.priority >= loader.config.priority
        ]

    def _refusal(self, record: ModelRecord, need: int) -> MemoryBudgetError:
        dev = self.budget.device(record.config.device)
        pinned = [str(r.key) for r in self.records() if r.pinned and r.state in RESIDENT]
        higher = [
            str(r.key)
            for r in self.records()
            if r.state in RESIDENT and r.config.priority < record.config.priority
        ]
        return MemoryBudgetError(
            f"cannot load {record.key}: needs {need / _MIB:.1f} MiB on {dev.name}, budget "
            f"{dev.budget_bytes / _MIB:.1f} MiB with {dev.reserved_bytes / _MIB:.1f} MiB reserved; "
            f"pinned: {', '.join(pinned) or 'none'}; "
            f"higher priority: {', '.join(higher) or 'none'}",
            retry_after_s=5.0,
        )

    async def _admit(
        self,
        record: ModelRecord,
        need: int,
        deadline: float | None,
        *,
        may_evict: bool = True,
    ) -> None:
        """Reserve ``need`` bytes for ``record``, evicting allowed victims to make room.

        With ``may_evict`` False (prefetches) it only takes free room, or refuses.
        """
        device = record.config.device
        dev = self.budget.device(device)
        # ``need`` is the private part; mapped weight files are charged once per file.
        files = self.mapped_files(record)
        whole = need + sum(f.size for f in set(files))
        if whole > dev.budget_bytes:
            raise MemoryBudgetError(
                f"model {record.key} needs {whole / _MIB:.1f} MiB, more than the whole "
                f"{dev.budget_bytes / _MIB:.1f} MiB budget of {device}"
            )
        while True:
            if self.budget.try_reserve(device, record.key, need, files):
                record.reserved_bytes = self.budget.reserved(device, record.key)
                return
            current = dev.reservations.get(record.key, 0)
            missing = need - current + dev.uncharged_bytes(files) - dev.free_bytes
            # What models already on their way out will give back, counted by the
            # budget: a file they share with models that stay is not freed by them.
            leaving_keys = [
                r.key
                for r in self.records()
                if r.config.device == device
                and r.state in (ModelState.DRAINING, ModelState.UNLOADING)
            ]
            leaving = self.budget.freed_by(device, leaving_keys, files)
            if not may_evict:
                raise self._refusal(record, need + dev.uncharged_bytes(files))
            if leaving < missing:
                victims = self._victims(record, missing, files, leaving_keys)
                if victims is None:
                    # Models still loading become evictable once READY: wait for them
                    # rather than refuse, unless even they could not make room.
                    others = self._candidates(record) + self._candidates(record, loading=True)
                    keys = leaving_keys + [r.key for r in others]
                    if self.budget.freed_by(device, keys, files) < missing:
                        raise self._refusal(record, need + dev.uncharged_bytes(files))
                else:
                    for victim in victims:
                        self._spawn(self.evict(victim, reason=f"making room for {record.key}"))
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceededError(
                    f"model {record.key} waited for memory past the request's deadline"
                )
            async with self._budget_changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._budget_changed.wait(), remaining)

    def _victims(
        self,
        record: ModelRecord,
        missing: int,
        files: list[SharedFile],
        leaving: list[ModelKey],
    ) -> list[ModelRecord] | None:
        """The shortest prefix of the policy's order that, with ``leaving``, frees ``missing``.

        Counted by the budget, not by each victim's own reservation: a weight file
        several models share is freed only when all of them go, and one ``record``
        will map anyway is not freed at all.
        """
        device = record.config.device
        candidates = self._candidates(record)
        if not files and not self.budget.device(device).shared:
            # No shared files: each victim frees exactly its own reservation.
            return select_victims(
                self.policy, candidates, missing - self.budget.freed_by(device, leaving)
            )
        chosen: list[ModelRecord] = []
        if self.budget.freed_by(device, leaving, files) >= missing:
            return chosen
        for victim in self.policy.order(candidates):
            chosen.append(victim)
            keys = leaving + [r.key for r in chosen]
            if self.budget.freed_by(device, keys, files) >= missing:
                return chosen
        return None

    def _release(self, record: ModelRecord) -> None:
        self.budget.release(record.config.device, record.key)
        record.reserved_bytes = 0

    # ----------------------------------------------------------------- unload / evict

    async def evict(self, record: ModelRecord, *, reason: str) -> None:
        """Drain ``record``'s requests, then unload it (counts as an eviction)."""
        if record.state is not ModelState.READY:
            return
        record.stats.evictions += 1
        self.policy.on_evict(record)
        self.events.add("evicted", record.key, reason)
        log.info("evicting %s: %s", record.key, reason)
        await self._unload(record, reason=f"evicted: {reason}")

    async def unload(self, name: str, version: str | None = None) -> None:
        """Unload every loaded version of ``name`` (or just ``version``)."""
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
        if record.state not in (ModelState.READY, ModelState.FAILED, ModelState.DRAINING):
            return
        instance = record.instance
        if record.state is ModelState.READY:
            self._set_state(record, ModelState.DRAINING, reason)
            if record.scheduler is not None:
                await record.scheduler.drain()
            while record.in_flight > 0:
                await asyncio.sleep(0.005)
        if record.state is ModelState.DRAINING:
            self._set_state(record, ModelState.UNLOADING, reason)
        record.instance = None
        try:
            if self._on_unloaded is not None:
                self._on_unloaded(record)
            if instance is not None:
                await instance.stop()
        finally:
            self._release(record)
            was_failed = record.state is ModelState.FAILED
            self._set_state(record, ModelState.UNLOADED, "" if was_failed else reason)
            if instance is not None:
                record.stats.unloads += 1
                self.events.add("unloaded", record.key, reason)
            async with self._budget_changed:
                self._budget_changed.notify_all()

    async def load(
        self, name: str, version: str | None = None, config: Mapping[str, Any] | None = None
    ) -> ModelRecord:
        """Explicit load (repository API); waits for the load to finish.

        A model folder the YAML does not list is registered first (see :meth:`discover`).
        """
        if config or name not in self.entries:
            self.discover(name, config)
        record = self.resolve(name, version)
        return await self.ensure_ready(record, deadline=None, cold_start=False)

    # ----------------------------------------------------------------- crash recovery

    def _on_instance_exit(self, record: ModelRecord, instance: ModelInstance, reason: str) -> None:
        if record.instance is not instance or self._closing:
            return
        if record.state not in (ModelState.READY, ModelState.WARMING):
            return
        record.stats.restarts += 1
        record.instance = None
        self._set_state(record, ModelState.LOADING, f"worker died ({reason}); restarting")
        self.events.add("crashed", record.key, reason)
        log.warning("worker of %s died (%s); restarting", record.key, reason)
        self._spawn(self._restart(record, instance, reason))

    async def _restart(self, record: ModelRecord, dead: ModelInstance, reason: str) -> None:
        await dead.stop()
        for attempt, delay in enumerate(_RESTART_BACKOFF_S):
            await asyncio.sleep(delay)
            if self._closing or record.state is not ModelState.LOADING:
                return
            try:
                async with record.lock:
                    # A request may have loaded it meanwhile (ensure_ready → _load holds
                    # this lock); starting another worker would orphan that one.
                    if self._closing or record.state is not ModelState.LOADING:
                        return
                    await self._start_instance(record)
                self.events.add("restarted", record.key, f"after {attempt + 1} attempt(s)")
                log.info("restarted %s after %d attempt(s)", record.key, attempt + 1)
                return
            except ServerError as exc:
                log.warning("restart %d of %s failed: %s", attempt + 1, record.key, exc)
        self._release(record)
        self._set_state(record, ModelState.FAILED, f"worker died ({reason}); restarts failed")

    # ----------------------------------------------------------------- views

    def touch(self, record: ModelRecord) -> None:
        """Note a request for LRU, the stats view and the prefetch predictor."""
        record.stats.last_used = time.monotonic()
        record.stats.requests += 1
        cfg = self._settings.prefetch
        if not cfg.enabled:
            return
        self.predictor.observe(record.key.name)
        guess = self.predictor.predict(record.key.name)
        if (
            guess is None
            or guess.probability < cfg.min_probability
            or guess.observations < cfg.min_observations
        ):
            return
        entry = self.entries.get(guess.model)
        if entry is None:
            return
        try:
            target = self.resolve(guess.model, None)
        except ServerError:
            return
        if target.state is not ModelState.UNLOADED or (
            target.load_task is not None and not target.load_task.done()
        ):
            return
        free = self.budget.device(target.config.device).free_bytes
        if self.estimate_bytes(target) > free:
            return  # a prefetch never evicts
        target.stats.prefetches += 1
        self.events.add(
            "prefetch",
            target.key,
            f"after {record.key.name} (p={guess.probability:.2f} over {guess.observations})",
        )
        task = asyncio.ensure_future(self._load(target, None, prefetch=True))
        target.load_task = task

    def model_path(self, name: str) -> Path:
        """Folder of a configured model."""
        return self.entry(name).path
