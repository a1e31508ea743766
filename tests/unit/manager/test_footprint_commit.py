"""The footprint committed after READY (``manager/footprints.py``), on fake instances
whose memory reading waits for a gate: the model serves on its reservation before the
reading, the reservation becomes the reading after, grown by evicting a colder model or
refused (the model unloaded and FAILED), and a model whose reading is pending is never
a victim."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import DeviceConfig
from modelyard.errors import ModelLoadError
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import ModelRecord
from modelyard.manager.states import ModelState
from tests.fakes.clock import FakeClock
from tests.fakes.instance import DeferringFakeInstance
from tests.unit.manager.settings import folder_settings

MIB = 1024 * 1024


class Factory:
    """Deferring fakes; each model's reading is ``measured_mb`` and waits for its gate."""

    def __init__(self, measured_mb: dict[str, float]) -> None:
        self.measured_mb = measured_mb
        self.gates: dict[str, asyncio.Event] = {n: asyncio.Event() for n in measured_mb}
        self.made: dict[str, list[DeferringFakeInstance]] = {n: [] for n in measured_mb}

    def __call__(self, config: ModelConfig) -> DeferringFakeInstance:
        nbytes = int(self.measured_mb[config.name] * MIB)
        instance = DeferringFakeInstance(nbytes, measure_gate=self.gates[config.name])
        self.made[config.name].append(instance)
        return instance


def make_manager(
    tmp_path: Path, models: dict[str, dict[str, Any]], measured_mb: dict[str, float], budget: int
) -> tuple[ModelManager, Factory]:
    settings = folder_settings(
        tmp_path, [DeviceConfig(name="cpu", memory_budget_mb=budget)], models
    )
    factory = Factory(measured_mb)
    return ModelManager(settings, factory, clock=FakeClock()), factory


async def until(check: Any, timeout_s: float = 5.0) -> None:
    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), timeout_s)


def committed(record: ModelRecord) -> bool:
    return record.footprint_pending is None


async def test_a_model_serves_on_its_reservation_before_its_footprint_is_measured(
    tmp_path: Path,
) -> None:
    manager, factory = make_manager(tmp_path, {"a": {"memory_mb": 10}}, {"a": 6}, budget=100)
    record = manager.resolve("a", None)
    await manager.ensure_ready(record, deadline=None)
    # READY and answering while the memory reading has not come back.
    instance = factory.made["a"][0]
    assert record.is_ready
    assert record.footprint_pending is instance
    out = await instance.infer({"x": np.ones((1, 1), np.float32)}, timeout_s=1.0)
    assert out["x"].shape == (1, 1)
    await asyncio.wait_for(instance.measuring.wait(), 5.0)
    assert manager.budget.reserved("cpu", record.key) == 10 * MIB, "serves on its estimate"
    assert record.measured_bytes is None
    factory.gates["a"].set()
    await until(lambda: committed(record))
    assert record.measured_bytes == 6 * MIB
    assert manager.budget.reserved("cpu", record.key) == 6 * MIB == record.reserved_bytes
    assert record.info is not None
    assert not record.info.footprint_pending
    await manager.close()


async def test_a_footprint_larger_than_reserved_evicts_a_colder_model(tmp_path: Path) -> None:
    models = {"cold": {"memory_mb": 10}, "a": {"memory_mb": 10}}
    manager, factory = make_manager(tmp_path, models, {"cold": 10, "a": 25}, budget=30)
    cold, a = manager.resolve("cold", None), manager.resolve("a", None)
    factory.gates["cold"].set()
    await manager.ensure_ready(cold, deadline=None)
    await until(lambda: committed(cold))
    await manager.ensure_ready(a, deadline=None)
    assert manager.budget.device("cpu").reserved_bytes == 20 * MIB
    factory.gates["a"].set()
    await until(lambda: committed(a) and cold.state is ModelState.UNLOADED)
    assert cold.stats.evictions == 1
    assert a.is_ready
    assert manager.budget.reserved("cpu", a.key) == 25 * MIB == a.measured_bytes
    assert manager.budget.device("cpu").reserved_bytes == 25 * MIB
    await manager.close()


async def test_a_footprint_that_cannot_fit_unloads_and_fails_the_model(tmp_path: Path) -> None:
    manager, factory = make_manager(tmp_path, {"a": {"memory_mb": 10}}, {"a": 40}, budget=30)
    record = manager.resolve("a", None)
    await manager.ensure_ready(record, deadline=None)
    factory.gates["a"].set()
    await until(lambda: record.state is ModelState.FAILED)
    assert "measured 40.0 MiB" in record.reason, record.reason
    assert "30.0 MiB budget" in record.reason, record.reason
    assert factory.made["a"][0].stopped, "its worker is stopped"
    assert manager.budget.device("cpu").reserved_bytes == 0, "and its bytes given back"
    assert record.footprint_pending is None
    events = [e.kind for e in manager.events.recent() if e.model == "a"]  # newest first
    assert events[:3] == ["load_failed", "unloaded", "loaded"], events
    with pytest.raises(ModelLoadError, match=r"measured 40\.0 MiB"):
        await manager.ensure_ready(record, deadline=None)
    await manager.close()


async def test_a_model_whose_footprint_is_pending_is_no_victim(tmp_path: Path) -> None:
    models = {"a": {"memory_mb": 20}, "b": {"memory_mb": 20}}
    manager, factory = make_manager(tmp_path, models, {"a": 20, "b": 20}, budget=30)
    a, b = manager.resolve("a", None), manager.resolve("b", None)
    await manager.ensure_ready(a, deadline=None)
    factory.gates["b"].set()
    load_b = asyncio.ensure_future(manager.ensure_ready(b, deadline=None))
    await asyncio.sleep(0.1)
    # b needs a's room, but a's commit may be growing its reservation: b waits for it.
    assert a.is_ready
    assert a.stats.evictions == 0
    assert not load_b.done()
    factory.gates["a"].set()
    assert await asyncio.wait_for(load_b, 5.0) is b
    assert a.state is ModelState.UNLOADED
    assert a.stats.evictions == 1
    assert manager.budget.device("cpu").reserved_bytes <= 30 * MIB
    await manager.close()


async def test_two_footprints_that_grow_past_the_budget_together_evict_one_not_fail_it(
    tmp_path: Path,
) -> None:
    """Each fits alone, not both: the second commit finds the first growing too, and the
    model it commits for is evicted, not failed; its next load reserves what was measured."""
    models = {"a": {"memory_mb": 10}, "b": {"memory_mb": 10}}
    manager, factory = make_manager(tmp_path, models, {"a": 25, "b": 25}, budget=30)
    a, b = manager.resolve("a", None), manager.resolve("b", None)
    await manager.ensure_ready(a, deadline=None)
    await manager.ensure_ready(b, deadline=None)
    factory.gates["a"].set()
    factory.gates["b"].set()
    await until(lambda: committed(a) and committed(b) and ModelState.UNLOADED in (a.state, b.state))
    kept, gone = (a, b) if a.is_ready else (b, a)
    assert gone.state is ModelState.UNLOADED, gone.reason
    assert gone.stats.evictions == 1
    assert "does not fit now" in gone.reason, gone.reason
    assert manager.budget.reserved("cpu", kept.key) == 25 * MIB == kept.measured_bytes
    # Loaded again, it reserves its measured 25 MiB first, evicting the other to fit.
    await manager.ensure_ready(gone, deadline=None)
    assert manager.budget.reserved("cpu", gone.key) == 25 * MIB
    await until(lambda: kept.state is ModelState.UNLOADED)
    await manager.close()
