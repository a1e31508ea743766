"""Eviction policies: who leaves when a load needs room. Pure functions of records.

Every policy orders the eviction candidates, most evictable first, with the same two
rules in front of its own criterion: idle models before busy ones (a busy model has
requests queued, running or routed to it), and less important before more important
(a higher ``priority`` number is less important). Pinned models are never candidates
(admission leaves them out). The policies themselves:

- ``lru``: least recently used first (ModelMesh's choice, by bytes through the budget).
- ``lfu``: fewest requests first, ties by age.
- ``cost``: Greedy-Dual-Size-Frequency (see :class:`CostAwarePolicy`).
- ``gdsf-decay``: GDSF whose frequency is an exponentially decayed request rate, so a
  model that was popular an hour ago does not outrank one popular now.
- ``arrival-cost``: the fewest expected reload seconds saved per MiB (see
  :class:`ArrivalCostPolicy`): request *episodes* (a burst counts once) decayed over
  half an hour, times reload seconds per MiB, times how due the model is by its own
  gap histogram (:mod:`modelyard.manager.gap_histogram`).
- ``belady``: Belady's MIN, the offline optimum for equal sizes: the model used
  furthest in the future leaves first. It needs the future, so only the simulator
  (:mod:`modelyard.simulation`) can run it; it bounds what any online policy can do.

:class:`DemandTracker` keeps the decayed request rate per model that ``gdsf-decay`` and
admission's hot-model rule read (see docs/caching.md).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Protocol

from modelyard.manager.demand import DEFAULT_HALF_LIFE_S as DEFAULT_HALF_LIFE_S  # re-exported
from modelyard.manager.demand import DemandTracker as DemandTracker  # re-exported
from modelyard.manager.gap_histogram import GapHistograms
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.manager.time_of_day import DAY_S, TimeOfDay

POLICY_NAMES = ("lru", "lfu", "cost", "gdsf-decay", "arrival-cost")
"""The policies a server can be configured with (``belady`` needs the future)."""


HOT_FRACTION = 0.1
"""The hot models are the top decile of recent demand ..."""
HOT_BUDGET_SHARE = 0.5
"""... the hottest first, up to half of the device's budget."""


class EvictionPolicy(Protocol):
    """Orders eviction candidates, most evictable first."""

    name: str

    def order(self, candidates: Sequence[ModelRecord]) -> list[ModelRecord]:
        """Candidates sorted so that the first ones leave first."""
        ...

    def on_evict(self, record: ModelRecord) -> None:
        """Told of every eviction (policies with state age themselves here)."""
        ...

    def on_request(self, record: ModelRecord, now: float) -> None:
        """Told of every request (at ``now``, on the manager's clock)."""
        ...

    def on_requests(self, record: ModelRecord, times: Sequence[float]) -> None:
        """Told of consecutive requests for ``record`` at ``times`` (ascending): the
        same as :meth:`on_request` for each, in order (the manager tells in batches)."""
        ...


def _front(record: ModelRecord) -> tuple[bool, int]:
    """The rules every policy applies first: idle before busy, less important first."""
    return (record.pending > 0, -record.config.priority)


class LruPolicy:
    """Least recently used first; idle models before busy ones; less important first."""

    name = "lru"

    def order(self, candidates: Sequence[ModelRecord]) -> list[ModelRecord]:
        """Idle before busy, then lower importance (higher number), then oldest use."""
        return sorted(candidates, key=lambda r: (*_front(r), r.stats.last_used))

    def on_evict(self, record: ModelRecord) -> None:
        """LRU keeps no state."""

    def on_request(self, record: ModelRecord, now: float) -> None:
        """LRU reads ``stats.last_used``, which the manager keeps."""

    def on_requests(self, record: ModelRecord, times: Sequence[float]) -> None:
        """LRU keeps no request state."""


class LfuPolicy:
    """Least frequently used first (all-time request counts), ties by least recent use."""

    name = "lfu"

    def order(self, candidates: Sequence[ModelRecord]) -> list[ModelRecord]:
        """Idle before busy, lower importance first, then fewest requests, then oldest."""
        return sorted(candidates, key=lambda r: (*_front(r), r.stats.requests, r.stats.last_used))

    def on_evict(self, record: ModelRecord) -> None:
        """LFU keeps no state (it reads ``stats.requests``)."""

    def on_request(self, record: ModelRecord, now: float) -> None:
        """The manager counts requests in ``stats.requests``."""

    def on_requests(self, record: ModelRecord, times: Sequence[float]) -> None:
        """LFU keeps no request state."""


# A model never loaded yet is assumed to cost this much to bring back.
_DEFAULT_RELOAD_S = 0.1


def reload_seconds(record: ModelRecord) -> float:
    """What bringing ``record`` back costs: its last load's duration, or a default."""
    return record.timings.total_s or _DEFAULT_RELOAD_S


def _size_mib(record: ModelRecord) -> float:
    return max(record.reserved_bytes, 1) / (1024 * 1024)


class CostAwarePolicy:
    """Greedy-Dual-Size-Frequency: keep what is expensive to reload, popular and small.

    Each model's value is ``H = L + requests * reload_seconds / size``; the lowest value
    leaves first. ``L`` (the inflation) becomes the value of each evicted model, so
    models that stopped being used age out even if they were popular once. Idle before
    busy and priority classes come first, as in :class:`LruPolicy`.
    """

    name = "cost"

    def __init__(self) -> None:
        self.inflation = 0.0
        self._base: dict[object, float] = {}

    def frequency(self, record: ModelRecord) -> float:
        """The frequency term: all-time requests."""
        return float(max(record.stats.requests, 1))

    def value(self, record: ModelRecord) -> float:
        """``H`` of a candidate; its ``L`` is the inflation when it was (re)loaded."""
        base = self._base.setdefault(record.key, self.inflation)
        return base + self.frequency(record) * reload_seconds(record) / _size_mib(record)

    def order(self, candidates: Sequence[ModelRecord]) -> list[ModelRecord]:
        """Idle before busy, lower importance first, then lowest value first."""
        return sorted(candidates, key=lambda r: (*_front(r), self.value(r)))

    def on_evict(self, record: ModelRecord) -> None:
        """Raise the inflation to the victim's value; it starts afresh when reloaded."""
        self.inflation = max(self.inflation, self.value(record))
        self._base.pop(record.key, None)

    def on_request(self, record: ModelRecord, now: float) -> None:
        """GDSF reads ``stats.requests``, which the manager keeps."""

    def on_requests(self, record: ModelRecord, times: Sequence[float]) -> None:
        """GDSF keeps no request state."""


class DecayedGdsfPolicy(CostAwarePolicy):
    """GDSF with a decayed frequency: ``H = L + demand * reload_seconds / size``.

    ``demand`` is the request count with each request's weight halving every
    ``half_life_s``, so yesterday's favourite does not squat in memory. The inflation
    ``L`` works as in GDSF. Requests are counted in :meth:`on_request`.
    """

    name = "gdsf-decay"

    def __init__(self, half_life_s: float = DEFAULT_HALF_LIFE_S) -> None:
        super().__init__()
        self.demand = DemandTracker(half_life_s)
        self.now = 0.0

    def frequency(self, record: ModelRecord) -> float:
        """Recent demand as of the last request seen (at least one request's worth)."""
        return max(self.demand.demand(record.key, self.now), 1.0)

    def on_request(self, record: ModelRecord, now: float) -> None:
        """Count the request and move the policy's notion of now forward."""
        self.now = max(self.now, now)
        self.demand.observe(record.key, now)

    def on_requests(self, record: ModelRecord, times: Sequence[float]) -> None:
        """:meth:`on_request` for each of ``times``, in order."""
        self.now = max(self.now, *times)
        self.demand.observe_run(record.key, times, [1.0] * len(times))


RATE_HALF_LIFE_S = 1800.0
"""``arrival-cost``'s memory: an episode counts half as much after half an hour."""
CORRELATED_S = 1.0
"""Requests closer together than this are one episode (a burst pays one cold start)."""
LOADS_KEPT = 5
"""``arrival-cost`` takes a model's reload time as the fastest of this many last loads."""
MID_EPISODE_S = 0.2
"""A model asked for less than this long ago is inside an episode (a burst, between two
of its requests): ``arrival-cost`` evicts it only after every other idle candidate."""


class ArrivalCostPolicy:
    """Fewest expected reload seconds saved per MiB first:
    ``episodes * reload_seconds / size * urgency``.

    - ``episodes``: requests, each weighted ``min(1, gap / CORRELATED_S)`` by the gap
      since the model's previous request, decayed by half every ``half_life_s``. A burst
      of fifty requests in a second is one cold start, not fifty, so it must not outrank
      a model asked once a minute (the correlated references of LRU-K).
    - ``reload_seconds / size``: what a byte of it saves, as in GDSF, but without GDSF's
      inflation: on stationary traffic the value is then the rate times the cost per
      byte, the greedy knapsack order of what to keep.
    - ``urgency``: :meth:`GapHistograms.urgency` of the gaps between its episodes, given
      how long it has been idle: above 1 when it is due (a timer near its period),
      below 1 when it has been idle for longer than any gap it ever had.
    - ``time of day`` (with ``period_s``): :meth:`TimeOfDay.factor`, how much more than
      its daily average the model is asked for in the coming part of the day, once the
      traffic's daily cycle has repeated (1 otherwise).

    State survives evictions (the rate of a model does not change when it leaves).
    """

    name = "arrival-cost"

    def __init__(
        self,
        half_life_s: float = RATE_HALF_LIFE_S,
        correlated_s: float = CORRELATED_S,
        *,
        prior_gaps: float = 10.0,
        period_s: float | None = DAY_S,
        mid_episode_s: float = MID_EPISODE_S,
    ) -> None:
        self.episodes = DemandTracker(half_life_s)
        self.time_of_day = TimeOfDay(period_s) if period_s else None
        self.gaps = GapHistograms(prior_gaps=prior_gaps)
        self.correlated_s = correlated_s
        self.mid_episode_s = mid_episode_s
        self.now = 0.0
        self._last: dict[ModelKey, float] = {}
        self._loads: dict[ModelKey, tuple[int, list[float]]] = {}
        """Per model: its load count when last seen, and its last loads' durations."""
        self._cost: dict[ModelKey, float] = {}
        """Per model: its reload seconds per MiB when last seen resident."""
        self.prewarm_factor: Callable[[str, float], float] | None = None
        """Its pre-warm window's say on a model's value (:mod:`~modelyard.manager.prewarm`:
        little until the prefetcher loads it back, much while its request is due; set
        by whoever pairs the two)."""

    def value(self, record: ModelRecord) -> float:
        """Expected reload seconds per MiB that keeping ``record`` saves (relative)."""
        key = record.key
        idle = self.now - self._last.get(key, self.now)
        rate = self.episodes.demand(key, self.now)
        cost = self._cost_of(record)
        cycle = self.time_of_day.factor(key, self.now) if self.time_of_day else 1.0
        if self.prewarm_factor is not None:
            cycle *= self.prewarm_factor(key.name, self.now)
        return rate * cost * self.gaps.urgency(key, idle) * cycle

    def _cost_of(self, record: ModelRecord) -> float:
        cost = self.reload_s(record) / _size_mib(record)
        if record.reserved_bytes > 0:
            self._cost[record.key] = cost
        return cost

    def hot_scale(self, key: Hashable, now: float) -> float:
        """What the hot-model rule multiplies a model's recent demand by: its reload
        seconds per MiB (0 until the policy has seen it resident), times the time of
        day's factor. Ranked by demand alone, the hot set (up to half the budget) held
        big models that save fewer seconds per byte than the small ones it left out."""
        cost = self._cost.get(key, 0.0) if isinstance(key, ModelKey) else 0.0
        if cost and self.time_of_day is not None:
            cost *= self.time_of_day.factor(key, now)
        return cost

    def reload_s(self, record: ModelRecord) -> float:
        """The fastest of the model's last :data:`LOADS_KEPT` loads (its last one's
        duration until the policy has seen it load).

        A load's measured duration includes waiting for a core while other loads run;
        eight concurrent loads on two cores make each look four times as expensive, and
        a ranking proportional to it would follow the contention, not the model.
        """
        seen = self._loads.get(record.key)
        n = record.stats.loads
        if record.timings.total_s > 0 and n > 0 and (seen is None or seen[0] != n):
            own = max(record.timings.total_s - record.timings.queue_wait_s, 1e-6)
            kept = [*(seen[1] if seen else ()), own][-LOADS_KEPT:]
            self._loads[record.key] = seen = (n, kept)
        return min(seen[1]) if seen else reload_seconds(record)

    def mid_episode(self, record: ModelRecord) -> bool:
        """Whether ``record`` was asked for less than ``mid_episode_s`` ago (as of the
        last request the policy saw): inside a burst, between two of its requests."""
        last = self._last.get(record.key)
        return last is not None and self.now - last < self.mid_episode_s

    def imminent(self, record: ModelRecord) -> bool:
        """Whether ``record``'s next request is expected any moment: it is inside an
        episode (:meth:`mid_episode`), or its pre-warm window says it is due (it was
        loaded ahead for that request; ``prewarm_factor`` above 1)."""
        if self.mid_episode(record):
            return True
        due = self.prewarm_factor
        return due is not None and due(record.key.name, self.now) > 1.0

    def order(self, candidates: Sequence[ModelRecord]) -> list[ModelRecord]:
        """Idle before busy, lower importance first, models whose next request is
        imminent last (:meth:`imminent`), then lowest value, then oldest use.

        A pre-warmed model due for its request ranks with the models inside an episode,
        by value (its window's factor puts it last of them): ranked before them, it was
        the first idle candidate whenever one had been asked for in the last 0.2 s, and
        on the live pre-warm run a quarter of the pre-warms were evicted before their
        request (session 10; BENCHMARKS.md §17).
        """
        return sorted(
            candidates,
            key=lambda r: (*_front(r), self.imminent(r), self.value(r), r.stats.last_used),
        )

    def on_evict(self, record: ModelRecord) -> None:
        """Nothing to reset: the model's rate and gaps outlive its residency."""
        self._cost_of(record)

    def on_request(self, record: ModelRecord, now: float) -> None:
        """Count the request as (part of) an episode and record the gap it ends."""
        self.on_requests(record, (now,))

    def on_requests(self, record: ModelRecord, times: Sequence[float]) -> None:
        """:meth:`on_request` for each of ``times`` (consecutive requests for ``record``),
        in order: the same counts, gaps and episodes, with one lookup per run."""
        key = record.key
        self.now = max(self.now, *times)
        self._cost_of(record)  # reads the record only: once per run is the same
        last = self._last.get(key)
        correlated = self.correlated_s
        weights = []
        # max(0.0, x) and min(1.0, x) as conditionals (the same values): per request.
        for now in times:
            weight = 1.0
            if last is not None:
                gap = now - last
                if not gap > 0.0:
                    gap = 0.0
                if correlated > 0:
                    weight = gap / correlated
                    if not weight < 1.0:
                        weight = 1.0
                if gap >= correlated:
                    self.gaps.add(key, gap)
            last = now
            weights.append(weight)
        self._last[key] = times[-1]
        self.episodes.observe_run(key, times, weights)
        if self.time_of_day is not None:
            self.time_of_day.observe_run(key, times, weights)


class BeladyPolicy:
    """Belady's MIN: the candidate needed furthest in the future leaves first.

    ``next_use(key)`` is when ``key`` is next requested (``inf``: never again); only a
    simulator replaying a known trace can answer it. Optimal in misses when all models
    are the same size; with sizes and reload costs it is the classic bound, not the
    exact optimum (which is NP-hard), and the benchmarks report it as such.
    """

    name = "belady"

    def __init__(self, next_use: Callable[[ModelKey], float]) -> None:
        self.next_use = next_use

    def order(self, candidates: Sequence[ModelRecord]) -> list[ModelRecord]:
        """Less important first, then furthest next use first (busy ones are used now)."""
        return sorted(
            candidates, key=lambda r: (*_front(r), -self.next_use(r.key), r.stats.last_used)
        )

    def on_evict(self, record: ModelRecord) -> None:
        """Belady keeps no state."""

    def on_request(self, record: ModelRecord, now: float) -> None:
        """Belady reads the future, not the past."""

    def on_requests(self, record: ModelRecord, times: Sequence[float]) -> None:
        """Belady keeps no request state."""


def make_policy(
    name: str, *, half_life_s: float = DEFAULT_HALF_LIFE_S, period_s: float = DAY_S
) -> EvictionPolicy:
    """The policy called ``name`` (one of :data:`POLICY_NAMES`); ``period_s`` is the
    daily cycle ``arrival-cost`` looks for (0: none)."""
    if name == "lru":
        return LruPolicy()
    if name == "lfu":
        return LfuPolicy()
    if name == "cost":
        return CostAwarePolicy()
    if name == "gdsf-decay":
        return DecayedGdsfPolicy(half_life_s)
    if name == "arrival-cost":
        return ArrivalCostPolicy(period_s=period_s or None)
    raise ValueError(f"unknown eviction policy {name!r}")


def top_scale(policy: EvictionPolicy) -> Callable[[Hashable, float], float] | None:
    """What the hottest model's demand is multiplied by for ``policy``: the time of
    day's factor, if it keeps one (not the hot set's cost per MiB; see
    :mod:`~modelyard.manager.hot_set`)."""
    if isinstance(policy, ArrivalCostPolicy) and policy.time_of_day is not None:
        return policy.time_of_day.factor
    return None


def demand_scale(policy: EvictionPolicy) -> Callable[[Hashable, float], float] | None:
    """What the hot-model rule multiplies recent demand by for ``policy``: with
    ``arrival-cost``, :meth:`ArrivalCostPolicy.hot_scale` (reload seconds per MiB, and
    the time of day's factor: at dusk the day's favourites still have the highest
    decayed demand for minutes; ranked as they are, they would hold up to half the
    budget the night's models need, the diurnal trace of issue 16)."""
    if isinstance(policy, ArrivalCostPolicy):
        return policy.hot_scale
    return None


def cap_hot(
    hot: Mapping[Hashable, float], sizes: Mapping[Hashable, int], limit_bytes: int
) -> dict[Hashable, float]:
    """The hottest of ``hot`` whose sizes add up to at most ``limit_bytes`` (the hottest
    one always): a hot set of big models must not leave too little room for the rest,
    or every other load waits on them and the cold ones thrash in what is left."""
    out: dict[Hashable, float] = {}
    total = 0
    for key, demand in sorted(hot.items(), key=lambda kv: kv[1], reverse=True):
        total += sizes.get(key, 0)
        if out and total > limit_bytes:
            break
        out[key] = demand
    return out


def protect_hot(ordered: Iterable[ModelRecord], hot: Mapping[Hashable, float]) -> list[ModelRecord]:
    """``ordered`` with the hot models moved to the end, the least demanded of them first.

    Whatever the policy, a model in the top decile of recent demand (``hot``: model to
    its demand) is the victim only once every colder candidate has gone.
    """
    ordered = list(ordered)
    cold = [r for r in ordered if r.key not in hot]
    warm = sorted((r for r in ordered if r.key in hot), key=lambda r: hot[r.key])
    return cold + warm


def select_victims(
    policy: EvictionPolicy,
    candidates: Sequence[ModelRecord],
    need_bytes: int,
    hot: Mapping[Hashable, float] | None = None,
) -> list[ModelRecord] | None:
    """The shortest prefix of the policy's order that frees ``need_bytes``; None if none does.

    With ``hot``, those models come last whatever the policy says (:func:`protect_hot`).
    """
    if need_bytes <= 0:
        return []
    chosen: list[ModelRecord] = []
    freed = 0
    for record in protect_hot(policy.order(candidates), hot or {}):
        chosen.append(record)
        freed += record.reserved_bytes
        if freed >= need_bytes:
            return chosen
    return None
