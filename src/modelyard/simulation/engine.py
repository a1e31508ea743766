"""Replay a trace against a budget with the manager's own policy and prefetcher objects.

Time is the trace's: nothing sleeps, no process starts. Per request: the model's
demand and the policy are told (as ``ModelManager.touch`` does); a resident model is a
hit (or a delayed hit, waiting for the rest of a load in progress); otherwise room is
made with :func:`~modelyard.manager.eviction.select_victims` over the same candidates
admission would offer (resident, not loading, unpinned; busy ones marked by a lease so
the policy puts them last; the hot decile last of all), and the model loads in its
reload time. When only models still loading could make room, the load starts once they
are ready, as admission waits for them. A request waits for its model's load: that wait
is the cold-start time it adds. After each request the real
:class:`~modelyard.manager.prefetch.Prefetcher` may load a predicted model, into free
budget or displacing idle colder ones.

Loads run at most ``load_slots`` at a time (a load is CPU work; the host has that many
cores), the others queue. What it leaves out, on purpose: queueing behind other
requests of the same model (``service_s`` only marks a model busy), the delay of a
drain, and request deadlines (a wait is never cut short).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import PrefetchConfig
from modelyard.errors import ModelNotFoundError
from modelyard.manager.episodes import hot_weights
from modelyard.manager.eviction import (
    DEFAULT_HALF_LIFE_S,
    HOT_BUDGET_SHARE,
    BeladyPolicy,
    DemandTracker,
    EvictionPolicy,
    cap_hot,
    demand_scale,
    make_policy,
    protect_hot,
    select_victims,
    top_scale,
)
from modelyard.manager.hot_set import hottest, with_hottest
from modelyard.manager.prefetch import Prefetcher
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.manager.states import ModelState
from modelyard.manager.time_of_day import DAY_S
from modelyard.simulation.traces import ModelSpec, Trace

VERSION = "1"


@dataclass
class SimResult:
    """What one replay cost."""

    trace: str
    policy: str
    budget_bytes: int
    requests: int = 0
    cold_starts: int = 0
    """Requests that found their model absent and started its load."""
    delayed: int = 0
    """Requests that waited for a load another request (or a prefetch) started."""
    cold_start_s: float = 0.0
    """Seconds requests spent waiting for loads, summed."""
    p99_added_s: float = 0.0
    """99th percentile over all requests of the seconds a load added."""
    loads: int = 0
    evictions: int = 0
    refused: int = 0
    """Requests for a model bigger than the whole budget."""
    loads_by_model: Counter[str] = field(default_factory=Counter)
    prefetches: int = 0
    prefetch_hits: int = 0
    """Prefetched models whose next request found them loading or loaded."""
    prefetch_wasted: int = 0
    """Prefetched models evicted (or left at the end) before any request used them."""
    hidden_s: float = 0.0
    """Load seconds prefetching took off requests' waits."""
    displaced: int = 0
    """Evictions made for a prefetch."""
    prewarms: int = 0
    """Prefetches from a model's own pre-warm window (the rest follow Markov transitions)."""

    def as_row(self) -> dict[str, object]:
        """A flat JSON-ready summary."""
        return {
            "trace": self.trace,
            "policy": self.policy,
            "budget_mib": round(self.budget_bytes / 2**20, 3),
            "requests": self.requests,
            "cold_starts": self.cold_starts,
            "cold_start_s": round(self.cold_start_s, 3),
            "p99_added_ms": round(self.p99_added_s * 1000, 2),
            "loads": self.loads,
            "evictions": self.evictions,
            "refused": self.refused,
            "prefetches": self.prefetches,
            "prefetch_hits": self.prefetch_hits,
            "prefetch_wasted": self.prefetch_wasted,
            "hidden_s": round(self.hidden_s, 3),
            "prewarms": self.prewarms,
        }


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank; 0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


class _Cache:
    """The simulated device: records, their reservations and the clock."""

    def __init__(
        self,
        trace: Trace,
        policy: EvictionPolicy,
        budget_bytes: int,
        result: SimResult,
        *,
        hot_fraction: float,
        half_life_s: float,
        service_s: float,
        pinned: frozenset[str],
        load_slots: int,
    ) -> None:
        self.specs = trace.models
        self.policy = policy
        self.budget = budget_bytes
        self.result = result
        self.hot_fraction = hot_fraction
        self.service_s = service_s
        self.demand = DemandTracker(half_life_s)
        self.demand.scale = demand_scale(policy)
        self.hot_weight = hot_weights(policy)
        self.records: dict[str, ModelRecord] = {}
        for name, spec in self.specs.items():
            r = ModelRecord(
                key=ModelKey(name, VERSION),
                config=ModelConfig(name=name, path=name),
                path=Path(name),
                pinned=name in pinned,
            )
            # The measured curve stands in for the last load's duration.
            r.timings.total_s = spec.load_s
            self.records[name] = r
        self.ready_at: dict[str, float] = {}
        self.busy_until: dict[str, float] = {}
        self.prefetched: dict[str, float] = {}
        """Models loaded by a prefetch and not asked for since: when their load ends."""
        self.used = 0
        self.now = 0.0
        self.slots = [0.0] * load_slots
        """When each of the loads that can run at once is next free (empty: unbounded)."""

    def resident(self, name: str) -> bool:
        return self.records[name].state is ModelState.READY

    def free(self) -> int:
        return self.budget - self.used

    def candidates(self, loader: str, *, loading: bool) -> list[ModelRecord]:
        out = []
        for name, r in self.records.items():
            if name == loader or r.state is not ModelState.READY or r.pinned:
                continue
            if not loading and self.ready_at[name] > self.now:
                continue
            # A lease marks a model a request is using, as the router's does.
            r.leases = 1 if self.busy_until.get(name, 0.0) > self.now else 0
            out.append(r)
        return out

    def hot(self) -> dict[Hashable, float]:
        if self.hot_fraction <= 0:
            return {}
        hot = with_hottest(
            self.demand.hot(self.now, self.hot_fraction), self.demand, self.now,
            top_scale(self.policy),
        )  # fmt: skip
        sizes: dict[Hashable, int] = {
            r.key: self.specs[n].size_bytes for n, r in self.records.items() if r.key in hot
        }
        return cap_hot(hot, sizes, int(self.budget * HOT_BUDGET_SHARE))

    def plan(self, name: str, missing: int) -> tuple[list[ModelRecord], float] | None:
        """Victims freeing ``missing`` bytes and when the load can start (None: refused).

        As admission does: idle, settled models outside the hot decile now; else colder
        models that are busy or still loading, once they are idle; else hot ones too,
        the least demanded first.
        """
        hot = self.hot()
        settled = self.candidates(name, loading=False)
        idle_cold = [r for r in settled if r.pending == 0 and r.key not in hot]
        victims = select_victims(self.policy, idle_cold, missing)
        if victims is not None:
            return victims, self.now
        every = self.candidates(name, loading=True)
        cold = [r for r in every if r.key not in hot]
        victims = select_victims(self.policy, cold, missing)
        if victims is None:
            victims = select_victims(self.policy, every, missing, hot)
            top = hottest(hot)
            if victims is not None and any(v.key == top for v in victims):
                # The hottest goes only if waiting for the others could not make room.
                rest = [r for r in every if r.key != top]
                victims = select_victims(self.policy, rest, missing, hot) or victims
        if victims is None:
            return None
        # A busy victim drains its queue while the load starts (the simulator does not
        # model a drain's delay); one still loading is evicted once it is ready.
        start = max([self.now, *(self.ready_at[v.key.name] for v in victims)])
        return victims, start

    def evict(self, record: ModelRecord) -> None:
        name = record.key.name
        self.policy.on_evict(record)
        record.state = ModelState.UNLOADED
        self.used -= record.reserved_bytes
        record.reserved_bytes = 0
        record.leases = 0
        self.result.evictions += 1
        if self.prefetched.pop(name, None) is not None:
            self.result.prefetch_wasted += 1

    def load(self, name: str, start: float) -> None:
        spec = self.specs[name]
        r = self.records[name]
        r.state = ModelState.READY
        r.reserved_bytes = spec.size_bytes
        self.used += spec.size_bytes
        if self.slots:
            # A load is CPU work: it starts once one of the host's cores is free.
            start = max(start, heapq.heappop(self.slots))
            heapq.heappush(self.slots, start + spec.load_s)
        self.ready_at[name] = start + spec.load_s
        self.result.loads += 1
        self.result.loads_by_model[name] += 1

    def request(self, name: str) -> float:
        """Serve one request at ``now``; the seconds its model's load added."""
        res = self.result
        r = self.records[name]
        spec: ModelSpec = self.specs[name]
        res.requests += 1
        r.stats.requests += 1
        r.stats.last_used = self.now
        weight = self.hot_weight(r.key, self.now) if self.hot_weight else 1.0
        self.demand.observe(r.key, self.now, weight)
        self.policy.on_request(r, self.now)
        if self.resident(name):
            wait = max(0.0, self.ready_at[name] - self.now)
            ends = self.prefetched.pop(name, None)
            if ends is not None:
                res.prefetch_hits += 1
                res.hidden_s += spec.load_s - wait
            elif wait > 0:
                res.delayed += 1
        else:
            if spec.size_bytes > self.budget:
                res.refused += 1
                return 0.0
            res.cold_starts += 1
            start = self.now
            missing = spec.size_bytes - self.free()
            if missing > 0:
                planned = self.plan(name, missing)
                if planned is None:
                    res.refused += 1
                    return 0.0
                victims, start = planned
                for v in victims:
                    self.evict(v)
            self.load(name, start)
            wait = self.ready_at[name] - self.now
        busy = max(self.busy_until.get(name, 0.0), self.now + wait)
        self.busy_until[name] = busy + self.service_s
        res.cold_start_s += wait
        return wait


def simulate(
    trace: Trace,
    policy: str | EvictionPolicy,
    budget_bytes: int,
    *,
    prefetch: PrefetchConfig | None = None,
    hot_fraction: float = 0.1,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
    service_s: float = 0.01,
    pinned: frozenset[str] = frozenset(),
    load_slots: int = 2,
    period_s: float = DAY_S,
) -> SimResult:
    """Replay ``trace`` with ``policy`` (a name, ``belady``, or a policy object).

    ``hot_fraction`` is admission's hot-model rule (0 turns it off); ``prefetch`` turns
    the predictor on with that configuration. ``load_slots`` loads run at once (the
    host's cores; 0: unbounded), the others queue for a slot. ``period_s``: the daily
    cycle a named ``arrival-cost`` looks for (a synthetic trace's day may be shorter).
    """
    requests = trace.requests
    nexts: dict[str, deque[float]] = {}
    for req in requests:
        nexts.setdefault(req.model, deque()).append(req.t)

    def next_use(key: ModelKey) -> float:
        queue = nexts.get(key.name)
        return queue[0] if queue else math.inf

    if isinstance(policy, str):
        chosen: EvictionPolicy = (
            BeladyPolicy(next_use)
            if policy == "belady"
            else make_policy(policy, half_life_s=half_life_s, period_s=period_s)
        )
    else:
        chosen = policy
    result = SimResult(trace.name, chosen.name, budget_bytes)
    cache = _Cache(
        trace,
        chosen,
        budget_bytes,
        result,
        hot_fraction=0.0 if chosen.name == "belady" else hot_fraction,
        half_life_s=half_life_s,
        service_s=service_s,
        pinned=pinned,
        load_slots=load_slots,
    )
    prefetcher = _prefetcher(cache, prefetch) if prefetch is not None else None
    waits: list[float] = []
    for req in requests:
        cache.now = req.t
        if req.model not in trace.models:
            continue
        nexts[req.model].popleft()
        waits.append(cache.request(req.model))
        if prefetcher is not None:
            _prefetch(cache, prefetcher, req.model)
    result.prefetch_wasted += len(cache.prefetched)
    result.p99_added_s = percentile(waits, 99)
    return result


def _prefetcher(cache: _Cache, config: PrefetchConfig) -> Prefetcher:
    def resolve(name: str) -> ModelRecord:
        record = cache.records.get(name)
        if record is None:
            raise ModelNotFoundError(f"model {name!r} is not in the trace")
        return record

    def victims(target: ModelRecord, missing: int) -> list[ModelRecord] | None:
        # Idle, settled, outside the hot decile: what a prefetch may displace.
        hot = cache.hot()
        idle = [
            r
            for r in cache.candidates(target.key.name, loading=False)
            if r.pending == 0 and r.key not in hot
        ]
        return select_victims(cache.policy, protect_hot(idle, hot), missing)

    prefetcher = Prefetcher(
        config,
        resolve,
        lambda r: cache.free(),
        lambda r: cache.specs[r.key.name].size_bytes,
        victims=victims,
    )
    prefetcher.pair(cache.policy)
    return prefetcher


def _prefetch(cache: _Cache, prefetcher: Prefetcher, model: str) -> None:
    decision = prefetcher.after(model, cache.now)
    if decision is None or not decision.load:
        return  # the page-cache tier is not simulated: it shortens loads, not misses
    name = decision.target.key.name
    for v in decision.victims:
        cache.evict(v)
        cache.result.displaced += 1
    if cache.specs[name].size_bytes > cache.free():
        return  # the plan's victims did not free enough after all
    cache.load(name, cache.now)
    cache.result.prefetches += 1
    cache.result.prewarms += decision.guess.prewarm
    cache.prefetched[name] = cache.ready_at[name]
