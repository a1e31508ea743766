"""The AIMD batch controller."""

from __future__ import annotations

import pytest

from modelyard.scheduling.adaptive import AdaptiveBatchController

SLO_S = 0.1
FAST_S = 0.01


def controller(**overrides: float) -> AdaptiveBatchController:
    kwargs: dict[str, float] = {"slo_s": SLO_S, "max_batch_size": 8}
    kwargs.update(overrides)
    return AdaptiveBatchController(
        slo_s=kwargs["slo_s"],
        max_batch_size=int(kwargs["max_batch_size"]),
        initial_batch_size=int(kwargs.get("initial_batch_size", 1)),
        initial_delay_s=kwargs.get("initial_delay_s", 0.0),
    )


def run_full_batches(c: AdaptiveBatchController, count: int, latency_s: float) -> None:
    for _ in range(count):
        cap = c.batch_size_cap
        c.observe(batch_size=cap, compute_s=latency_s / 2, latencies_s=[latency_s] * cap)


def test_cap_grows_additively_under_the_slo_up_to_max() -> None:
    c = controller()
    run_full_batches(c, 3, FAST_S)
    assert c.batch_size_cap == 4
    run_full_batches(c, 20, FAST_S)
    assert c.batch_size_cap == 8


def test_cap_does_not_grow_when_it_is_not_binding() -> None:
    c = controller(initial_batch_size=4)
    c.observe(batch_size=2, compute_s=FAST_S, latencies_s=[FAST_S, FAST_S])
    assert c.batch_size_cap == 4


def test_cap_and_delay_halve_when_the_batch_itself_misses_the_slo() -> None:
    c = controller(initial_batch_size=8, initial_delay_s=SLO_S / 4)
    c.observe(batch_size=8, compute_s=SLO_S, latencies_s=[SLO_S * 1.3] * 8)
    assert c.batch_size_cap == 4
    assert c.delay_s == pytest.approx(SLO_S / 8)
    assert c.decreases == 1
    # Size 8 was measured too slow, so a fast batch of 4 may not grow towards it.
    run_full_batches(c, 1, FAST_S)
    assert c.batch_size_cap == 4


def test_a_slo_missed_in_the_queue_keeps_batches_growing_and_stops_waiting() -> None:
    c = controller(initial_batch_size=8, initial_delay_s=SLO_S / 4, max_batch_size=16)
    # Queue wait, not compute, pushed the end-to-end latency over the SLO: overload.
    c.observe(batch_size=8, compute_s=FAST_S, latencies_s=[SLO_S * 2] * 8)
    assert c.batch_size_cap == 9, "bigger batches raise throughput; smaller ones would not"
    assert c.delay_s == 0.0
    assert c.decreases == 0
    assert c.overloads == 1


def test_cap_never_below_one() -> None:
    c = controller()
    for _ in range(3):
        c.observe(batch_size=1, compute_s=SLO_S * 2, latencies_s=[SLO_S * 3])
    assert c.batch_size_cap == 1


def test_growth_stops_where_compute_alone_would_miss_the_slo() -> None:
    c = controller(initial_batch_size=4)
    # Size 4 takes 80 ms of compute; size 5 extrapolates to 100 ms: not under the SLO.
    c.observe(batch_size=4, compute_s=0.08, latencies_s=[0.09] * 4)
    assert c.batch_size_cap == 4
    assert c.predicted_compute_s(5) == pytest.approx(0.1)


def test_delay_grows_with_company_within_slo_over_4_and_shrinks_alone() -> None:
    c = controller(initial_batch_size=8)
    for _ in range(50):
        c.observe(batch_size=2, compute_s=FAST_S, latencies_s=[FAST_S, FAST_S])
    assert c.delay_s == pytest.approx(SLO_S / 4)
    c.observe(batch_size=1, compute_s=FAST_S, latencies_s=[FAST_S])
    assert c.delay_s == pytest.approx(SLO_S / 4 - SLO_S / 40)
    for _ in range(50):
        c.observe(batch_size=1, compute_s=FAST_S, latencies_s=[FAST_S])
    assert c.delay_s == 0.0


def test_p99_is_nearest_rank() -> None:
    c = controller(initial_batch_size=8)
    c.observe(batch_size=8, compute_s=FAST_S, latencies_s=[i / 1000 for i in range(1, 101)])
    assert c.p99_s() == pytest.approx(0.099)
