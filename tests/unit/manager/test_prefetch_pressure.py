"""Prediction under pressure, in the manager: a likely model displaces a cold one, or
only its files are warmed; hits, waste and hidden seconds are counted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import DeviceConfig, PrefetchConfig, ServerSettings
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import ModelRecord
from modelyard.manager.states import ModelState
from tests.fakes.clock import FakeClock
from tests.fakes.instance import FakeInstance

MIB = 1024 * 1024


def _manager(
    tmp_path: Path,
    *,
    displace: bool,
    instance: Callable[[ModelConfig], FakeInstance] | None = None,
) -> tuple[ModelManager, FakeClock]:
    for name in ("a", "b", "c"):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.onnx").write_bytes(b"x" * 4096)
    settings = ServerSettings(
        model_repository=str(tmp_path),
        devices=[DeviceConfig(name="cpu", memory_budget_mb=100)],
        models=[ModelConfig(name=n, path=n, memory_mb=40) for n in ("a", "b", "c")],
        prefetch=PrefetchConfig(min_observations=2, min_probability=0.5, displace=displace),
    )
    clock = FakeClock()
    manager = ModelManager(
        settings, instance or (lambda config: FakeInstance(40 * MIB)), clock=clock
    )
    return manager, clock


async def _until(check: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), 5.0)


async def _setup(manager: ModelManager, clock: FakeClock) -> tuple[ModelRecord, ...]:
    a, b, c = (manager.resolve(n, None) for n in ("a", "b", "c"))
    await manager.ensure_ready(c, deadline=None)
    manager.touch(c)  # used once, long ago: cold
    clock.advance(10_000)
    await manager.ensure_ready(a, deadline=None)
    # a then b, twice: the chain a → b is learnt; b is not resident (no room: a + c).
    for _ in range(2):
        manager.touch(a)
        clock.advance(1)
        manager.touch(b)
        clock.advance(1)
    assert not b.is_ready
    return a, b, c


async def test_a_likely_model_displaces_a_cold_one_and_its_use_counts_as_a_hit(
    tmp_path: Path,
) -> None:
    manager, clock = _manager(tmp_path, displace=True)
    a, b, c = await _setup(manager, clock)
    manager.touch(a)  # b is predicted; it only fits if c leaves
    await _until(lambda: b.is_ready)
    assert c.state is ModelState.UNLOADED, "the cold model was displaced"
    assert a.is_ready, "the model in use stays"
    assert b.stats.prefetches == 1
    assert b.stats.cold_starts == 0
    events = [e for e in manager.events.recent() if e.kind == "prefetch"]
    assert "displacing 1" in events[0].message
    clock.advance(2)
    manager.touch(b)
    assert b.stats.prefetch_hits == 1
    assert b.stats.prefetch_hidden_s >= 0
    assert b.prefetched_at is None
    await manager.close()


async def test_a_prefetched_model_evicted_unused_counts_as_wasted(tmp_path: Path) -> None:
    manager, clock = _manager(tmp_path, displace=True)
    a, b, _ = await _setup(manager, clock)
    manager.touch(a)
    await _until(lambda: b.is_ready)
    await manager.evict(b, reason="test")
    assert b.stats.prefetch_wasted == 1
    assert b.stats.prefetch_hits == 0
    await manager.close()


async def test_without_displacement_only_the_files_are_warmed(tmp_path: Path) -> None:
    manager, clock = _manager(tmp_path, displace=False)
    a, b, c = await _setup(manager, clock)
    warms_before = b.stats.page_cache_warms
    manager.touch(a)
    await _until(lambda: b.stats.page_cache_warms > warms_before)
    assert c.is_ready, "nothing was evicted for the prediction"
    assert b.state is ModelState.UNLOADED
    assert b.stats.prefetches == 0
    # Warmed at most once in 30 s however often it is predicted.
    manager.touch(b)
    manager.touch(a)
    assert b.stats.page_cache_warms == warms_before + 1
    await manager.close()


async def test_a_displacing_prefetch_waits_for_its_victim_to_exit(tmp_path: Path) -> None:
    # Live, a displaced worker takes a while to exit; the prefetch's placement refused
    # while the victim's bytes were still reserved, so 17 of 20 displacing prefetches
    # on a pipeline trace were dropped (bench/bench_prefetch_live.py).
    exit_gate = asyncio.Event()

    def instance(config: ModelConfig) -> FakeInstance:
        return FakeInstance(40 * MIB, stop_gate=exit_gate if config.name == "c" else None)

    manager, clock = _manager(tmp_path, displace=True, instance=instance)
    a, b, c = await _setup(manager, clock)
    manager.touch(a)  # b is predicted; it only fits once c has left
    await _until(lambda: c.state is ModelState.UNLOADING)
    await asyncio.sleep(0.05)
    assert b.prefetched_at is not None, "the prefetch waits instead of being dropped"
    assert b.stats.page_cache_warms == 0
    exit_gate.set()
    await _until(lambda: b.is_ready)
    assert c.state is ModelState.UNLOADED
    assert b.stats.prefetches == 1
    manager.touch(b)
    assert b.stats.prefetch_hits == 1
    await manager.close()


async def test_the_model_a_request_is_for_is_never_displaced_by_its_own_prediction(
    tmp_path: Path,
) -> None:
    # The router leases a model only after noting the request (which runs the
    # predictor): the requested model looked idle and could be the victim of the very
    # prefetch its request triggered, then be reloaded for that request.
    manager, clock = _manager(tmp_path, displace=True)
    a, b, c = await _setup(manager, clock)
    for _ in range(3):
        manager.touch(b)  # b hotter than a: a is outside the hot decile
        clock.advance(0.1)
    c.leases = 1  # c busy: a is the only idle model, and b needs one model's room
    manager.touch(a)
    await asyncio.sleep(0.05)
    assert a.is_ready, "the requested model stays"
    assert b.stats.prefetches == 0
    assert b.state is ModelState.UNLOADED
    c.leases = 0
    await manager.close()
