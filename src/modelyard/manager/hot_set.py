"""The hot set's hottest model: always in it, and evicted last of all.

Admission's hot rule keeps the top decile of recent demand out of the victims while
colder models can make room (``docs/caching.md``). Two refinements for the single
hottest model, from issue 16's fifty-model run (Zipf 1.1, eight users, a fifth of the
memory, the four hot models over one 64 MiB file):

- with ``arrival-cost`` the hot set ranks demand times reload seconds per MiB, which
  drops the hottest model (its file makes it cheap per MiB) from the set: it is put
  back, first (:func:`with_hottest`);
- when even the hot ones must go, the hottest is taken only if waiting for the others
  (busy, loading, or hot but less so) could not make the room
  (:func:`wait_to_spare_hottest`): it had been evicted to free its private 6 MiB while
  colder loads were milliseconds from READY, and reloaded 3-5 times in 3,000 requests.

And one for any model: a model just loaded for requests that wait for it is not taken
back by a load that has run out of patience before those requests have run
(:func:`just_loaded`). With ``arrival-cost``, the second-hottest model (out of the hot
set by its rank per MiB, busy, so only an impatient load takes it) was evicted again as
it came READY, before its waiters were routed, until they ran out of route attempts.
Nor by any load, patient or not, while those requests have not woken up to be routed
(:func:`awaited`): a load that waits for room wakes up when a load finishes, before the
requests that waited for that load do, and a patient one that had to take hot models
took the just-loaded one first (session 10: still 1-4 times a run after
:func:`just_loaded`; a run of such turns on one model fails its requests).

Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping

from modelyard.manager.budget import MemoryBudget, SharedFile
from modelyard.manager.demand import DemandTracker
from modelyard.manager.eviction import HOT_BUDGET_SHARE, cap_hot
from modelyard.manager.records import Holder, ModelRecord
from modelyard.manager.states import ModelState

__all__ = [
    "awaited",
    "hot_set",
    "hottest",
    "just_loaded",
    "wait_to_spare_hottest",
    "with_hottest",
]


def hot_set(
    demand: DemandTracker,
    fraction: float,
    now: float,
    top_scale: Callable[[Hashable, float], float] | None,
    records: Iterable[ModelRecord],
    budget: MemoryBudget,
) -> dict[Hashable, float]:
    """The top ``fraction`` of recent demand with the hottest model first
    (:func:`with_hottest`), capped at :data:`HOT_BUDGET_SHARE` of the smallest budget of
    their devices (the hottest always in)."""
    hot = demand.hot(now, fraction)
    if not hot:
        return hot
    hot = with_hottest(hot, demand, now, top_scale)
    sizes: dict[Hashable, int] = {}
    budgets: list[int] = []
    for r in records:
        if r.key in hot:
            sizes[r.key] = r.reserved_bytes or r.measured_bytes or 0
            # Not yet placed on a cluster, a record names no device of the budget.
            if (dev := budget.devices.get(r.device)) is not None:
                budgets.append(dev.budget_bytes)
    return cap_hot(hot, sizes, int(min(budgets, default=0) * HOT_BUDGET_SHARE))


def with_hottest(
    hot: Mapping[Hashable, float],
    demand: DemandTracker,
    now: float,
    scale: Callable[[Hashable, float], float] | None,
) -> dict[Hashable, float]:
    """``hot`` with the model of most recent demand (times ``scale``, the time of day's
    factor if any) ranked first, added if the hot set's own ranking left it out."""
    out = dict(hot)
    if not out:
        return out
    top = demand.top(now, scale)
    first = max(out.values())
    if top is not None and out.get(top, -1.0) < first:
        out[top] = 2 * first
    return out


def hottest(hot: Mapping[Hashable, float]) -> Hashable | None:
    """The first of the hot set (None if it is empty)."""
    return max(hot, key=hot.__getitem__) if hot else None


def wait_to_spare_hottest(
    budget: MemoryBudget,
    holders: Callable[[ModelRecord], Iterable[Holder]],
    victims: Iterable[ModelRecord],
    hot: Mapping[Hashable, float],
    others: Iterable[ModelRecord],
    device: str,
    leaving: list[Holder],
    files: list[SharedFile],
    missing: int,
) -> bool:
    """Whether a load should wait rather than evict the hottest model among ``victims``:
    yes while ``others`` (busy, loading, or less hot; ``holders`` of each on ``device``)
    could make the ``missing`` room, with ``leaving``, once their requests or loads
    finish (``files``: what the load maps, kept)."""
    top = hottest(hot)
    if top is None or not any(v.key == top for v in victims):
        return False
    rest = [k for r in others if r.key != top for k in holders(r)]
    return budget.freed_by(device, leaving + rest, files) >= missing


def just_loaded(
    records: Iterable[ModelRecord], device: str, now: float, grace_s: float
) -> dict[Hashable, float]:
    """Models on ``device`` READY for less than ``grace_s`` with requests waiting for
    them, each at -1 (ranked before any hot model's demand, after every colder model)."""
    return {
        r.key: -1.0
        for r in records
        if r.device == device
        and r.state is ModelState.READY
        and now - r.state_since < grace_s
        and r.pending > 0
    }


def awaited(records: Iterable[ModelRecord], device: str) -> set[Hashable]:
    """Models on ``device`` READY with requests still waiting to wake from their load:
    never victims until those requests are routed (a few event-loop turns), after which
    they are busy and drain them before they leave."""
    return {
        r.key
        for r in records
        if r.device == device and r.state is ModelState.READY and r.requests_awaiting_load > 0
    }
