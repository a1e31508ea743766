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
    NotSupportedError,
    ServerError,
)
from modelyard.manager.budget import MemoryBudget
from modelyard.manager.events import EventLog
from modelyard.manager.eviction import EvictionPolicy, make_policy, select_victims
from modelyard.manager.prefetch import MarkovPredictor
from modelyard.manager.records import (
    DEFAULT_ALIAS,
    SINGLE_FILE_VERSION,
    AliasRoute,
    ModelEntry,
    ModelKey,
    ModelRecord,
)
from modelyard.manager.remote_load import (
    check_config,
    check_fields,
    folder_in_repository,
    shown_path,
)
from modelyard.manager.states import RESIDENT, ModelState, can_transition
from modelyard.protocol.names import check_model_name
from modelyard.repository.layout import (
    dir_size_bytes,
    guess_runtime,
    missing_versions_reason,
    served_versions,
)
from modelyard.repository.manifest import load_public_key, verify_manifest
from modelyard.runtimes.base import RuntimeSpec
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
            entry = self.add_model(cfg)
            if not entry.versions:
                # Kept (listed as FAILED with the reason), never dropped without a word.
                log.error("%s: %s", self._field(entry, "path"), self.missing_reason(entry))

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
            try:
                self.record_for(config.name, default)
            except ModelNotFoundError as exc:
                # Reported, and unversioned requests get 404 naming it: never another version.
                log.error("%s: %s", self._field(entry, "default_version"), exc)
            entry.aliases[DEFAULT_ALIAS] = AliasRoute(((default, 1.0),))
        return entry

    def discover(self, name: str, config: Mapping[str, Any] | None = None) -> ModelEntry:
        """Register a model folder of the repository that the YAML does not list.

        ``config`` holds model fields as in the YAML (``name`` and ``path`` default to the
        folder name; ``runtime`` is guessed from the files). This is how a model is added
        without a restart: ``POST /v2/repository/models/{m}/load`` with an optional
        ``{"parameters": {"config": …}}``, as Triton's explicit mode does. A known model
        with a ``config`` has its configuration replaced, once it is not loaded.

        Both arrive over the API, so both pass the ``remote_load:`` gate (see
        :mod:`modelyard.manager.remote_load`): folders stay inside the repository and
        only allowed fields are set. A refused or failed discovery registers nothing.
        """
        check_model_name(name)
        policy = self._settings.remote_load
        existing = self.entries.get(name)
        if existing is not None and not config:
            return existing
        if not policy.enabled:
            raise InvalidInputError(
                f"model {name!r}: loading undeclared models or configs over the API is "
                "disabled (remote_load.enabled)"
            )
        declared = any(m.name == name for m in self._settings.models)
        if declared and not policy.allow_reconfigure_declared:
            raise InvalidInputError(
                f"model {name!r} is declared in the server's configuration; a load request "
                "cannot reconfigure it (remote_load.allow_reconfigure_declared)"
            )
        if existing is not None and any(r.state in RESIDENT for r in existing.versions.values()):
            raise ModelStateConflictError(
                f"model {name!r} is loaded; unload it before loading it with a new config"
            )
        root = self._settings.repository_root
        own_folder = folder_in_repository(root, name, f"model {name!r}")
        raw = dict(config or {})
        check_fields(name, raw, policy)
        fields: dict[str, Any] = {"name": name, "path": name, **raw}
        if not isinstance(fields["path"], str):
            raise InvalidInputError(f"config for model {name!r}: 'path' must be a string")
        folder = folder_in_repository(root, fields["path"], f"model {name!r}: path")
        # The ModelConfig keeps the resolved folder, so a symlink swapped later cannot
        # lead the load out of the repository.
        fields["path"] = str(folder)
        if "runtime" not in fields:
            fields["runtime"] = guess_runtime(folder)
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
        check_config(model_config, folder, own_folder, policy)
        if not folder.is_dir():
            raise ModelNotFoundError(f"model {name!r} is not in the repository")
        versions = served_versions(folder, model_config.version_policy)
        if not versions:
            raise ModelNotFoundError(
                f"model {name!r} has no version folders (<model>/<version>/…) in "
                f"{shown_path(root, folder)}"
            )
        for v in versions:  # a version folder may be a symlink too
            folder_in_repository(root, str(folder.relative_to(root) / str(v)), f"model {name!r}")
        if model_config.device not in {d.name for d in self._settings.devices}:
            raise InvalidInputError(
                f"config for model {name!r} names device {model_config.device!r}, which this "
                "server does not have"
            )
        try:
            entry = self.add_model(model_config)
            if not entry.versions:  # the folder changed under us
                raise ModelNotFoundError(f"model {name!r} has no version folders")
        except BaseException:
            self._restore(name, existing)  # register nothing (a bad default_version, ...)
            raise
        self.events.add("discovered", next(iter(entry.versions.values())).key, "added by load")
        return entry

    def _restore(self, name: str, previous: ModelEntry | None) -> None:
        """Put back the registration a failed remote load replaced (or drop its own)."""
        if previous is None:
            self.entries.pop(name, None)
        else:
            self.entries[name] = previous

    def refresh_versions(self, entry: ModelEntry) -> None:
        """Create records for versions the policy serves that are not known yet.

        A ``path`` naming one file (``digits/model.onnx``) is served as version ``1``:
        its record's folder is the file's, and the runtime loads that file only.
        """
        if entry.path.is_file():
            if SINGLE_FILE_VERSION not in entry.versions:
                entry.versions[SINGLE_FILE_VERSION] = ModelRecord(
                    key=ModelKey(entry.config.name, SINGLE_FILE_VERSION),
                    config=entry.config,
                    path=entry.path.parent,
                    pinned=entry.config.pinned,
                    model_file=entry.path.name,
                )
            return
        for v in served_versions(entry.path, entry.config.version_policy):
            key = ModelKey(entry.config.name, str(v))
            if key.version not in entry.versions:
                entry.versions[key.version] = ModelRecord(
                    key=key,
                    config=entry.config,
                    path=entry.path / key.version,
                    pinned=entry.config.pinned,
                )

    def missing_reason(self, entry: ModelEntry) -> str:
        """Why ``entry`` has no version to serve (folder missing, empty, none the policy takes)."""
        return missing_versions_reason(entry.path, entry.config.version_policy)

    def _field(self, entry: ModelEntry, name: str = "") -> str:
        """``<yaml file>: models[i].<name>`` of a configured model (or the model's name)."""
        for i, cfg in enumerate(self._settings.models):
            if cfg.name == entry.config.name:
                where = f"models[{i}]" + (f".{name}" if name else "")
                return f"{self._settings.config_file or '<settings>'}: {where}"
        return f"model {entry.config.name!r}"

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
                        f"model {name!r} has no version to serve: {self.missing_reason(entry)}"
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

    async def start(self) -> list[str]:
        """Preload the models whose config asks for it, concurrently.

        Returns one line per model with ``preload: true`` that cannot serve (no version,
        or a failed load), naming the file, field and reason; the caller decides whether
        that stops the start (``exit_on_error``). Those models stay listed as FAILED.
        """
        problems = [
            f"{self._field(e, 'path')}: {self.missing_reason(e)}"
            for e in self.entries.values()
            if e.config.preload and not e.versions
        ]
        preloads = []
        for e in self.entries.values():
            if e.config.preload and e.versions:
                try:
                    preloads.append(self.resolve(e.config.name, None))
                except ServerError as exc:
                    problems.append(f"{self._field(e, 'default_version')}: {exc}")
        results = await asyncio.gather(
            *(self.ensure_ready(r, deadline=None, cold_start=False) for r in preloads),
            return_exceptions=True,
        )
        for record, result in zip(preloads, results, strict=True):
            if isinstance(result, BaseException):
                log.error("preload of %s failed: %s", record.key, result)
                entry = self.entries[record.key.name]
                problems.append(f"{self._field(entry)}: preload of {record.key}: {result}")
        return problems

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

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as a task the manager owns: :meth:`close` cancels it."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        # Read the outcome so that nothing is reported as "never retrieved": a load's
        # waiters may all have given up, and its failure is in the record already.
        if not task.cancelled() and task.exception() is not None:
            log.debug("background task %s ended with %r", task.get_name(), task.exception())

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
        ``deadline`` (monotonic seconds, None: until the load ends), and a caller giving
        up neither cancels nor fails the load, which only the model's own
        ``load_timeout_s`` bounds. A failed model is retried by requests only once its
        backoff has passed (or its files changed); ``cold_start=False`` (an explicit load)
        retries at once.
        """
        if record.is_ready:
            return record
        if self._closing:
            raise ModelNotReadyError("server is shutting down")
        entry = self.entries.get(record.key.name)
        if entry is None or entry.versions.get(record.key.version) is not record:
            raise ModelNotFoundError(f"model {record.key} was removed from the repository")
        if record.state is ModelState.FAILED:
            if not cold_start:
                record.backoff.reset()
            wait_s = record.backoff.wait_s(time.monotonic(), record.path)
            if wait_s > 0:
                # Don't retry a broken model on every request: say why, and when to retry.
                raise ModelLoadError(_load_failure(record), retry_after_s=wait_s)
        started = time.monotonic()
        counted = False
        try:
            # A model evicted again between its load finishing and this caller waking
            # up (memory pressure) is simply loaded again, within the deadline.
            for _ in range(_ENSURE_ATTEMPTS):
                task = record.load_task
                if task is None or task.done():
                    task = self._spawn(self._load(record))
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
                except asyncio.CancelledError:
                    me = asyncio.current_task()
                    if me is not None and me.cancelling():
                        raise  # this caller was cancelled, not the load
                    raise ModelNotReadyError(
                        f"the load of {record.key} was stopped: {record.reason or 'cancelled'}"
                    ) from None
                if record.state is ModelState.FAILED:
                    raise ModelLoadError(
                        _load_failure(record),
                        retry_after_s=record.backoff.wait_s(time.monotonic(), record.path) or None,
                    )
                if record.is_ready:
                    return record
                if self._closing:
                    break
        finally:
            if cold_start:
                record.stats.cold_start_s_total += time.monotonic() - started
        raise ModelNotReadyError(f"model {record.key} is not ready: {record.reason}")

    def estimate_bytes(self, record: ModelRecord) -> int:
        """Reservation before a load: max of declared, last measured and size guess."""
        declared = int((record.config.memory_mb or 0) * _MIB)
        measured = record.measured_bytes or 0
        guess = int(dir_size_bytes(record.path) * _SIZE_GUESS_FACTOR) + _SIZE_GUESS_BASE_BYTES
        return max(declared, measured, guess)

    def _fail(self, record: ModelRecord, reason: str, event: str) -> None:
        """Mark a genuine load failure: FAILED with its reason, retried after a backoff."""
        self._set_state(record, ModelState.FAILED, reason)
        delay = record.backoff.failed(time.monotonic(), record.path)
        self.events.add(event, record.key, reason)
        log.error("%s of %s: %s; requests may retry it in %.0f s", event, record.key, reason, delay)

    async def _load(self, record: ModelRecord, *, prefetch: bool = False) -> None:
        """Load ``record`` (the one shared load task), bounded by its ``load_timeout_s``.

        No request's deadline reaches in here: callers wait on this task each within
        their own deadline, so an impatient caller cannot fail the load for the others.
        """
        async with record.lock:
            if record.is_ready:
                return
            # Wait out an eviction in progress before loading again.
            while record.state in (ModelState.DRAINING, ModelState.UNLOADING):
                async with self._budget_changed:
                    await self._budget_changed.wait()
            t0 = time.monotonic()
            load_timeout_s = record.config.load_timeout_s
            deadline = t0 + load_timeout_s
            try:
                verified = await asyncio.to_thread(
                    verify_manifest,
                    record.path,
                    public_keys=self._public_keys,
                    require=self._settings.require_manifest,
                )
            except ServerError as exc:
                self._fail(record, str(exc), "verify_failed")
                return
            if not verified and record.stats.loads == 0:
                log.warning("%s has no manifest; loading it unverified", record.key)
            need = self.estimate_bytes(record)
            try:
                await self._admit(record, need, deadline, may_evict=not prefetch)
            except DeadlineExceededError:
                if prefetch:
                    return
                self._fail(
                    record,
                    f"model {record.key} waited for memory longer than its load timeout "
                    f"({record.config.load_timeout_s * 1000:g} ms)",
                    "load_failed",
                )
                return
            except ServerError as exc:
                if prefetch:
                    return  # a guess that no longer fits is simply dropped
                # A refusal is not the model's fault: the next request asks the budget
                # again (that costs no load), so no backoff.
                self._set_state(record, ModelState.FAILED, str(exc))
                self.events.add("load_refused", record.key, str(exc))
                raise
            # Keep a restart's reason ("worker died …") visible while this load runs, and
            # a retried failure's, so the index never hides why the model is not ready.
            if record.state is ModelState.LOADING:
                reason = record.reason
            elif record.state is ModelState.FAILED:
                reason = f"retrying after: {record.reason}"
            else:
                reason = ""
            self._set_state(record, ModelState.LOADING, reason)
            record.timings.queue_wait_s = time.monotonic() - t0
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await self._start_instance(record)
            except BaseException as exc:
                # Stop what was started before giving the memory back (invariant 1).
                await self._drop_instance(record)
                self._release(record)
                if isinstance(exc, asyncio.CancelledError):
                    # Removed, or the server is closing: not the model's fault.
                    self._set_state(record, ModelState.FAILED, "load cancelled")
                    raise
                if isinstance(exc, TimeoutError):
                    reason = (
                        f"model {record.key} did not load within its load timeout "
                        f"({record.config.load_timeout_s * 1000:g} ms)"
                    )
                elif isinstance(exc, ServerError):
                    reason = str(exc)
                else:
                    reason = f"{type(exc).__name__}: {exc}"
                self._fail(record, reason, "load_failed")
                if not isinstance(exc, Exception):
                    raise
                return
            record.backoff.reset()
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
            model_file=record.model_file,
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
        except BaseException:
            await instance.stop()  # cancelled (load timeout, removal, close): no orphan
            raise
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
        if need > dev.budget_bytes:
            raise MemoryBudgetError(
                f"model {record.key} needs {need / _MIB:.1f} MiB, more than the whole "
                f"{dev.budget_bytes / _MIB:.1f} MiB budget of {device}"
            )
        while True:
            if self.budget.try_reserve(device, record.key, need):
                record.reserved_bytes = need
                return
            missing = need - self.budget.reserved(device, record.key) - dev.free_bytes
            leaving = sum(
                r.reserved_bytes
                for r in self.records()
                if r.config.device == device
                and r.state in (ModelState.DRAINING, ModelState.UNLOADING)
            )
            if not may_evict:
                raise self._refusal(record, need)
            if leaving < missing:
                victims = select_victims(self.policy, self._candidates(record), missing - leaving)
                if victims is None:
                    # Models still loading become evictable once READY: wait for them
                    # rather than refuse, unless even they could not make room.
                    coming = sum(r.reserved_bytes for r in self._candidates(record, loading=True))
                    ready = sum(r.reserved_bytes for r in self._candidates(record))
                    if leaving + ready + coming < missing:
                        raise self._refusal(record, need)
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

    def _release(self, record: ModelRecord) -> None:
        self.budget.release(record.config.device, record.key)
        record.reserved_bytes = 0

    async def _drop_instance(self, record: ModelRecord) -> None:
        """Stop the instance (and close the scheduler) of a load that did not finish."""
        instance, record.instance = record.instance, None
        if record.scheduler is not None and self._on_unloaded is not None:
            self._on_unloaded(record)
        if instance is not None:
            await instance.stop()

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
                self._restore(name, previous)
            raise

    def _check_control_mode(self, verb: str) -> None:
        if self._settings.model_control_mode == "none":
            raise NotSupportedError(
                f"{verb} over the API is disabled: the server runs with model_control_mode "
                "'none' (only the declared models, loaded as configured)"
            )

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
        self._fail(record, f"worker died ({reason}); restarts failed", "restart_failed")

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
        target.load_task = self._spawn(self._load(target, prefetch=True))

    def model_path(self, name: str) -> Path:
        """Folder of a configured model."""
        return self.entry(name).path
