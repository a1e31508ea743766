"""The circuit breaker's state machine, on a fake clock."""

from __future__ import annotations

import pytest

from modelyard.scheduling.breaker import BreakerState, CircuitBreaker, Permit
from modelyard.scheduling.config import BreakerConfig

from ._fakes import FakeClock

COOLDOWN_S = 5.0
CONFIG = BreakerConfig(
    window=4, failure_ratio=0.5, min_calls=2, cooldown_s=COOLDOWN_S, half_open_probes=2
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def breaker(clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker(CONFIG, clock)


def state(breaker: CircuitBreaker) -> BreakerState:
    # A function, not the property: mypy would narrow the property across transitions.
    return breaker.state


def admit(breaker: CircuitBreaker) -> Permit:
    permit = breaker.admit()
    assert permit is not None
    return permit


def open_it(breaker: CircuitBreaker) -> None:
    for _ in range(2):
        breaker.record(failed=True, permits=[admit(breaker)])
    assert state(breaker) is BreakerState.OPEN


def test_one_failure_below_min_calls_does_not_open(breaker: CircuitBreaker) -> None:
    breaker.record(failed=True, permits=[admit(breaker)])
    assert state(breaker) is BreakerState.CLOSED  # 1/1 failed, but 1 outcome < min_calls


def test_opens_when_the_sliding_window_reaches_the_ratio(breaker: CircuitBreaker) -> None:
    for failed in (False, False, True, False):
        breaker.record(failed=failed, permits=[admit(breaker)])
    assert state(breaker) is BreakerState.CLOSED  # ok ok FAIL ok: 1/4
    breaker.record(failed=True, permits=[admit(breaker)])
    # The oldest "ok" slid out: ok FAIL ok FAIL is 2/4 >= 0.5.
    assert state(breaker) is BreakerState.OPEN
    assert breaker.snapshot()["times_opened"] == 1


def test_full_cycle_closed_open_half_open_closed(breaker: CircuitBreaker, clock: FakeClock) -> None:
    open_it(breaker)
    assert breaker.admit() is None
    assert breaker.opened_until == pytest.approx(clock.now_s + COOLDOWN_S)
    clock.advance(COOLDOWN_S - 1)
    assert breaker.retry_after_s() == pytest.approx(1.0)
    assert breaker.admit() is None
    clock.advance(1)
    assert state(breaker) is BreakerState.HALF_OPEN
    first, second = admit(breaker), admit(breaker)
    assert first.is_probe
    assert second.is_probe
    assert breaker.admit() is None  # only half_open_probes at once
    breaker.record(failed=False, permits=[first])
    assert state(breaker) is BreakerState.CLOSED
    assert breaker.snapshot()["window_outcomes"] == 0  # a fresh window


def test_failed_probe_reopens_for_another_cooldown(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    open_it(breaker)
    clock.advance(COOLDOWN_S)
    probe = admit(breaker)
    breaker.record(failed=True, permits=[probe])
    assert state(breaker) is BreakerState.OPEN
    assert breaker.opened_until == pytest.approx(clock.now_s + COOLDOWN_S)
    assert breaker.times_opened == 2


def test_released_probe_frees_its_slot(breaker: CircuitBreaker, clock: FakeClock) -> None:
    open_it(breaker)
    clock.advance(COOLDOWN_S)
    probes = [admit(breaker), admit(breaker)]
    assert breaker.admit() is None
    breaker.release(probes[:1])  # e.g. the client left while queued
    assert admit(breaker).is_probe


def test_outcomes_from_an_earlier_generation_are_ignored(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    stale = admit(breaker)  # admitted while closed, still running when it opens
    open_it(breaker)
    clock.advance(COOLDOWN_S)
    assert state(breaker) is BreakerState.HALF_OPEN
    breaker.record(failed=False, permits=[stale])
    assert state(breaker) is BreakerState.HALF_OPEN  # a stale success cannot close it
    assert not breaker.may_run(stale)
    assert breaker.may_run(admit(breaker))


def test_record_one_moves_the_breaker_as_record_does() -> None:
    """The direct path's ``record_one`` and ``record`` of one permit agree in every state."""
    import random

    rng = random.Random(21)
    for _ in range(300):
        clocks = FakeClock(), FakeClock()
        pair = CircuitBreaker(CONFIG, clocks[0]), CircuitBreaker(CONFIG, clocks[1])
        for _ in range(rng.randint(1, 12)):
            step = rng.random()
            if step < 0.2:  # time passes (an open breaker may half-open)
                delta = COOLDOWN_S * rng.uniform(0.0, 1.5)
                for c in clocks:
                    c.advance(delta)
                continue
            permits = [b.admit() for b in pair]
            if permits[0] is None:
                assert permits[1] is None
                continue
            assert permits[1] is not None
            failed = step < 0.6
            pair[0].record(failed=failed, permits=[permits[0]])
            pair[1].record_one(failed=failed, permit=permits[1])
            assert pair[0].snapshot() == pair[1].snapshot()
        stale = Permit(-1, is_probe=True)  # an earlier generation says nothing
        pair[1].record_one(failed=True, permit=stale)
        assert pair[0].snapshot() == pair[1].snapshot()
