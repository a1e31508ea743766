"""An evicted worker that has closed its runtime gives back what it measured freed before
its (slow) exit; a load waiting for that room goes on, the rest stays charged until the
exit (``ReleasesEarly``, ``MemoryBudget.give_back``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import DeviceConfig
from modelyard.manager.budget import MemoryBudget, SharedFile
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import ModelKey
from modelyard.manager.states import ModelState
from modelyard.workers.instance import ReleaseCallback, ReleasesEarly
from tests.fakes.clock import FakeClock
from tests.fakes.instance import FakeInstance
from tests.unit.manager.settings import folder_settings

MIB = 1024 * 1024


class ReleasingInstance(FakeInstance):
    """A worker that, told to stop, closes its runtime (``freed`` bytes back at once),
    then takes until ``stop_gate`` opens to exit."""

    def __init__(self, footprint_bytes: int, *, freed: int, stop_gate: asyncio.Event) -> None:
        super().__init__(footprint_bytes, stop_gate=stop_gate)
        self.freed = freed
        self._on_released: ReleaseCallback | None = None

    def set_release_callback(self, callback: ReleaseCallback) -> None:
        self._on_released = callback

    async def stop(self) -> None:
        callback, self._on_released = self._on_released, None
        if callback is not None:
            await callback(self.freed, True)
        await super().stop()


def _manager(tmp_path: Path, make: Callable[[ModelConfig], FakeInstance]) -> ModelManager:
    settings = folder_settings(
        tmp_path,
        [DeviceConfig(name="cpu", memory_budget_mb=100)],
        {n: {"memory_mb": 60} for n in ("a", "b")},
        weights_bytes=4096,
    )
    return ModelManager(settings, make, clock=FakeClock())


async def _until(check: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), 5.0)


async def test_a_load_goes_on_once_the_evicted_worker_has_released_before_its_exit(
    tmp_path: Path,
) -> None:
    exit_gate = asyncio.Event()
    manager = _manager(
        tmp_path, lambda c: ReleasingInstance(60 * MIB, freed=50 * MIB, stop_gate=exit_gate)
    )
    assert isinstance(ReleasingInstance(1, freed=0, stop_gate=exit_gate), ReleasesEarly)
    a, b = manager.resolve("a", None), manager.resolve("b", None)
    await manager.ensure_ready(a, deadline=None)
    load_b = asyncio.create_task(manager.ensure_ready(b, deadline=None))
    # 10 MiB of a's 60 are left until its exit: b's 60 fit beside them.
    await _until(lambda: b.is_ready)
    assert a.state is ModelState.UNLOADING, "a's worker has not exited yet"
    budget = manager.admission.budget
    assert budget.reserved("cpu", a.key) == 10 * MIB, "what is left stays charged"
    assert budget.device("cpu").reserved_bytes <= 100 * MIB
    exit_gate.set()
    await load_b
    await _until(lambda: a.state is ModelState.UNLOADED)
    assert budget.reserved("cpu", a.key) == 0
    await manager.close()


async def test_a_load_that_needs_more_than_was_released_waits_for_the_exit(
    tmp_path: Path,
) -> None:
    exit_gate = asyncio.Event()
    manager = _manager(
        tmp_path, lambda c: ReleasingInstance(60 * MIB, freed=10 * MIB, stop_gate=exit_gate)
    )
    a, b = manager.resolve("a", None), manager.resolve("b", None)
    await manager.ensure_ready(a, deadline=None)
    load_b = asyncio.create_task(manager.ensure_ready(b, deadline=None))
    await _until(lambda: a.state is ModelState.UNLOADING)
    await asyncio.sleep(0.05)
    # 50 MiB still held by a's worker + 60 for b would pass the 100 MiB budget.
    assert not b.is_ready
    assert manager.admission.budget.reserved("cpu", a.key) == 50 * MIB
    exit_gate.set()
    await asyncio.wait_for(load_b, 5.0)
    assert b.is_ready
    await manager.close()


def test_give_back_lowers_the_private_part_and_drops_files_only_their_last_user_held() -> None:
    budget = MemoryBudget({"cpu": 1000})
    shared, own = SharedFile("s", 1, 1, 300, 0), SharedFile("o", 1, 2, 200, 0)
    a, b = ModelKey("a", "1"), ModelKey("b", "1")
    assert budget.try_reserve("cpu", a, 100, [shared, own])
    assert budget.try_reserve("cpu", b, 50, [shared])
    # a's worker closed its runtime: 70 bytes freed, its files unmapped.
    assert budget.give_back("cpu", a, 70, unmapped=True) == 70 + 200
    assert budget.device("cpu").reservations[a] == 30
    assert budget.files_of("cpu", a) == []
    assert budget.files_of("cpu", b) == [shared], "b still maps the shared file"
    # Never below zero, and files kept when the worker still maps them.
    assert budget.give_back("cpu", b, 500, unmapped=False) == 50
    assert budget.files_of("cpu", b) == [shared]
    assert budget.release("cpu", a) == 30
