"""Admission: how many bytes a load reserves, and whom it evicts to get them.

A load reserves its private bytes (and its mapped weight files, once per file) before
its worker starts; if they do not fit, the eviction policy names victims among the
READY, unpinned models of no higher priority, and the load waits on :attr:`changed`
until their memory is back. A load that cannot fit even then is refused with the
reason (pinned and higher-priority models named).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Hashable, Iterable, Mapping

from modelyard.clock import Clock
from modelyard.errors import DeadlineExceededError, MemoryBudgetError
from modelyard.manager.budget import MemoryBudget, SharedFile
from modelyard.manager.eviction import (
    HOT_BUDGET_SHARE,
    DemandTracker,
    EvictionPolicy,
    cap_hot,
    protect_hot,
    select_victims,
)
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.manager.states import RESIDENT, ModelState
from modelyard.repository.layout import dir_size_bytes
from modelyard.workers.footprint import weight_files

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


class Admission:
    """Reservations against the device budgets, with eviction to make room."""

    def __init__(
        self,
        budget: MemoryBudget,
        policy: EvictionPolicy,
        records: Callable[[], Iterable[ModelRecord]],
        evict: Callable[[ModelRecord, str], None],
        clock: Clock,
        demand: DemandTracker | None = None,
        hot_fraction: float = 0.1,
    ) -> None:
        self.budget = budget
        self.policy = policy
        self._records = records
        self._evict = evict
        """Starts evicting a victim in the background (the manager owns the task)."""
        self._clock = clock
        self.changed = asyncio.Condition()
        """Notified whenever memory is released or a model's state settles."""
        self.demand = demand
        """Recent demand per model (the hot-model rule; None: no such rule)."""
        self.hot_fraction = hot_fraction

    def hot(self) -> dict[Hashable, float]:
        """The models in the top decile of recent demand, with their demand (never
        victims while colder models are evictable, or will be once their loads finish)."""
        if self.demand is None or self.hot_fraction <= 0:
            return {}
        hot = self.demand.hot(self._clock.monotonic(), self.hot_fraction)
        if not hot:
            return hot
        sizes: dict[Hashable, int] = {}
        budgets: list[int] = []
        for r in self.records():
            if r.key in hot:
                sizes[r.key] = r.reserved_bytes or r.measured_bytes or 0
                budgets.append(self.budget.device(r.config.device).budget_bytes)
        return cap_hot(hot, sizes, int(min(budgets, default=0) * HOT_BUDGET_SHARE))

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
        private_files = max(0, dir_size_bytes(record.path) - weights)
        guess = int(private_files * _SIZE_GUESS_FACTOR) + _SIZE_GUESS_BASE_BYTES
        return max(declared, measured, guess)

    def mapped_files(self, record: ModelRecord) -> list[SharedFile]:
        """The weight files ``record``'s replica will memory-map (``share_weights`` ONNX)."""
        cfg = record.config
        if not (cfg.share_weights and cfg.runtime == "onnx"):
            return []
        return weight_files(record.path)

    def candidates(self, loader: ModelRecord, *, loading: bool = False) -> list[ModelRecord]:
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

    def refusal(self, record: ModelRecord, need: int) -> MemoryBudgetError:
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

    async def admit(
        self,
        record: ModelRecord,
        need: int,
        deadline: float | None,
        *,
        may_evict: bool = True,
    ) -> None:
        """Reserve ``need`` bytes for ``record``, evicting allowed victims to make room.

        With ``may_evict`` False (prefetches) it evicts nothing: it takes free room, waits
        for models already leaving (the victims its prefetcher chose), or refuses.
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
        began = self._clock.monotonic()
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
            if not may_evict and leaving < missing:
                # A prefetch evicts nothing itself (the prefetcher chose its victims,
                # already leaving); it waits for them, or takes no for an answer.
                raise self.refusal(record, need + dev.uncharged_bytes(files))
            poll: float | None = None
            if may_evict and leaving < missing:
                whole_need = need + dev.uncharged_bytes(files)
                waited = self._clock.monotonic() - began
                victims, poll = self._plan(
                    record, missing, files, leaving_keys, whole_need, patient=waited < _MAX_WAIT_S
                )
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

    def _plan(
        self,
        record: ModelRecord,
        missing: int,
        files: list[SharedFile],
        leaving: list[ModelKey],
        whole_need: int,
        *,
        patient: bool = True,
    ) -> tuple[list[ModelRecord], float | None]:
        """Whom to evict now for ``missing`` bytes, or to wait (and how often to look again).

        In this order (issue 16: under concurrency the budget is often full of loads in
        progress and of models serving requests; evicting whatever was READY made the
        hottest model thrash, and evicting a model its waiting request had just loaded
        sent that request round again):

        1. idle models outside the hot decile, in the policy's order;
        2. else, if colder models that are busy, still loading, or leaving could make
           room, wait for them (a lease ends without a notification: look again soon);
           once not ``patient`` (waited ``_MAX_WAIT_S``), evict busy colder ones instead,
           as a model with steady traffic may never be idle;
        3. else hot models too, the least demanded first;
        4. else, if models still loading could make room, wait; otherwise refuse.
        """
        device = record.config.device
        hot = self.hot()
        victims = self.victims(record, missing, files, leaving, exclude=hot, idle_only=True)
        if victims is not None:
            return victims, None
        others = self.candidates(record) + self.candidates(record, loading=True)
        cold = [r.key for r in others if r.key not in hot]
        if self.budget.freed_by(device, leaving + cold, files) >= missing:
            if not patient:
                busy = self.victims(record, missing, files, leaving, exclude=hot)
                if busy is not None:
                    return busy, None
            return [], _BUSY_POLL_S
        victims = self.victims(record, missing, files, leaving, hot=hot)
        if victims is not None:
            return victims, None
        keys = leaving + [r.key for r in others]
        if self.budget.freed_by(device, keys, files) < missing:
            raise self.refusal(record, whole_need)
        return [], _BUSY_POLL_S

    def victims(
        self,
        record: ModelRecord,
        missing: int,
        files: list[SharedFile],
        leaving: list[ModelKey],
        *,
        exclude: Mapping[Hashable, float] | None = None,
        hot: Mapping[Hashable, float] | None = None,
        idle_only: bool = False,
    ) -> list[ModelRecord] | None:
        """The shortest prefix of the policy's order that, with ``leaving``, frees ``missing``.

        Counted by the budget, not by each victim's own reservation: a weight file
        several models share is freed only when all of them go, and one ``record``
        will map anyway is not freed at all. Models in ``exclude`` are not candidates,
        nor busy ones with ``idle_only``; those in ``hot`` come last whatever the policy
        says, the least demanded of them first.
        """
        device = record.config.device
        candidates = [
            r
            for r in self.candidates(record)
            if r.key not in (exclude or {}) and not (idle_only and r.pending > 0)
        ]
        if not files and not self.budget.device(device).shared:
            # No shared files: each victim frees exactly its own reservation.
            return select_victims(
                self.policy, candidates, missing - self.budget.freed_by(device, leaving), hot
            )
        chosen: list[ModelRecord] = []
        if self.budget.freed_by(device, leaving, files) >= missing:
            return chosen
        for victim in protect_hot(self.policy.order(candidates), hot or {}):
            chosen.append(victim)
            keys = leaving + [r.key for r in chosen]
            if self.budget.freed_by(device, keys, files) >= missing:
                return chosen
        return None

    def release(self, record: ModelRecord) -> None:
        self.budget.release(record.config.device, record.key)
        record.reserved_bytes = 0
