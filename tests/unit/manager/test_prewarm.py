"""Pre-warm windows from per-model idle times, and the prefetcher acting on them."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import DeviceConfig, PrefetchConfig, ServerSettings
from modelyard.errors import ModelNotFoundError
from modelyard.manager.eviction import ArrivalCostPolicy, reload_seconds
from modelyard.manager.manager import ModelManager
from modelyard.manager.prefetch import PREWARM_LOAD_FACTOR, PREWARM_MARGIN_S, Prefetcher
from modelyard.manager.prewarm import HEAD, TAIL, PrewarmWindows
from modelyard.manager.records import ModelKey, ModelRecord
from tests.fakes.clock import FakeClock
from tests.fakes.instance import FakeInstance
from tests.unit.manager.settings import folder_settings

MIB = 1024 * 1024


def _observe(windows: PrewarmWindows, model: str, times: list[float], lead_s: float) -> None:
    for t in times:
        windows.observe(model, t, lead_s)


def test_a_timers_window_opens_at_its_shortest_gap_and_is_due_lead_seconds_before() -> None:
    w = PrewarmWindows()
    # Gaps of 98-102 s: the window after the request at 500 is 598 to 602.
    _observe(w, "t", [0.0, 100.0, 198.0, 300.0, 399.0, 500.0], lead_s=3.0)
    window = w.window("t")
    assert window is not None
    assert (window.opens, window.closes) == (598.0, 602.0)
    assert window.probability == pytest.approx(5 / 6)
    assert w.due(594.9) == []
    assert [d.model for d in w.due(595.0)] == ["t"]
    assert [d.model for d in w.due(601.0)] == ["t"], "due until asked for or closed"
    w.observe("t", 601.0, 3.0)
    assert w.due(601.0) == [], "asked for: the window is over"


def _reference_window(gaps: list[float], last: float, spread: float) -> tuple[float, ...] | None:
    # The windows' definition, written out: percentiles of the sorted gaps, and the share
    # of gaps between them over one more than seen.
    ordered = sorted(gaps)
    n = len(ordered)
    head = ordered[int(HEAD * (n - 1))]
    tail = ordered[min(n - 1, round(TAIL * (n - 1)))]
    if head <= 0 or tail > spread * head:
        return None
    inside = sum(1 for g in ordered if head <= g <= tail)
    return (last + head, last + tail, inside / (n + 1), n)


@pytest.mark.parametrize("keep", [5, 16, 20, 21, 40])
def test_windows_match_their_definition_with_few_gaps_kept_or_many(keep: int) -> None:
    # Up to 20 gaps the percentiles are the extremes (min and max, no sort); past that
    # the gaps are sorted. Either way the window is the definition's, request by request.
    rng = random.Random(keep)
    w = PrewarmWindows(keep=keep, min_gaps=min(5, keep), spread=1.5)
    gaps: list[float] = []
    now = 0.0
    w.observe("t", now)
    outcomes = set()
    for i in range(300):
        gap = rng.choice([60.0, 61.0, 59.5]) if i % 50 < 40 else rng.uniform(1.0, 200.0)
        before, now = now, now + gap
        gaps = [*gaps, now - before][-keep:]  # the gap as the windows see it
        w.observe("t", now)
        got = w.window("t")
        want = _reference_window(gaps, now, 1.5) if len(gaps) >= min(5, keep) else None
        assert (got and (got.opens, got.closes, got.probability, got.gaps)) == want
        outcomes.add(want is None)
    assert outcomes == {True, False}, "both agreeing and disagreeing gaps were seen"


def test_a_window_is_dropped_once_it_closes_without_the_request() -> None:
    w = PrewarmWindows()
    _observe(w, "t", [0.0, 10.0, 20.0, 30.0, 40.0, 50.0], lead_s=1.0)
    assert [d.model for d in w.due(59.5)] == ["t"]
    assert w.due(60.5) == []


def test_gaps_that_disagree_open_no_window() -> None:
    w = PrewarmWindows()
    # Memoryless-looking gaps (1, 7, 3, 20, 2 s): nothing can be said about the next one.
    _observe(w, "r", [0.0, 1.0, 8.0, 11.0, 31.0, 33.0], lead_s=1.0)
    assert w.window("r") is None
    assert w.due(1_000.0) == []
    assert not w.ahead("r", 34.0)


def test_too_few_gaps_open_no_window() -> None:
    w = PrewarmWindows()
    _observe(w, "t", [0.0, 10.0, 20.0, 30.0, 40.0], lead_s=1.0)  # four gaps; five needed
    assert w.window("t") is None


def test_a_timer_is_ahead_of_its_prewarm_until_its_prewarm_time() -> None:
    w = PrewarmWindows()
    _observe(w, "t", [0.0, 10.0, 20.0, 30.0, 40.0, 50.0], lead_s=2.0)
    assert w.ahead("t", 51.0)
    assert w.ahead("t", 57.9)
    assert not w.ahead("t", 58.0), "from its pre-warm time on, evicting it costs a load"
    assert not w.ahead("unknown", 51.0)


def _prefetcher(free: int) -> tuple[Prefetcher, ModelRecord]:
    t = ModelRecord(ModelKey("t", "1"), ModelConfig(name="t", path="t"), Path("t/1"))
    t.timings.total_s = 0.5

    def resolve(name: str) -> ModelRecord:
        if name != "t":
            raise ModelNotFoundError(f"model {name!r} is not in the repository")
        return t

    return Prefetcher(PrefetchConfig(), resolve, lambda r: free, lambda r: 10), t


def test_the_prefetcher_loads_a_timer_just_before_its_window() -> None:
    prefetcher, t = _prefetcher(free=100)
    for k in range(6):
        assert prefetcher.after("t", 60.0 * k) is None
    # Lead: twice its 0.5 s load plus a quarter of a second, so due from 358.75 s
    # (window at 360). Not earlier: every second it is loaded ahead, loads on demand
    # may evict it before its request (a 1-s margin wasted a quarter of the live
    # pre-warms, session 10).
    due = 358.75
    assert prefetcher.after("other", due - 0.05) is None
    decision = prefetcher.after("other", due)
    assert decision is not None
    assert decision.load
    assert decision.target is t
    assert decision.guess.prewarm
    assert decision.guess.probability == pytest.approx(5 / 6)
    assert prefetcher.after("other", due + 0.5) is None, "acted on once per window"


def test_without_prewarm_a_timer_is_not_loaded_ahead() -> None:
    t = ModelRecord(ModelKey("t", "1"), ModelConfig(name="t", path="t"), Path("t/1"))
    prefetcher = Prefetcher(PrefetchConfig(prewarm=False), lambda n: t, lambda r: 100, lambda r: 10)
    for k in range(6):
        prefetcher.after("t", 60.0 * k)
    assert prefetcher.after("other", 359.0) is None


def test_arrival_cost_evicts_a_model_that_will_be_prewarmed_first() -> None:
    policy = ArrivalCostPolicy(period_s=None)
    timer, steady = (
        ModelRecord(ModelKey(n, "1"), ModelConfig(name=n, path=n), Path(n)) for n in ("t", "s")
    )
    for r in (timer, steady):
        r.timings.total_s = 0.5
    # The timer is asked for every 60 s, the steady model every 120 s: the timer is
    # worth more, until the prefetcher says it will load it back before its next call.
    for k in range(7):
        policy.on_request(timer, 60.0 * k)
        if k % 2 == 0:
            policy.on_request(steady, 60.0 * k)
    assert policy.order([timer, steady]) == [steady, timer]
    prefetcher, _ = _prefetcher(free=0)
    for k in range(7):
        prefetcher.after("t", 60.0 * k)
    prefetcher.pair(policy)
    assert policy.order([timer, steady]) == [timer, steady]


def test_a_prewarmed_model_due_for_its_request_outlasts_one_just_asked_for() -> None:
    # Session 10, the live pre-warm run: the model just asked for (inside an episode for
    # 0.2 s) was ranked after every other idle model, the pre-warmed one included, so a
    # demand load evicted the pre-warmed model a moment before its request came.
    policy = ArrivalCostPolicy(period_s=None)
    prefetcher, timer = _prefetcher(free=0)
    other = ModelRecord(ModelKey("o", "1"), ModelConfig(name="o", path="o"), Path("o/1"))
    other.timings.total_s = 0.5
    for k in range(7):  # a timer every 60 s: its window opens at 420 s
        policy.on_request(timer, 60.0 * k)
        prefetcher.after("t", 60.0 * k)
    prefetcher.pair(policy)
    due = 420.0 - (PREWARM_LOAD_FACTOR * 0.5 + PREWARM_MARGIN_S)
    policy.on_request(other, due + 0.1)  # asked for once, just now: inside an episode
    assert policy.mid_episode(other)
    assert not policy.mid_episode(timer)
    assert policy.imminent(timer), "its pre-warm window says its request is due"
    assert policy.order([timer, other]) == [other, timer]


async def test_the_manager_prewarms_a_timer_and_counts_the_hit(tmp_path: Path) -> None:
    settings = folder_settings(
        tmp_path,
        [DeviceConfig(name="cpu", memory_budget_mb=100)],
        {n: {"memory_mb": 40} for n in ("a", "b")},
        weights_bytes=4096,
        eviction_policy="arrival-cost",
    )
    clock = FakeClock()
    manager = ModelManager(settings, lambda config: FakeInstance(40 * MIB), clock=clock)
    a, b = (manager.resolve(n, None) for n in ("a", "b"))
    policy = manager.admission.policy
    assert isinstance(policy, ArrivalCostPolicy)
    assert policy.prewarm_factor is not None
    await manager.ensure_ready(a, deadline=None)
    for _ in range(6):  # a timer: every 10 s
        manager.touch(a)
        clock.advance(10)
    clock.advance(-10)  # the sixth call was at 50 s; the window opens at 60 s
    await manager.evict(a, reason="test")
    # Due from 59.55 s: the margin plus twice its load (0.1 s, the default) before 60 s.
    lead_s = PREWARM_LOAD_FACTOR * reload_seconds(a) + PREWARM_MARGIN_S
    clock.advance(10 - lead_s - 0.05)
    manager.touch(b)
    manager.learning.flush()  # what the end of the loop's turn does
    assert a.stats.prefetches == 0
    clock.advance(0.1)
    manager.touch(b)
    manager.learning.flush()
    assert a.stats.prefetches == 1
    events = [e for e in manager.events.recent() if e.kind == "prefetch"]
    assert "pre-warm" in events[-1].message
    clock.advance(lead_s - 0.05)
    manager.touch(a)
    assert a.stats.prefetch_hits == 1
    await manager.close()


async def test_a_quiet_server_prewarms_a_timer_on_its_own(tmp_path: Path) -> None:
    (tmp_path / "a" / "1").mkdir(parents=True)
    (tmp_path / "a" / "1" / "model.onnx").write_bytes(b"x" * 4096)
    settings = ServerSettings(
        model_repository=str(tmp_path),
        devices=[DeviceConfig(name="cpu", memory_budget_mb=100)],
        models=[ModelConfig(name="a", path="a", memory_mb=40)],
    )
    clock = FakeClock()
    manager = ModelManager(settings, lambda config: FakeInstance(40 * MIB), clock=clock)
    manager.anticipation.tick_s = 0.01
    await manager.start()
    a = manager.resolve("a", None)
    await manager.ensure_ready(a, deadline=None)
    for k in range(6):  # a timer every 10 s, the only traffic there is
        if k:
            clock.advance(10)
        manager.touch(a)
    await manager.evict(a, reason="test")
    # Due from 59.55 s (see above); nothing else is asked for: the tick alone finds it.
    clock.advance(10 - (PREWARM_LOAD_FACTOR * reload_seconds(a) + PREWARM_MARGIN_S) / 2)
    await _until(lambda: a.is_ready)
    assert a.stats.prefetches == 1
    await manager.close()


async def _until(check: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), 5.0)
