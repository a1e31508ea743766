"""DemandTracker counts requests in batches: every read sees what eager updates give."""

from __future__ import annotations

import math
import random

from modelyard.manager.demand import PENDING_MAX, DemandTracker
from modelyard.manager.records import ModelKey


class EagerDemand:
    """The tracker's arithmetic applied at once on every observation (the reference)."""

    def __init__(self, half_life_s: float) -> None:
        self.rate = math.log(2) / half_life_s
        self.values: dict[str, tuple[float, float]] = {}

    def observe(self, key: str, now: float, weight: float = 1.0) -> None:
        self.values[key] = (self.demand(key, now) + weight, now)

    def demand(self, key: str, now: float) -> float:
        value, since = self.values.get(key, (0.0, now))
        return value * math.exp(-self.rate * max(0.0, now - since))


def test_folded_demand_matches_eager_updates_at_every_read() -> None:
    rng = random.Random(7)
    tracker, eager = DemandTracker(half_life_s=5.0), EagerDemand(5.0)
    keys = [f"m{i}" for i in range(6)]
    now = 0.0
    for _ in range(5000):
        now += rng.expovariate(50.0)
        key = rng.choice(keys)
        action = rng.random()
        if action < 0.9:
            # Clocks may step back a little (another task's now): no decay then.
            at = now - (rng.random() * 0.01 if rng.random() < 0.05 else 0.0)
            weight = rng.choice((1.0, 0.5))
            tracker.observe(key, at, weight)
            eager.observe(key, at, weight)
        elif action < 0.95:
            assert tracker.demand(key, now) == eager.demand(key, now)
        elif action < 0.98:
            hot = tracker.hot(now, fraction=0.5)
            expected: dict[object, float] = {k: eager.demand(k, now) for k in eager.values}
            for k, d in hot.items():
                assert d == expected[k]
        else:
            tracker.forget(key)
            eager.values.pop(key, None)
    for key in keys:
        assert tracker.demand(key, now) == eager.demand(key, now)


def test_observations_waiting_to_be_folded_are_bounded() -> None:
    tracker = DemandTracker(half_life_s=60.0)
    for i in range(10 * PENDING_MAX + 1):
        tracker.observe("m", i * 0.001)
    assert len(tracker._pending) < PENDING_MAX
    assert tracker.demand("m", 10 * PENDING_MAX * 0.001) > 10 * PENDING_MAX * 0.9


def test_forget_drops_what_was_observed_before_it() -> None:
    tracker = DemandTracker(half_life_s=60.0)
    tracker.observe("m", 1.0)
    tracker.forget("m")
    assert tracker.hot(1.0) == {}
    tracker.observe("m", 2.0)
    assert tracker.demand("m", 2.0) == 1.0


def test_runs_of_one_key_fold_like_single_updates() -> None:
    """A busy model's observations come in long runs, folded in locals: each run must
    read what one update per observation gives, also for equal keys that are distinct
    objects (a run ends at a different object; the dict holds them as one key)."""
    rng = random.Random(11)
    tracker, eager = DemandTracker(half_life_s=2.0), EagerDemand(2.0)
    names = ["a", "b", "c"]
    now = 0.0
    for _ in range(300):
        name = rng.choice(names)
        for _ in range(rng.randint(1, 40)):  # a run of one model's requests
            now += rng.expovariate(500.0)
            key = ModelKey(name, "1")  # a new object each time, equal to the others
            weight = rng.choice((1.0, 0.25))
            tracker.observe(key, now, weight)
            eager.observe(name, now, weight)
        if rng.random() < 0.2:
            probe = rng.choice(names)
            assert tracker.demand(ModelKey(probe, "1"), now) == eager.demand(probe, now)
    for name in names:
        assert tracker.demand(ModelKey(name, "1"), now) == eager.demand(name, now)
