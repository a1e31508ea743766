"""The Markov predictor behind predictive preloading."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import PrefetchConfig
from modelyard.errors import ModelNotFoundError
from modelyard.manager.prefetch import ArrivalHistograms, MarkovPredictor, Prefetcher
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.manager.states import ModelState


def test_learns_the_usual_successor() -> None:
    p = MarkovPredictor()
    for _ in range(8):
        p.observe("a")
        p.observe("b")
    p.observe("a")
    p.observe("c")
    pred = p.predict("a")
    assert pred is not None
    assert pred.model == "b"
    assert pred.probability == pytest.approx(8 / 9)
    assert pred.observations == 9


def test_repeats_and_unknown_models_predict_nothing() -> None:
    p = MarkovPredictor()
    for _ in range(5):
        p.observe("a")
    assert p.predict("a") is None
    assert p.predict("zzz") is None


def test_memory_is_bounded() -> None:
    p = MarkovPredictor(max_models=2)
    for m in ["a", "b", "c", "d", "e"]:
        p.observe(m)
    assert p.predict("a") is not None
    assert p.predict("b") is not None
    assert p.predict("c") is None


def _prefetcher(
    free_bytes: int, *, enabled: bool = True, state: ModelState = ModelState.UNLOADED
) -> tuple[Prefetcher, ModelRecord]:
    b = ModelRecord(ModelKey("b", "1"), ModelConfig(name="b", path="b"), Path("b/1"), state=state)

    def resolve(name: str) -> ModelRecord:
        if name != "b":
            raise ModelNotFoundError(f"model {name!r} is not in the repository")
        return b

    config = PrefetchConfig(enabled=enabled, min_probability=0.5, min_observations=2)
    return Prefetcher(config, resolve, lambda r: free_bytes, lambda r: 10), b


def _alternate(prefetcher: Prefetcher, rounds: int) -> None:
    for _ in range(rounds):
        prefetcher.after("a")
        prefetcher.after("b")


def test_the_prefetcher_names_the_likely_next_model_when_it_fits() -> None:
    prefetcher, b = _prefetcher(free_bytes=10)
    _alternate(prefetcher, 3)
    chosen = prefetcher.after("a")
    assert chosen is not None
    assert chosen.load
    assert chosen.victims == []
    target, guess = chosen.target, chosen.guess
    assert target is b
    assert guess.model == "b"
    assert guess.probability == 1.0


@pytest.mark.parametrize(
    ("free_bytes", "enabled", "state"),
    [
        (9, True, ModelState.UNLOADED),  # would need an eviction: never
        (10, False, ModelState.UNLOADED),  # prefetch disabled
        (10, True, ModelState.READY),  # already resident
    ],
)
def test_the_prefetcher_declines(free_bytes: int, enabled: bool, state: ModelState) -> None:
    prefetcher, _ = _prefetcher(free_bytes, enabled=enabled, state=state)
    _alternate(prefetcher, 3)
    decision = prefetcher.after("a")
    assert decision is None or not decision.load


def test_an_unknown_successor_is_not_prefetched() -> None:
    prefetcher, _ = _prefetcher(free_bytes=10)
    for _ in range(3):
        prefetcher.after("a")
        prefetcher.after("gone")
    assert prefetcher.after("a") is None


# ---------------------------------------------------------------- prediction under pressure


def _record(name: str, reload_s: float, state: ModelState = ModelState.UNLOADED) -> ModelRecord:
    r = ModelRecord(ModelKey(name, "1"), ModelConfig(name=name, path=name), Path(name), state=state)
    r.timings.total_s = reload_s
    return r


def _pressured(victim: ModelRecord, target: ModelRecord, *, displace: bool = True) -> Prefetcher:
    """A prefetcher with no free byte, whose only displaceable model is ``victim``."""
    config = PrefetchConfig(min_probability=0.5, min_observations=2, displace=displace)
    return Prefetcher(
        config,
        lambda name: target,
        lambda r: 0,
        lambda r: 10,
        victims=lambda t, missing: [victim],
    )


def test_a_likely_costly_prediction_displaces_a_cold_cheap_model() -> None:
    target = _record("b", reload_s=2.0)
    victim = _record("old", reload_s=0.1, state=ModelState.READY)
    prefetcher = _pressured(victim, target)
    now = 0.0
    for _ in range(3):
        prefetcher.after("a", now)
        prefetcher.after("b", now + 0.5)
        now += 1.0
    decision = prefetcher.after("a", now)
    assert decision is not None
    assert decision.load
    assert decision.victims == [victim]
    # p(b after a) = 1, so the gain is its whole reload less the victim's expected one.
    assert decision.gain == pytest.approx(2.0, abs=0.1)


def test_a_certain_successor_displaces_a_victim_its_own_request_would_evict() -> None:
    # Live pipeline (bench_prefetch_live.py): B always follows A, yet B lost to a victim
    # due back within seconds whose reload was a little dearer, and waited for its own
    # request, whose load then evicted that same victim. With p = 1 the victim leaves
    # either way; only a wrong guess would cost its reload.
    target = _record("b", reload_s=0.1)
    victim = _record("old", reload_s=0.15, state=ModelState.READY)
    prefetcher = _pressured(victim, target)
    now = 0.0
    for _ in range(6):
        prefetcher.after("old", now)  # in use every second: P close to 1
        prefetcher.after("a", now + 0.2)
        prefetcher.after("b", now + 0.4)
        now += 1.0
    prefetcher.after("old", now)
    decision = prefetcher.after("a", now + 0.2)
    assert decision is not None
    assert decision.load
    assert decision.victims == [victim]
    assert decision.gain == pytest.approx(0.1)


def test_a_prediction_worth_less_than_its_victim_only_warms_the_page_cache() -> None:
    target = _record("b", reload_s=0.1)
    victim = _record("old", reload_s=5.0, state=ModelState.READY)
    prefetcher = _pressured(victim, target)
    now = 0.0
    for i in range(3):
        prefetcher.after("old", now)  # the victim is in use every second: P close to 1
        prefetcher.after("a", now + 0.2)
        prefetcher.after("b" if i < 2 else "c", now + 0.4)  # p(b after a) = 2/3
        now += 1.0
    prefetcher.after("old", now)
    decision = prefetcher.after("a", now + 0.2)
    assert decision is not None
    assert not decision.load, "0.07 s expected saving is not worth risking a 5 s reload"
    assert decision.victims == []


def test_without_displacement_a_prediction_that_does_not_fit_is_not_loaded() -> None:
    target = _record("b", reload_s=2.0)
    victim = _record("old", reload_s=0.1, state=ModelState.READY)
    prefetcher = _pressured(victim, target, displace=False)
    for i in range(3):
        prefetcher.after("a", float(i))
        prefetcher.after("b", i + 0.5)
    decision = prefetcher.after("a", 3.0)
    assert decision is not None
    assert not decision.load


def test_arrival_histogram_keep_alive_probability() -> None:
    h = ArrivalHistograms(min_gaps=3)
    for i in range(20):
        h.observe("periodic", 10.0 * i)  # one request every 10 s
    last = 190.0
    # Just after a request the next is due in about 10 s: likely within 15 s, unlikely
    # within 5 s.
    assert h.p_within("periodic", last + 1.0, 15.0) == pytest.approx(1.0)
    assert h.p_within("periodic", last + 1.0, 5.0) == pytest.approx(0.0)
    # Idle far longer than any gap seen: gone cold.
    assert h.p_within("periodic", last + 1000.0, 15.0) == 0.0
    assert h.p_within("never", last, 15.0) == 0.0


def test_arrival_histogram_guesses_from_the_rate_before_it_has_gaps() -> None:
    h = ArrivalHistograms(min_gaps=5)
    h.observe("m", 0.0)
    h.observe("m", 10.0)
    p = h.p_within("m", 10.0, 10.0)
    assert p == pytest.approx(1 - math.exp(-10.0 * 2 / 10.0))


def test_a_cold_requests_own_load_is_counted_in_the_room_a_prediction_needs() -> None:
    # Live, the request's own cold load took the room the prediction's victims freed,
    # and the prefetch was then refused: the victims must cover both.
    target = _record("b", reload_s=2.0)
    asked: list[int] = []

    def victims(t: ModelRecord, missing: int) -> list[ModelRecord]:
        asked.append(missing)
        return [_record("old", reload_s=0.1, state=ModelState.READY)]

    config = PrefetchConfig(min_probability=0.5, min_observations=2)
    prefetcher = Prefetcher(config, lambda name: target, lambda r: 0, lambda r: 10, victims=victims)
    for i in range(3):
        prefetcher.after("a", float(i))
        prefetcher.after("b", i + 0.5)
    assert prefetcher.after("a", 3.0, also_needed=25) is not None
    assert 35 in asked


def test_victims_a_cold_requests_own_load_needs_are_not_charged_to_the_prediction() -> None:
    # Live (sequence trace), the request for A was cold: its own load needs room, and
    # the victims covering it leave whether or not B is prefetched. Charging them to
    # the prediction made B lose against two victims and stay unloaded until asked.
    target = _record("b", reload_s=1.0)
    first = _record("first", reload_s=3.0, state=ModelState.READY)
    second = _record("second", reload_s=0.2, state=ModelState.READY)

    def victims(t: ModelRecord, missing: int) -> list[ModelRecord]:
        # The policy's order: each victim frees 10 bytes.
        return [first, second][: -(-missing // 10)]

    config = PrefetchConfig(min_probability=0.5, min_observations=2)
    prefetcher = Prefetcher(config, lambda name: target, lambda r: 0, lambda r: 10, victims=victims)
    now = 0.0
    for i in range(8):  # both victims come back within the horizon
        for name in ("first", "second", "a", "b" if i % 4 else "c"):  # p(b after a) = 3/4
            prefetcher.after(name, now)
            now += 0.1
    decision = prefetcher.after("a", now, also_needed=10)
    assert decision is not None
    assert decision.load, "only the second victim is the prediction's doing"
    assert decision.victims == [first, second]
    # 3/4 of b's reload saved, against second's reload if the guess is wrong (1/4).
    assert decision.gain == pytest.approx(0.75 * 1.0 - 0.25 * 0.2, abs=0.01)


def test_a_victim_asked_for_only_after_the_caches_turnover_costs_nothing() -> None:
    # The victim comes back every second, but idle models last 0.1 s in this cache: it
    # would be evicted before its next use anyway, so displacing it is worth the gain.
    target = _record("b", reload_s=0.1)
    victim = _record("old", reload_s=5.0, state=ModelState.READY)
    prefetcher = _pressured(victim, target)
    now = 0.0
    for _ in range(6):  # enough gaps for its histogram
        prefetcher.after("old", now)
        prefetcher.after("a", now + 0.2)
        prefetcher.after("b", now + 0.4)
        now += 1.0
    prefetcher.after("old", now)
    decision = prefetcher.after("a", now + 0.2, turnover_s=lambda: 0.1)
    assert decision is not None
    assert decision.load
    assert decision.victims == [victim]


# ---------------------------------------------------------------- learning from sole successors


def _pipelines(rounds: int, n: int = 6) -> list[str]:
    """``rounds`` passes over ``n`` pipelines a_i -> b_i -> c_i, in order."""
    return [f"{s}{i}" for _ in range(rounds) for i in range(n) for s in "abc"]


def _free_prefetcher(config: PrefetchConfig) -> Prefetcher:
    """Room for anything: every model resolves to a fresh unloaded record of 10 bytes."""
    records: dict[str, ModelRecord] = {}

    def resolve(name: str) -> ModelRecord:
        return records.setdefault(name, _record(name, reload_s=1.0))

    return Prefetcher(config, resolve, lambda r: 1000, lambda r: 10)


def test_a_sole_successor_is_trusted_after_two_sightings_on_a_stream_of_pipelines() -> None:
    p = MarkovPredictor()
    for m in _pipelines(1):
        p.observe(m)
    first = p.predict("a0")
    assert first is not None
    assert (first.model, first.observations, first.sole) == ("b0", 1, False)  # no record yet
    for m in _pipelines(1):
        p.observe(m)
    # The second pass tested 17 sole successors (every transition but c5 -> a0's first):
    # all were right.
    assert p.sole_reliable()
    second = p.predict("a0")
    assert second is not None
    assert (second.model, second.probability, second.observations, second.sole) == (
        "b0",
        1.0,
        2,
        True,
    )
    # So a prefetcher acts on it at the second sighting, not the tenth.
    prefetcher = _free_prefetcher(PrefetchConfig(min_observations=10, sole_observations=2))
    fired = [(m, d.target.key.name) for m in _pipelines(2) if (d := prefetcher.after(m))]
    assert fired == []  # the record is built during the second pass
    decision = prefetcher.after("a0")
    assert decision is not None
    assert decision.target.key.name == "b0"
    assert decision.load


def test_sole_successors_are_not_trusted_on_independent_requests() -> None:
    rng = random.Random(0)
    names = [f"m{i}" for i in range(20)]
    weights = [1 / (i + 1) ** 1.1 for i in range(20)]
    stream = rng.choices(names, weights, k=2000)
    fired = []
    for sole in (1, 10):  # the rule at its most eager, and off
        prefetcher = _free_prefetcher(PrefetchConfig(min_observations=10, sole_observations=sole))
        fired.append([(i, d.guess) for i, m in enumerate(stream) if (d := prefetcher.after(m))])
        assert not prefetcher.predictor.sole_reliable()
    # One prediction qualifies by itself (0.6 of 10 sightings); the rule adds none.
    assert len(fired[0]) == 1
    assert fired[0] == fired[1]


def test_sole_reliable_needs_enough_trials_and_the_threshold_of_them_right() -> None:
    p = MarkovPredictor()
    for m in "ab" * 6:  # from the third request on, each tests a sole successor: 9 right
        p.observe(m)
    assert not p.sole_reliable(0.8)  # right every time, but fewer than 10 trials
    steps = [
        ("a", True),  # b -> a: 10 of 10 right
        ("c", True),  # a's sole successor was b: 10 of 11
        ("b", True),  # c had no successor yet: no trial
        ("c", True),  # b's sole successor was a: 10 of 12 = 0.83
        ("d", False),  # c's sole successor was b: 10 of 13 = 0.77 < 0.8
    ]
    for model, reliable in steps:
        p.observe(model)
        assert p.sole_reliable(0.8) is reliable, model
    assert p.sole_reliable(0.75)
    # A prefetcher holds its chain to its own min_probability.
    config = PrefetchConfig(min_probability=0.75)
    prefetcher = Prefetcher(config, lambda n: _record(n, 1.0), lambda r: 0, lambda r: 0, p)
    assert prefetcher.predictor.sole_threshold == 0.75
