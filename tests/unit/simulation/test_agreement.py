"""The simulator against the live manager on the same traces: they order the policies alike.

"Live" is the fifty-model run on the real manager, router, admission and schedulers
(tests/fakes/cache_run.py: instances sleep their load time, two loads at a time). Each
configuration runs live; its recorded trace is replayed in the simulator with the same
configuration; the orderings by total loads must agree, and the simulator's count must be
within a third of the live one. A real server with ``load_slots: 2`` against
``modelyard plan --load-slots 2``: tests/integration/test_plan_load_slots.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.simulation.engine import simulate
from tests.fakes.cache_run import run

pytestmark = pytest.mark.slow

CONFIGS = {"lru without the hot rule": ("lru", False), "lru": ("lru", True)}


async def test_simulated_and_live_runs_order_the_configurations_alike(tmp_path: Path) -> None:
    live: dict[str, int] = {}
    simulated: dict[str, int] = {}
    for i, (label, (policy, hot)) in enumerate(CONFIGS.items()):
        result = await run(
            tmp_path / str(i), n_requests=1000, policy=policy, protect_hot=hot, time_scale=0.1
        )
        assert result.failures == []
        live[label] = result.total_loads
        # The live run's loads take one of two slots (cache_run's ``cores``), as a
        # server with ``load_slots: 2`` runs them; the replay queues them alike.
        sim = simulate(
            result.as_trace(),
            policy,
            result.budget_bytes,
            hot_fraction=0.1 if hot else 0.0,
            load_slots=2,
        )
        simulated[label] = sim.loads
        assert abs(sim.loads - result.total_loads) <= result.total_loads / 3, (label, sim.loads)
    assert sorted(live, key=live.__getitem__) == sorted(simulated, key=simulated.__getitem__), (
        live,
        simulated,
    )
