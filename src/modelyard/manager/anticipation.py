"""What a request sets in motion beyond itself: predictions acted on, files warmed, the log.

After each run of requests for one model (learnt once per loop turn:
:mod:`~modelyard.manager.learning`) the manager asks the
:class:`~modelyard.manager.prefetch.Prefetcher` what to load ahead; this module carries
the answer out (evict the victims it chose, load the target as a prefetch, or warm the
target's files in the page cache), counts prefetch hits, and writes the opt-in request
log. See docs/caching.md.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from modelyard.clock import Clock
from modelyard.config.settings import ServerSettings
from modelyard.manager.admission import Admission
from modelyard.manager.events import Event, EventLog
from modelyard.manager.eviction import select_victims
from modelyard.manager.prefetch import PrefetchDecision, Prefetcher
from modelyard.manager.records import ModelRecord
from modelyard.manager.registry import ModelRegistry
from modelyard.manager.request_log import RequestLog
from modelyard.manager.tasks import TaskOwner
from modelyard.repository import page_cache

log = logging.getLogger("modelyard.manager")

_MIB = 1024 * 1024
# A predicted model's files are read into the page cache at most once in this long.
PAGE_CACHE_EVERY_S = 30.0
PREWARM_TICK_S = 0.2
"""How often opening pre-warm windows are looked for besides after each request: within
``prefetch.PREWARM_MARGIN_S``, so a quiet server starts a pre-warm in time (a look is a
peek at a heap)."""


class Anticipation:
    """Acts on the prefetcher's decisions and keeps the request log."""

    def __init__(
        self,
        settings: ServerSettings,
        *,
        registry: ModelRegistry,
        admission: Admission,
        tasks: TaskOwner,
        events: EventLog,
        clock: Clock,
        load: Callable[[ModelRecord], Coroutine[Any, Any, None]],
        evict: Callable[[ModelRecord, str], None],
        free_bytes: Callable[[ModelRecord], int] | None = None,
    ) -> None:
        self._settings = settings
        self._registry = registry
        self._admission = admission
        self._tasks = tasks
        self._events = events
        self._clock = clock
        self._load = load
        """Starts a prefetch load of a record (the loader's, with ``prefetch=True``)."""
        self._evict = evict
        self._warmed: dict[object, float] = {}
        self._asking: ModelRecord | None = None
        """The record whose request is being predicted from (never a victim of it)."""
        self.prefetcher = Prefetcher(
            settings.prefetch,
            lambda name: registry.resolve(name, None),
            # The most free budget on a device the model may use (the manager's), else
            # on the device it is placed on.
            free_bytes or (lambda r: admission.budget.device(r.device).free_bytes),
            admission.estimate_bytes,
            victims=self.victims,
        )
        self.tick_s = PREWARM_TICK_S
        self.settle: Callable[[], None] = lambda: None
        """Learns the requests not learnt yet (the manager's ``RequestEvents.flush``):
        the timer's look at the pre-warm windows must see them."""
        self.request_log: RequestLog | None = None
        if settings.request_log.path:
            try:
                self.request_log = RequestLog(
                    Path(settings.request_log.path),
                    int(settings.request_log.max_mb * _MIB),
                    clock,
                    load_slots=settings.load_slots,
                )
            except OSError as exc:
                # An observability aid: a server that cannot write it still serves.
                log.error("request_log.path: cannot open %s: %s", settings.request_log.path, exc)
            else:
                events.listeners.append(self._log_load)

    def after_requests(self, record: ModelRecord, times: Sequence[float], cold: bool) -> None:
        """Log consecutive requests for ``record`` at ``times`` (ascending) and act on the
        prediction after the last (:meth:`Prefetcher.after_run`); ``cold``: the last
        found the model cold, holding no reservation (its own load takes room too).
        A prefetch hit is counted by the request itself (:meth:`count_hit`)."""
        if self.request_log is not None:
            for now in times:
                self.request_log.request(record, now)
        # A cold request's own load takes room too (the simulator loads it first).
        own = self._admission.estimate_bytes(record) if cold else 0
        now = times[-1]
        # The requests' leases may have ended by the time their batch is consumed: the
        # model then looks idle, and a prediction could pick the very model asked for as
        # a victim.
        self._asking = record
        try:
            decision = self.prefetcher.after_run(
                record.key.name, times, also_needed=own, turnover_s=lambda: self._turnover_s(now)
            )
        finally:
            self._asking = None
        if decision is not None:
            self._act(record, decision)

    @staticmethod
    def count_hit(record: ModelRecord, now: float) -> None:
        """The first request after a prefetch (``prefetched_at`` set), at ``now``: the
        load it did not wait for is hidden. Counted by the request itself (the manager's
        ``touch``), as a request's own figure, before its batch is learnt."""
        if record.prefetched_at is None:
            return
        record.stats.prefetch_hits += 1
        elapsed = now - record.prefetched_at
        hidden = record.timings.total_s if record.is_ready else elapsed
        record.stats.prefetch_hidden_s += max(0.0, min(hidden, elapsed))
        record.prefetched_at = None

    def start(self) -> None:
        """Look for opening pre-warm windows every :attr:`tick_s`, requests or not."""
        if self._settings.prefetch.enabled and self._settings.prefetch.prewarm:
            self._tasks.spawn(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            self.settle()
            now = self._clock.monotonic()
            decision = self.prefetcher.tick(now, turnover_s=partial(self._turnover_s, now))
            if decision is not None:
                self._act(None, decision)

    def _turnover_s(self, now: float) -> float:
        """The longest idle time among resident models: how long idleness survives now."""
        idle = [
            now - r.stats.last_used
            for r in self._admission.records()
            if r.is_ready and not r.pinned and r.stats.last_used
        ]
        return max(idle, default=math.inf)

    def close(self) -> None:
        """Flush and close the request log."""
        if self.request_log is not None:
            self.request_log.close()

    def victims(self, target: ModelRecord, missing: int) -> list[ModelRecord] | None:
        """What a prediction may displace: idle, unpinned, outside the hot decile."""
        hot = self._admission.hot()
        idle = [
            r
            for r in self._admission.candidates(target)
            if r.pending == 0 and r.key not in hot and r.key != target.key and r is not self._asking
        ]
        return select_victims(self._admission.policy, idle, missing)

    def _act(self, after: ModelRecord | None, decision: PrefetchDecision) -> None:
        target, guess = decision.target, decision.guess
        if not decision.load:
            self.warm_page_cache(target)
            return
        for victim in decision.victims:
            self._evict(victim, f"displaced by a prediction of {target.key}")
        target.stats.prefetches += 1
        target.prefetched_at = self._clock.monotonic()
        displaced = f"; displacing {len(decision.victims)}" if decision.victims else ""
        odds = f"p={guess.probability:.2f} over {guess.observations}"
        why = (
            f"pre-warm: its idle-time window opens ({odds} gaps)"
            if guess.prewarm
            else f"after {after.key.name if after else '?'} ({odds})"
        )
        self._events.add("prefetch", target.key, why + displaced)
        target.load_task = self._tasks.spawn(self._prefetch_load(target))

    async def _prefetch_load(self, target: ModelRecord) -> None:
        await self._load(target)
        if not target.is_ready and target.prefetched_at is not None:
            # Refused or failed: nothing was loaded ahead; warm the files instead.
            target.prefetched_at = None
            self.warm_page_cache(target)

    def warm_page_cache(self, target: ModelRecord) -> None:
        """Read a likely model's files into the page cache (no budget), at most every 30 s."""
        if not self._settings.prefetch.page_cache:
            return
        now = self._clock.monotonic()
        last = self._warmed.get(target.key)
        if last is not None and now - last < PAGE_CACHE_EVERY_S:
            return
        self._warmed[target.key] = now
        target.stats.page_cache_warms += 1
        self._tasks.spawn(self._warm(target.path))

    @staticmethod
    async def _warm(path: Path) -> None:
        await asyncio.to_thread(page_cache.warm, path)

    def _log_load(self, event: Event) -> None:
        if event.kind != "loaded" or self.request_log is None:
            return
        entry = self._registry.entries.get(event.model)
        record = entry.versions.get(event.version) if entry is not None else None
        if record is not None:
            self.request_log.loaded(record)
