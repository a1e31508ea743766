"""ModelManager on fake instances and a fake clock: no process, no runtime, no sleep.

What only the manager decides: one load per version however many callers, refusals
that name what is in the way, eviction order, the failed-load backoff, removal
during a load, runtime pins, and close() leaving no task behind.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import DeviceConfig
from modelyard.errors import MemoryBudgetError, ModelLoadError, ModelNotReadyError
from modelyard.manager.manager import ModelManager
from modelyard.manager.states import ModelState
from tests.fakes.clock import FakeClock
from tests.fakes.instance import FakeInstance
from tests.unit.manager.settings import folder_settings

MIB = 1024 * 1024


class Factory:
    """Makes fake instances reporting each model's declared ``memory_mb``."""

    def __init__(self) -> None:
        self.made: list[tuple[str, FakeInstance]] = []
        self.fail: dict[str, str] = {}
        self.gate: asyncio.Event | None = None

    def __call__(self, config: ModelConfig) -> FakeInstance:
        instance = FakeInstance(
            int((config.memory_mb or 1) * MIB), fail=self.fail.get(config.name), gate=self.gate
        )
        self.made.append((config.name, instance))
        return instance

    def starts(self, name: str) -> int:
        return sum(1 for n, _ in self.made if n == name)


async def started(factory: Factory, count: int) -> FakeInstance:
    """The ``count``-th instance, once its start has begun (the manifest check runs first,
    in a thread, so the instance appears a moment after the load task starts)."""

    async def poll() -> FakeInstance:
        while len(factory.made) < count:
            await asyncio.sleep(0.001)
        instance = factory.made[count - 1][1]
        await instance.entered.wait()
        return instance

    return await asyncio.wait_for(poll(), 5.0)


def make_manager(
    tmp_path: Path, models: dict[str, dict[str, Any]], budget_mb: float = 100
) -> tuple[ModelManager, Factory, FakeClock]:
    settings = folder_settings(
        tmp_path, [DeviceConfig(name="cpu", memory_budget_mb=budget_mb)], models
    )
    factory = Factory()
    clock = FakeClock()
    return ModelManager(settings, factory, clock=clock), factory, clock


async def test_concurrent_callers_share_one_load(tmp_path: Path) -> None:
    manager, factory, _ = make_manager(tmp_path, {"a": {"memory_mb": 10}})
    factory.gate = asyncio.Event()
    record = manager.resolve("a", None)
    waiters = [asyncio.ensure_future(manager.ensure_ready(record, deadline=None)) for _ in range(5)]
    await started(factory, 1)
    factory.gate.set()
    results = await asyncio.gather(*waiters)
    assert all(r is record for r in results)
    assert factory.starts("a") == 1, "five callers, one load"
    assert record.state is ModelState.READY
    assert record.stats.loads == 1
    assert manager.budget.reserved("cpu", record.key) == 10 * MIB
    await manager.close()


async def test_a_load_that_cannot_fit_is_refused_naming_the_pinned_model(
    tmp_path: Path,
) -> None:
    manager, factory, _ = make_manager(
        tmp_path, {"big": {"memory_mb": 80, "pinned": True}, "b": {"memory_mb": 50}}
    )
    await manager.load("big")
    with pytest.raises(MemoryBudgetError) as refused:
        await manager.load("b")
    assert "pinned: big:1" in refused.value.message
    b = manager.resolve("b", None)
    assert b.state is ModelState.FAILED
    assert manager.budget.reserved("cpu", b.key) == 0
    assert manager.resolve("big", None).is_ready, "a pinned model is never evicted"
    assert factory.starts("b") == 0, "refused before any instance started"
    await manager.close()


async def test_the_least_recently_used_model_is_evicted_first(tmp_path: Path) -> None:
    manager, _, clock = make_manager(
        tmp_path, {m: {"memory_mb": 40} for m in ("a", "b", "c")}, budget_mb=100
    )
    a, b, c = (manager.resolve(m, None) for m in ("a", "b", "c"))
    for record in (a, b):
        await manager.ensure_ready(record, deadline=None)
    manager.touch(b)
    clock.advance(1.0)
    manager.touch(a)  # a is now the more recently used
    assert a.stats.last_used == b.stats.last_used + 1.0
    await manager.ensure_ready(c, deadline=None)
    assert b.state is ModelState.UNLOADED
    assert b.stats.evictions == 1
    assert a.is_ready
    assert c.is_ready
    assert a.stats.evictions == 0
    await manager.close()


async def test_a_failed_load_is_retried_only_after_its_backoff(tmp_path: Path) -> None:
    manager, factory, clock = make_manager(tmp_path, {"bad": {"memory_mb": 10}})
    factory.fail["bad"] = "broken weights"
    record = manager.resolve("bad", None)
    with pytest.raises(ModelLoadError, match="broken weights"):
        await manager.ensure_ready(record, deadline=None)
    assert record.state is ModelState.FAILED
    # Within the backoff, requests get the failure and the time to retry: no new load.
    clock.advance(0.5)
    with pytest.raises(ModelLoadError) as waiting:
        await manager.ensure_ready(record, deadline=None)
    assert waiting.value.retry_after_s == pytest.approx(0.5)
    assert factory.starts("bad") == 1
    # Once it has passed, a request loads again (and this time it works).
    clock.advance(0.5)
    del factory.fail["bad"]
    await manager.ensure_ready(record, deadline=None)
    assert factory.starts("bad") == 2
    assert record.is_ready
    assert manager.budget.device("cpu").reserved_bytes == 10 * MIB
    await manager.close()


async def test_an_explicit_load_skips_the_backoff(tmp_path: Path) -> None:
    manager, factory, _ = make_manager(tmp_path, {"bad": {"memory_mb": 10}})
    factory.fail["bad"] = "broken"
    for _ in range(2):
        with pytest.raises(ModelLoadError):
            await manager.load("bad")
    assert factory.starts("bad") == 2, "an operator's load retries at once"
    await manager.close()


async def test_removing_a_version_during_its_load_stops_the_load(tmp_path: Path) -> None:
    manager, factory, _ = make_manager(tmp_path, {"a": {"memory_mb": 10}})
    factory.gate = asyncio.Event()  # the start never finishes on its own
    record = manager.resolve("a", None)
    waiter = asyncio.ensure_future(manager.ensure_ready(record, deadline=None))
    instance = await started(factory, 1)
    assert manager.budget.reserved("cpu", record.key) == 10 * MIB
    await manager.remove_version(record, reason="version folder removed")
    with pytest.raises(ModelNotReadyError, match="was stopped"):
        await waiter
    assert instance.stopped, "the half-started instance was stopped"
    assert manager.budget.device("cpu").reserved_bytes == 0
    assert "1" not in manager.entry("a").versions
    assert record.state is ModelState.UNLOADED
    await manager.close()


async def test_close_cancels_loads_and_unloads_everything(tmp_path: Path) -> None:
    manager, factory, _ = make_manager(tmp_path, {"a": {"memory_mb": 10}, "b": {"memory_mb": 10}})
    a, b = manager.resolve("a", None), manager.resolve("b", None)
    await manager.ensure_ready(a, deadline=None)
    factory.gate = asyncio.Event()
    waiter = asyncio.ensure_future(manager.ensure_ready(b, deadline=None))
    await started(factory, 2)
    await manager.close()
    assert len(manager.tasks) == 0, "no background task outlives close()"
    assert b.load_task is not None
    assert b.load_task.cancelled()
    with pytest.raises(ModelNotReadyError):
        await waiter
    assert all(i.stopped for _, i in factory.made)
    assert a.state is ModelState.UNLOADED
    assert manager.budget.device("cpu").reserved_bytes == 0


async def test_a_crashed_instance_is_restarted(tmp_path: Path) -> None:
    manager, factory, _ = make_manager(tmp_path, {"a": {"memory_mb": 10}})
    record = manager.resolve("a", None)
    await manager.ensure_ready(record, deadline=None)
    _, first = factory.made[0]
    first.crash("segfault")
    assert record.state is ModelState.LOADING
    assert record.stats.restarts == 1

    async def restarted() -> None:
        while not record.is_ready:  # the first restart waits 50 ms
            await asyncio.sleep(0.01)

    await asyncio.wait_for(restarted(), 5.0)
    assert factory.starts("a") == 2
    assert record.instance is not first
    await manager.close()


async def test_a_failed_restart_has_the_devices_read_again(tmp_path: Path) -> None:
    # Ray mode: a restart sent to a node in the moment it died fails before the periodic
    # watcher has seen the loss; the next attempt must know, so the failure asks.
    manager, factory, _ = make_manager(tmp_path, {"a": {"memory_mb": 10}})
    refreshed: list[int] = []

    async def refresh() -> None:
        refreshed.append(len(factory.made))
        factory.fail.pop("a", None)

    manager.on_restart_failed(refresh)
    record = manager.resolve("a", None)
    await manager.ensure_ready(record, deadline=None)
    factory.fail["a"] = "node gone"
    factory.made[0][1].crash("node lost")

    async def restarted() -> None:
        while not record.is_ready:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(restarted(), 5.0)
    assert refreshed == [2], refreshed  # once, after the failed second start
    assert factory.starts("a") == 3
    await manager.close()


async def test_a_runtime_pin_holds_for_versions_found_later(tmp_path: Path) -> None:
    manager, _, _ = make_manager(tmp_path, {"a": {"memory_mb": 10}})
    manager.pin("a")
    assert manager.resolve("a", "1").pinned
    (tmp_path / "a" / "2").mkdir()
    manager.refresh_versions(manager.entry("a"))
    assert manager.resolve("a", "2").pinned, "a refresh keeps the model's pin"
    (tmp_path / "a" / "7").mkdir()
    assert manager.record_for("a", "7").pinned
    manager.pin("a", False)
    assert not any(r.pinned for r in manager.entry("a").versions.values())
    (tmp_path / "a" / "8").mkdir()
    assert not manager.record_for("a", "8").pinned, "an unpin overrides the config too"
    await manager.close()
