"""``load_slots``: at most that many loads run at once; the others wait for a slot, and
the wait is logged as queueing, not as the load's own time (a replay models it itself)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import DeviceConfig, RequestLogConfig, ServerSettings
from modelyard.manager.manager import ModelManager
from modelyard.simulation.traces import read_request_log
from tests.fakes.clock import FakeClock
from tests.fakes.instance import FakeInstance

MIB = 1024 * 1024
NAMES = ("a", "b", "c")


def _manager(tmp_path: Path, slots: int) -> tuple[ModelManager, list[FakeInstance]]:
    for name in NAMES:
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.onnx").write_bytes(b"x" * 4096)
    settings = ServerSettings(
        model_repository=str(tmp_path),
        devices=[DeviceConfig(name="cpu", memory_budget_mb=1000)],
        models=[ModelConfig(name=n, path=n, memory_mb=10) for n in NAMES],
        load_slots=slots,
        request_log=RequestLogConfig(path=str(tmp_path / "log.jsonl")),
    )
    gate = asyncio.Event()
    made: list[FakeInstance] = []

    def factory(config: ModelConfig) -> FakeInstance:
        made.append(FakeInstance(10 * MIB, gate=gate))
        return made[-1]

    return ModelManager(settings, factory, clock=FakeClock()), made


async def _inside_at_once(manager: ModelManager, made: list[FakeInstance]) -> int:
    """Load every model; how many loads were inside their instance at once."""
    records = [manager.resolve(n, None) for n in NAMES]
    loads = [asyncio.ensure_future(manager.ensure_ready(r, deadline=None)) for r in records]
    await asyncio.sleep(0.05)
    inside = sum(i.entered.is_set() for i in made)
    for i in made:
        assert i.gate is not None
        i.gate.set()
    await asyncio.gather(*loads)
    assert all(r.is_ready for r in records)
    await manager.close()
    return inside


async def test_one_load_slot_runs_loads_one_at_a_time_and_the_log_says_so(
    tmp_path: Path,
) -> None:
    manager, made = _manager(tmp_path, 1)
    assert await _inside_at_once(manager, made) == 1, "one slot: one load at a time"
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert rows[0] == {"t": 0.0, "event": "start", "load_slots": 1}
    assert read_request_log(tmp_path / "log.jsonl").load_slots == 1


async def test_without_a_limit_every_admitted_load_starts_at_once(tmp_path: Path) -> None:
    manager, made = _manager(tmp_path, 0)
    assert await _inside_at_once(manager, made) == 3
