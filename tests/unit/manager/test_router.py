"""Router on fake instances and the fake clock: the deadline rule, leases, re-routing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import DeviceConfig, ServerSettings
from modelyard.errors import DeadlineExceededError, ModelNotReadyError
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import ModelRecord
from modelyard.manager.router import ROUTE_ATTEMPTS, Router
from modelyard.runtimes.base import TensorSpec
from modelyard.scheduling import ModelScheduler, SchedulerConfig
from modelyard.workers.instance import InstanceInfo, StartRequest
from tests.fakes.clock import FakeClock
from tests.fakes.instance import FakeInstance

MIB = 1024 * 1024
LOAD_S = 5.0


class SlowInstance(FakeInstance):
    """Takes ``LOAD_S`` seconds of fake time to start."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(10 * MIB)
        self.clock = clock

    async def start(self, request: StartRequest) -> InstanceInfo:
        self.clock.advance(LOAD_S)
        return await super().start(request)


def make_router(tmp_path: Path) -> tuple[Router, ModelManager, FakeClock, list[float]]:
    (tmp_path / "m" / "1").mkdir(parents=True)
    settings = ServerSettings(
        model_repository=str(tmp_path),
        devices=[DeviceConfig(name="cpu", memory_budget_mb=100)],
        models=[ModelConfig(name="m", path="m")],
    )
    clock = FakeClock()

    async def on_ready(record: ModelRecord) -> None:
        instance = record.instance
        assert instance is not None

        async def execute(batch: dict[str, np.ndarray], deadline: float) -> dict[str, np.ndarray]:
            return await instance.infer(batch, deadline - clock.monotonic())

        scheduler = ModelScheduler(str(record.key), SchedulerConfig(), execute, clock)
        await scheduler.start()
        record.scheduler = scheduler

    def on_unloaded(record: ModelRecord) -> None:
        record.scheduler = None

    manager = ModelManager(
        settings,
        lambda config: SlowInstance(clock),
        clock=clock,
        on_ready=on_ready,
        on_unloaded=on_unloaded,
    )
    waits: list[float] = []
    router = Router(manager, on_load_wait=lambda record, s: waits.append(s))
    return router, manager, clock, waits


async def test_a_load_extends_the_deadline_by_its_wait(tmp_path: Path) -> None:
    router, manager, clock, waits = make_router(tmp_path)
    record = router.resolve("m", None)
    started = clock.monotonic()
    async with router.route(record, started=started, timeout_s=1.0) as route:
        assert route.record is record
        assert record.leases == 1, "the request holds a lease while it runs"
        # timeout_ms covers queue and execution; the 5 s load is added on top.
        assert route.deadline == pytest.approx(started + 1.0 + LOAD_S)
    assert record.leases == 0
    assert waits == [pytest.approx(LOAD_S)]
    assert record.stats.requests == 1, "routing notes the request (LRU, prefetch)"
    await manager.close()


async def test_the_clients_deadline_caps_the_extension(tmp_path: Path) -> None:
    router, manager, clock, _ = make_router(tmp_path)
    record = router.resolve("m", None)
    started = clock.monotonic()
    async with router.route(
        record, started=started, timeout_s=1.0, client_timeout_s=LOAD_S + 0.5
    ) as route:
        assert route.deadline == pytest.approx(started + LOAD_S + 0.5)
    await manager.close()


async def test_a_ready_version_is_not_extended(tmp_path: Path) -> None:
    router, manager, clock, waits = make_router(tmp_path)
    record = router.resolve("m", None)
    await manager.ensure_ready(record, deadline=None)
    started = clock.monotonic()
    async with router.route(record, started=started, timeout_s=1.0) as route:
        assert route.deadline == started + 1.0
    assert waits == []
    await manager.close()


async def test_a_draining_version_is_never_handed_out(tmp_path: Path) -> None:
    router, manager, clock, _ = make_router(tmp_path)
    record = router.resolve("m", None)
    await manager.ensure_ready(record, deadline=None)
    assert record.scheduler is not None
    await record.scheduler.drain()  # as an eviction does before it unloads
    with pytest.raises(ModelNotReadyError):
        async with router.route(record, started=clock.monotonic(), timeout_s=1.0):
            pytest.fail(f"routed to a draining version ({ROUTE_ATTEMPTS} attempts)")
    assert record.leases == 0, "the lease is given back on failure too"
    await manager.close()


async def test_an_evicted_version_is_loaded_again_for_the_request(tmp_path: Path) -> None:
    router, manager, clock, waits = make_router(tmp_path)
    record = router.resolve("m", None)
    await manager.ensure_ready(record, deadline=None)
    await manager.evict(record, reason="test")
    async with router.route(record, started=clock.monotonic(), timeout_s=1.0) as route:
        assert route.record.is_ready
        out = await route.scheduler.submit(
            {"x": np.ones((1, 1), np.float32)}, priority=None, deadline=route.deadline
        )
    assert out["x"].tolist() == [[1.0]]
    assert record.stats.loads == 2
    assert len(waits) == 1
    await manager.close()


def _prepare_seeing(record: ModelRecord, seen: list[tuple[int, int]]) -> Any:
    """A ``prepare`` that notes the version's leases while the request is being submitted."""

    def prepare(specs: list[TensorSpec]) -> dict[str, np.ndarray]:
        seen.append((record.leases, record.route_leases))
        return {"x": np.ones((1, 1), np.float32)}

    return prepare


async def test_submit_hot_loads_a_cold_version_then_runs_it(tmp_path: Path) -> None:
    router, manager, clock, waits = make_router(tmp_path)
    record = router.resolve("m", None)
    seen: list[tuple[int, int]] = []
    info, out = await router.submit(
        record, _prepare_seeing(record, seen), None, clock.monotonic(), None
    )
    assert out["x"].tolist() == [[1.0]]
    assert info is record.info
    assert seen == [(1, 1)], "leased while it was submitted"
    assert (record.leases, record.route_leases) == (0, 0), "and released after"
    assert waits == [pytest.approx(LOAD_S)], "the load's wait is reported"
    assert record.stats.requests == 1
    await manager.close()


async def test_submit_on_a_ready_version_leases_and_touches_it_as_route_does(
    tmp_path: Path,
) -> None:
    router, manager, clock, waits = make_router(tmp_path)
    record = router.resolve("m", None)
    await manager.ensure_ready(record, deadline=None)
    seen: list[tuple[int, int]] = []
    for _ in range(3):
        await router.submit(record, _prepare_seeing(record, seen), 2, clock.monotonic(), 5.0)
    assert seen == [(1, 1)] * 3
    assert (record.leases, record.route_leases) == (0, 0)
    assert record.stats.requests == 3, "each request is noted (LRU, learning)"
    assert waits == [], "no load waited for"
    await manager.close()


async def test_submit_refuses_a_client_deadline_already_passed(tmp_path: Path) -> None:
    router, manager, clock, _ = make_router(tmp_path)
    record = router.resolve("m", None)
    await manager.ensure_ready(record, deadline=None)
    started = clock.monotonic()
    clock.advance(2.0)
    with pytest.raises(DeadlineExceededError):
        # The client's 1 s caps the model's timeout_s: the deadline passed before queueing.
        await router.submit(record, _prepare_seeing(record, []), None, started, 1.0)
    assert (record.leases, record.route_leases) == (0, 0), "released on failure too"
    await manager.close()


async def test_submit_to_a_draining_version_is_routed_again_and_refused(tmp_path: Path) -> None:
    router, manager, clock, _ = make_router(tmp_path)
    record = router.resolve("m", None)
    await manager.ensure_ready(record, deadline=None)
    assert record.scheduler is not None
    await record.scheduler.drain()
    with pytest.raises(ModelNotReadyError):
        await router.submit(record, _prepare_seeing(record, []), None, clock.monotonic(), None)
    assert record.leases == 0
    await manager.close()
