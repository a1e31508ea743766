"""AliasRoute.pick: a weighted split sends each version its share of the traffic."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from modelyard.manager.records import AliasRoute


def test_one_target_is_always_picked() -> None:
    route = AliasRoute((("7", 0.5),))
    rng = random.Random(1)
    assert {route.pick(rng) for _ in range(100)} == {"7"}


@pytest.mark.parametrize(
    "targets",
    [(("1", 3.0), ("2", 1.0)), (("1", 0.1), ("2", 0.1), ("3", 0.3)), (("a", 90.0), ("b", 10.0))],
)
def test_each_version_gets_its_weighted_share(targets: tuple[tuple[str, float], ...]) -> None:
    route = AliasRoute(targets)
    rng = random.Random(42)
    n = 20_000
    counts = Counter(route.pick(rng) for _ in range(n))
    total = sum(w for _, w in targets)
    assert set(counts) == {v for v, _ in targets}
    for version, weight in targets:
        assert counts[version] / n == pytest.approx(weight / total, abs=0.02)
