"""Admission: how many bytes a load reserves, and whom it evicts to get them.

A load reserves its private bytes (and its mapped weight files, once per file) before
its worker starts; if they do not fit, the eviction policy names victims among the
READY, unpinned models of no higher priority, and the load waits on :attr:`changed`
until their memory is back. A load that cannot fit even then is refused with the
reason (pinned and higher-priority models named).

Every decision is per device: a load is admitted on the device placement chose for it
(``record.device``, or the ``device`` an extra replica goes to), and victims are only
what sits on that device. Extra replicas (scale-out) leave before whole models: they
are spare capacity, and the model keeps serving on its other replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Hashable, Iterable, Mapping
from functools import partial

from modelyard.clock import Clock
from modelyard.errors import DeadlineExceededError, MemoryBudgetError
from modelyard.manager.adapters import adapters_first, bases_in_use
from modelyard.manager.budget import MemoryBudget, SharedFile
from modelyard.manager.eviction import (
    DemandTracker,
    EvictionPolicy,
    protect_hot,
    select_victims,
    top_scale,
)
from modelyard.manager.hot_set import awaited, hot_set, just_loaded, wait_to_spare_hottest
from modelyard.manager.llm_memory import gguf_estimate, model_gguf
from modelyard.manager.records import Holder, ModelRecord, Replica, ReplicaState
from modelyard.manager.states import RESIDENT, ModelState
from modelyard.repository.layout import dir_size_bytes
from modelyard.workers.footprint import MappedFile, weight_files

_MIB = 1024 * 1024
# A loaded ONNX model holds roughly its file size plus the runtime's buffers; the
# guess only has to be in the right range until the measured footprint replaces it.
_SIZE_GUESS_FACTOR = 1.2
_SIZE_GUESS_BASE_BYTES = 4 * _MIB
# A load waiting for busy models looks again this often: a request's lease ends
# without notifying anyone.
_BUSY_POLL_S = 0.01
# ... and after this long evicts a busy colder model rather than wait on it: a model
# with steady traffic may never be idle, and the load would run into its timeout.
_MAX_WAIT_S = 2.0


def _learnt() -> None:
    """Nothing to learn first (no request buffer)."""


class Admission:
    """Reservations against the device budgets, with eviction to make room."""

    def __init__(
        self,
        budget: MemoryBudget,
        policy: EvictionPolicy,
        records: Callable[[], Iterable[ModelRecord]],
        evict: Callable[[ModelRecord, str], None],
        clock: Clock,
        evict_replica: Callable[[ModelRecord, Replica, str], None] | None = None,
        demand: DemandTracker | None = None,
        hot_fraction: float = 0.1,
    ) -> None:
        self.budget = budget
        self.policy = policy
        self._records = records
        self._evict = evict
        """Starts evicting a victim in the background (the manager owns the task)."""
        self._clock = clock
        self._evict_replica = evict_replica
        """Starts stopping a spare replica in the background (the manager owns the task)."""
        self.changed = asyncio.Condition()
        """Notified whenever memory is released or a model's state settles."""
        self.demand = demand
        """Recent demand per model (the hot-model rule; None: no such rule)."""
        self.hot_fraction = hot_fraction
        self.settle: Callable[[], None] = _learnt
        """Learns the requests recorded and not learnt yet (the manager's
        ``RequestEvents.flush``): called before the hot set or a victim is chosen, so a
        choice made in the turn of a request sees it (``learning.py``)."""
        self._waiting: set[tuple[str, Holder]] = set()
        """(device, holder) blocked in :meth:`admit` now: a load waits only for loads not
        waiting themselves (two growing after measuring would wait for each other)."""

    def hot(self) -> dict[Hashable, float]:
        """The models in the top decile of recent demand, with their demand (never
        victims while colder models are evictable, or will be once their loads finish)."""
        if self.demand is None or self.hot_fraction <= 0:
            return {}
        self.settle()
        return hot_set(
            self.demand, self.hot_fraction, self._clock.monotonic(), top_scale(self.policy),
            self.records(), self.budget,
        )  # fmt: skip

    def records(self) -> Iterable[ModelRecord]:
        """Every known model version (the registry's)."""
        return self._records()

    def estimate_bytes(self, record: ModelRecord) -> int:
        """Private reservation before a load: max of declared, last measured and size guess.

        A ``share_weights`` model's mapped weight files are not part of it: ``admit``
        charges them through the budget's shared-file ledger, once per file however many
        models map it (see :meth:`mapped_files`).
        """
        files = self.mapped_files(record)
        weights = sum(f.size for f in files)
        declared = max(0, int((record.config.memory_mb or 0) * _MIB) - weights)
        measured = record.measured_bytes or 0
        gguf = gguf_estimate(record)
        if gguf is not None:
            # KV cache and compute buffers from the header; the file is charged apart.
            return max(declared, measured, gguf.private_bytes)
        private_files = max(0, dir_size_bytes(record.path) - weights)
        guess = int(private_files * _SIZE_GUESS_FACTOR) + _SIZE_GUESS_BASE_BYTES
        return max(declared, measured, guess)

    def too_big(
        self, record: ModelRecord, whole: int, budget_bytes: int, where: str
    ) -> MemoryBudgetError:
        """The refusal of a model bigger than a whole budget; a generative model's names
        the arithmetic of its estimate (weights, KV cache, buffers) and what to lower."""
        gguf = gguf_estimate(record)
        why = "" if gguf is None else f" ({gguf.arithmetic()}): lower n_ctx or parallel"
        return MemoryBudgetError(
            f"model {record.key} needs {whole / _MIB:.1f} MiB, more than the whole "
            f"{budget_bytes / _MIB:.1f} MiB {where}{why}"
        )

    def mapped_files(self, record: ModelRecord, device: str | None = None) -> list[SharedFile]:
        """The weight files ``record``'s replica on ``device`` (default: its own) will
        memory-map: ``share_weights`` ONNX external data, or a ``llama_cpp`` model's GGUF
        file (always mapped), none on a GPU (offloaded layers are the worker's copies; the
        host's part is charged apart, see ``manager/offload.py``)."""
        cfg = record.config
        if cfg.base is not None:  # an adapter: the base's worker maps, the base charged
            return []
        if cfg.runtime == "llama_cpp":
            # On a GPU, or repacked: the worker's own copies, charged as private bytes.
            if (device or record.device).startswith("cuda:") or cfg.generation.weights != "mapped":
                return []
            try:
                return [MappedFile.of(model_gguf(record))]
            except OSError:
                return []
        if not (cfg.share_weights and cfg.runtime == "onnx"):
            return []
        return weight_files(record.path)

    def candidates(
        self,
        loader: ModelRecord,
        *,
        loading: bool = False,
        device: str | None = None,
        bases: bool = False,
    ) -> list[ModelRecord]:
        """Models ``loader`` may evict on ``device`` (default: its own): READY ones (or, with
        ``loading``, those on the way, or serving before their footprint is committed);
        not a base that resident adapters use unless ``bases`` (:meth:`victims` takes one
        only after all its adapters)."""
        device = device or loader.device
        # A base serving adapters stays while they do (manager/adapters.py).
        in_use = set() if bases else bases_in_use(self.records())
        return [
            r
            for r in self.records()
            if r is not loader
            and r.key.name not in in_use
            and r.device == device
            and (r.state is ModelState.READY and r.footprint_pending is None) is not loading
            and (r.state in RESIDENT and r.state is not ModelState.DRAINING)
            and not r.pinned
            and r.config.priority >= loader.config.priority
        ]

    def spare_replicas(
        self,
        loader: ModelRecord,
        device: str,
        missing: int,
        files: list[SharedFile],
        leaving: list[Holder],
    ) -> tuple[list[tuple[ModelRecord, Replica]], list[Holder]]:
        """Extra replicas on ``device`` that a load of ``loader`` stops, idlest first, until
        they and ``leaving`` free ``missing`` bytes (or run out); with the holders then gone.

        Any model's spare replica of no higher priority qualifies (a pin keeps the model
        loaded, not its spare capacity); the loader's own replicas do not.
        """
        ready = [
            (r, rep)
            for r in self.records()
            if r is not loader and r.config.priority >= loader.config.priority
            for rep in r.replicas
            if rep.device == device and rep.state is ReplicaState.READY
        ]
        spares: list[tuple[ModelRecord, Replica]] = []
        keys = list(leaving)
        for owner, replica in sorted(ready, key=lambda p: (p[1].pending > 0, p[1].last_busy)):
            if self.budget.freed_by(device, keys, files) >= missing:
                break
            spares.append((owner, replica))
            keys.append(replica.key)
        return spares, keys

    def holders(self, record: ModelRecord, device: str) -> list[Holder]:
        """The reservations evicting ``record`` gives back on ``device``."""
        keys: list[Holder] = [record.key] if record.device == device else []
        return keys + [rep.key for rep in record.replicas if rep.device == device]

    def refusal(
        self, record: ModelRecord, need: int, device: str | None = None
    ) -> MemoryBudgetError:
        dev = self.budget.device(device or record.device)
        resident = [r for r in self.records() if r.state in RESIDENT]
        pinned = [str(r.key) for r in resident if r.pinned]
        higher = [str(r.key) for r in resident if r.config.priority < record.config.priority]
        return MemoryBudgetError(
            f"cannot load {record.key}: needs {need / _MIB:.1f} MiB on {dev.name}, budget "
            f"{dev.budget_bytes / _MIB:.1f} MiB with {dev.reserved_bytes / _MIB:.1f} MiB reserved; "
            f"pinned: {', '.join(pinned) or 'none'}; "
            f"higher priority: {', '.join(higher) or 'none'}",
            retry_after_s=5.0,
        )

    async def admit(
        self,
        record: ModelRecord,
        need: int,
        deadline: float | None,
        *,
        may_evict: bool = True,
        device: str | None = None,
        holder: Holder | None = None,
        files: list[SharedFile] | None = None,
    ) -> None:
        """Reserve ``need`` bytes for ``record`` on ``device``, evicting allowed victims.

        ``device`` defaults to where ``record`` is placed, ``holder`` to its first
        replica and ``files`` to :meth:`mapped_files`; an extra replica passes its own
        device and key, a GPU model's host part no files. With ``may_evict``
        False (prefetches, scale-out) it evicts nothing: it takes free room, waits for
        what is already leaving (the victims a prefetcher chose), or refuses.
        """
        device = device or record.device
        holder = holder or record.key
        dev = self.budget.device(device)
        # ``need`` is the private part; mapped weight files are charged once per file.
        files = self.mapped_files(record, device) if files is None else files
        whole = need + sum(f.size for f in set(files))
        if whole > dev.budget_bytes:
            raise self.too_big(record, whole, dev.budget_bytes, f"budget of {device}")
        self._waiting.add((device, holder))
        try:
            await self._admit(record, need, deadline, files, device, holder, may_evict)
        finally:
            self._waiting.discard((device, holder))

    async def _admit(
        self,
        record: ModelRecord,
        need: int,
        deadline: float | None,
        files: list[SharedFile],
        device: str,
        holder: Holder,
        may_evict: bool,
    ) -> None:
        dev, began = self.budget.device(device), self._clock.monotonic()
        while True:
            if self.budget.try_reserve(device, holder, need, files):
                if holder == record.key:
                    record.reserved_bytes = self.budget.reserved(device, holder)
                return
            current = dev.reservations.get(holder, 0)
            missing = need - current + dev.uncharged_bytes(files) - dev.free_bytes
            # What is already on its way out will give back, counted by the budget: a
            # file shared with models that stay is not freed by them.
            leaving_keys = self.leaving(device)
            leaving = self.budget.freed_by(device, leaving_keys, files)
            if not may_evict and leaving < missing:
                # A prefetch or a scale-out evicts nothing itself (a prefetcher chose its
                # victims, already leaving): it waits for them, or takes no for an answer.
                raise self.refusal(record, need + dev.uncharged_bytes(files), device)
            poll: float | None = None
            if may_evict and leaving < missing:
                whole_need = need + dev.uncharged_bytes(files)
                waited = self._clock.monotonic() - began
                spares, victims, poll = self._plan(
                    record,
                    device,
                    missing,
                    files,
                    leaving_keys,
                    whole_need,
                    patient=waited < _MAX_WAIT_S,
                )
                for owner, replica in spares:
                    if self._evict_replica is not None:
                        self._evict_replica(owner, replica, f"making room for {record.key}")
                for victim in victims:
                    self._evict(victim, f"making room for {record.key}")
            remaining = None if deadline is None else deadline - self._clock.monotonic()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceededError(
                    f"model {record.key} waited for memory past the request's deadline"
                )
            if poll is not None:
                remaining = poll if remaining is None else min(poll, remaining)
            async with self.changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), remaining)

    def leaving(self, device: str) -> list[Holder]:
        """Reservations on ``device`` whose models or replicas are already on their way out."""
        keys: list[Holder] = []
        for r in self.records():
            if r.device == device and r.state in (ModelState.DRAINING, ModelState.UNLOADING):
                keys.append(r.key)
            keys += [
                rep.key
                for rep in r.replicas
                if rep.device == device and rep.state is ReplicaState.DRAINING
            ]
        return keys

    def plan(
        self,
        record: ModelRecord,
        device: str,
        missing: int,
        files: list[SharedFile],
        leaving: list[Holder],
    ) -> tuple[list[tuple[ModelRecord, Replica]], list[ModelRecord]] | None:
        """Spare replicas, then whole models, that free ``missing`` bytes on ``device``.

        Spare replicas go first (idlest first); whole models follow in the policy's
        order, hot models last (see :meth:`victims`). None when even all of them would
        not do. What placement costs a device by; a load itself follows :meth:`_plan`.
        """
        spares, keys = self.spare_replicas(record, device, missing, files, leaving)
        victims = self.victims(record, missing, files, keys, device=device, hot=self.hot())
        return None if victims is None else (spares, victims)

    def _plan(
        self,
        record: ModelRecord,
        device: str,
        missing: int,
        files: list[SharedFile],
        leaving: list[Holder],
        whole_need: int,
        *,
        patient: bool = True,
    ) -> tuple[list[tuple[ModelRecord, Replica]], list[ModelRecord], float | None]:
        """Whom to stop now for ``missing`` bytes on ``device``, or to wait (and how often
        to look again): spare replicas, victims, poll interval.

        In this order (issue 16: evicting whatever was READY made the hottest model thrash):

        0. spare replicas on the device, idlest first (spare capacity costs no reload);
        1. idle models outside the hot decile, in the policy's order;
        2. else, if colder models that are busy, still loading, or leaving could make
           room, wait for them (a lease ends without a notification: look again soon);
           once not ``patient`` (waited ``_MAX_WAIT_S``), evict busy colder ones instead,
           as a model with steady traffic may never be idle (not one loaded less than
           ``_MAX_WAIT_S`` ago for requests that wait for it: ``hot_set.just_loaded``);
        3. else hot models too (after those just loaded), the least demanded first;
        4. else, if models still loading could make room, wait; otherwise refuse
           (none takes a model whose waiters have not woken since its load: ``victims``).
        """
        spares, keys = self.spare_replicas(record, device, missing, files, leaving)
        if self.budget.freed_by(device, keys, files) >= missing:
            return spares, [], None
        hot = self.hot()
        pick = partial(self.victims, record, missing, files, keys, device=device)
        victims = pick(exclude=hot, idle_only=True)
        if victims is not None:
            return spares, victims, None
        ready = self.candidates(record, device=device)
        loading = self.candidates(record, loading=True, device=device)
        # Busy colder models free their room once their requests finish, loading ones
        # once loaded; but only loads already admitted (holding a reservation) and not
        # waiting for room themselves: two loads waiting for room, to start or to grow
        # after measuring, could each wait for the other forever.
        # A footprint commit waiting to grow never waits for a load: a load waits for it.
        waits = [] if record.footprint_pending else [r for r in loading if r.footprint_pending]
        growing = [r for r in waits if (device, r.key) in self._waiting]
        loading = [r for r in loading if (device, r.key) not in self._waiting]
        admitted = [r for r in loading if self.budget.reserved(device, r.key) > 0]
        others = ready + loading
        cold = [k for r in ready + admitted if r.key not in hot for k in self.holders(r, device)]
        # Impatience takes busy models, but not one just loaded for its waiters.
        fresh = just_loaded(others, device, self._clock.monotonic(), _MAX_WAIT_S)
        if self.budget.freed_by(device, keys + cold, files) >= missing:
            if not patient and (busy := pick(exclude=hot | fresh)) is not None:
                return spares, busy, None
            return spares, [], _BUSY_POLL_S
        victims = pick(hot=fresh | hot)
        if victims is not None:
            holders = partial(self.holders, device=device)
            if patient and wait_to_spare_hottest(
                self.budget, holders, victims, hot, others, device, keys, files, missing
            ):
                return spares, [], _BUSY_POLL_S
            return spares, victims, None
        every = keys + [k for r in others + growing for k in self.holders(r, device)]
        if self.budget.freed_by(device, every, files) < missing:
            raise self.refusal(record, whole_need, device)
        return spares, [], _BUSY_POLL_S

    def victims(
        self,
        record: ModelRecord,
        missing: int,
        files: list[SharedFile],
        leaving: list[Holder],
        *,
        device: str | None = None,
        exclude: Mapping[Hashable, float] | None = None,
        hot: Mapping[Hashable, float] | None = None,
        idle_only: bool = False,
    ) -> list[ModelRecord] | None:
        """The shortest prefix of the policy's order that, with ``leaving``, frees ``missing``.

        Counted by the budget, not by each victim's own reservation: a weight file
        several models share is freed only when all of them go, and one ``record``
        will map anyway is not freed at all. Models in ``exclude`` are not candidates,
        nor busy ones with ``idle_only``, nor ones whose waiters have not woken since
        their load (``hot_set.awaited``: a load waiting for room wakes first when a load
        ends); those in ``hot`` come last, the least demanded of them first.
        """
        device = device or record.device
        self.settle()  # the policy orders by what it learnt: every request so far
        skip = {*(exclude or {}), *awaited(self.records(), device)}
        everyone = [
            r
            for r in self.candidates(record, device=device, bases=True)
            if r.key not in skip and not (idle_only and r.pending > 0)
        ]
        candidates, bases = adapters_first(everyone, self.records())
        replicated = any(r.replicas for r in candidates)
        if not bases and not files and not self.budget.device(device).shared and not replicated:
            # No shared files: each victim frees exactly its own reservation.
            return select_victims(
                self.policy, candidates, missing - self.budget.freed_by(device, leaving), hot
            )
        chosen: list[ModelRecord] = []
        if self.budget.freed_by(device, leaving, files) >= missing:
            return chosen
        # A base in use comes after every adapter that uses it (all candidates too).
        for victim in protect_hot(self.policy.order(candidates), hot or {}) + bases:
            chosen.append(victim)
            keys = leaving + [k for r in chosen for k in self.holders(r, device)]
            if self.budget.freed_by(device, keys, files) >= missing:
                return chosen
        return None

    def release(self, record: ModelRecord) -> None:
        """Give back the first replica's reservations: on its device, and a GPU model's
        host part on the CPU (extra replicas release their own)."""
        for device in self.budget.devices:
            self.budget.release(device, record.key)
        record.reserved_bytes = 0
