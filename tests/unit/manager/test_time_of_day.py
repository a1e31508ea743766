"""Demand by time of day: the factor a daily cycle gives each model, with known answers."""

from __future__ import annotations

import pytest

from modelyard.manager.time_of_day import TimeOfDay

# A 100-s "day" of ten 10-s bins; the window is now's bin and the next (a fifth).


def _day_model(days: int) -> TimeOfDay:
    """``day`` asked for once in each of bins 0-4 (t = 5, 15, ..., 45) of each day."""
    tod = TimeOfDay(100.0, bins=10, ahead=1, prior=1.0)
    for d in range(days):
        for b in range(5):
            tod.observe("day", d * 100.0 + b * 10.0 + 5.0)
    return tod


def test_a_model_used_by_day_is_worth_more_by_day_and_little_at_night() -> None:
    tod = _day_model(2)  # 10 episodes, 2 in each of bins 0-4; first seen at t = 5
    # Two whole days seen by t = 205; the days agree, so the cycle is fully believed.
    assert tod.weight(205.0) == pytest.approx(1.0)
    # Morning (bins 0 and 1): (4 + 1 * 0.2) / (10 + 1) / 0.2.
    assert tod.factor("day", 205.0) == pytest.approx(4.2 / 11 / 0.2)
    # Night (bins 5 and 6): only the prior's share is left.
    assert tod.factor("day", 255.0) == pytest.approx(0.2 / 11 / 0.2)
    # Dusk (bins 4 and 5): one bin of day in the window.
    assert tod.factor("day", 245.0) == pytest.approx(2.2 / 11 / 0.2)


def test_nothing_is_known_before_the_cycle_has_repeated() -> None:
    tod = _day_model(2)
    assert tod.factor("day", 100.0) == 1.0  # one day seen: the weight needs two
    assert tod.weight(150.0) == 0.0
    assert tod.factor("unknown", 255.0) == 1.0


def test_days_that_disagree_are_not_a_cycle() -> None:
    # Asked for in the morning on even days and in the evening on odd ones: the bins
    # differ, but not the same way every day, so no factor is applied.
    tod = TimeOfDay(100.0, bins=10, ahead=1)
    for d in range(4):
        first = 0 if d % 2 == 0 else 5
        for b in range(first, first + 5):
            tod.observe("m", d * 100.0 + b * 10.0 + 5.0)
    assert tod.weight(405.0) == 0.0
    assert tod.factor("m", 405.0) == 1.0
    assert tod.factor("m", 455.0) == 1.0


def _one_day(profiles: dict[str, list[int]]) -> TimeOfDay:
    """One 100-s day from t = 0: ``profiles[m][b]`` episodes of ``m`` spread evenly in
    bin ``b`` (every bin watched for exactly 10 s by t = 100)."""
    tod = TimeOfDay(100.0, bins=10, ahead=1, prior=1.0)
    events = sorted(
        (b * 10.0 + k * 10.0 / n, m)
        for m, per_bin in profiles.items()
        for b, n in enumerate(per_bin)
        for k in range(n)
    )
    for t, m in events:
        tod.observe(m, t)
    return tod


def test_after_one_day_a_spread_beyond_chance_is_believed_before_the_days_compare() -> None:
    # Ten episodes a bin, "day" in bins 0-4 and "night" in 5-9: against an even spread
    # (5 a bin) each model's chi-square is 10 * (5 ** 2 / 5) = 50, with 9 degrees of
    # freedom: weight 1 - 18 / 100 = 0.82 at t = 100, when no bin has been seen on an
    # odd day (the days' agreement could say nothing until t = 160 or so).
    tod = _one_day({"day": [10] * 5 + [0] * 5, "night": [0] * 5 + [10] * 5})
    assert tod.weight(100.0) == pytest.approx(0.82)
    # Morning: 1 + 0.82 * ((20 + 0.2) / 51 / 0.2 - 1), where the weight was 0 before.
    assert tod.factor("day", 100.0) == pytest.approx(1 + 0.82 * (20.2 / 51 / 0.2 - 1))
    assert tod.factor("night", 100.0) < 0.3


def test_an_even_spread_or_a_few_episodes_give_no_weight_after_one_day() -> None:
    # Five episodes in every bin: chance explains all of it (chi-square 0).
    assert _one_day({"flat": [5] * 10}).weight(100.0) == 0.0
    # Nine episodes, all in bin 0: too few to count (MIN_EPISODES), nothing believed.
    assert _one_day({"few": [9] + [0] * 9}).weight(100.0) == 0.0


def test_memory_is_bounded_and_bad_settings_are_refused() -> None:
    tod = TimeOfDay(100.0, max_models=1)
    tod.observe("a", 0.0)
    tod.observe("b", 0.0)
    assert tod.factor("b", 500.0) == 1.0
    tod.forget("a")
    for bins, ahead, prior in ((0, 0, 1.0), (10, 10, 1.0), (10, 1, -1.0)):
        with pytest.raises(ValueError, match="bins"):
            TimeOfDay(100.0, bins=bins, ahead=ahead, prior=prior)
    with pytest.raises(ValueError, match="period_s"):
        TimeOfDay(0.0)


def test_a_run_leaves_what_one_observation_at_a_time_leaves() -> None:
    # Runs inside one bin (the batches of a loop turn) and runs that cross bins, days
    # and parities, with fractional weights: the counts must be equal, not close.
    batched, single = TimeOfDay(100.0, bins=10), TimeOfDay(100.0, bins=10)
    runs = [
        [5.0, 5.001, 5.5, 9.999],
        [10.0, 10.0],
        [19.99, 20.0, 20.01],
        [99.5, 100.0, 150.0, 205.0],
        [399.999999, 400.0],
    ]
    for n, times in enumerate(runs):
        weights = [0.1 * (i + n + 1) for i in range(len(times))]
        batched.observe_run("m", times, weights)
        for at, weight in zip(times, weights, strict=True):
            single.observe("m", at, weight)
    assert batched._counts == single._counts
