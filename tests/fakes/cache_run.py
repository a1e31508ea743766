"""The fifty-model Zipf run on the real manager, router and schedulers, without processes.

What the issue's live run exercises in the manager (concurrent loads reserving memory,
leases, drains, the eviction choice, shared weight files charged once), with instances
that sleep for their load time instead of starting a worker: 8 concurrent users, Zipf
1.1 popularity, 30 models with private weights and 20 mapping five shared files (the
four sharing the largest rank 1, 3, 5 and 7), a budget of a fifth of the total. It
records the request trace it produced, so the simulator can replay the same one.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import DeviceConfig, PrefetchConfig, ServerSettings
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import ModelRecord
from modelyard.manager.router import Router
from modelyard.scheduling import ModelScheduler, SchedulerConfig
from modelyard.simulation.traces import ModelSpec, Request, Trace
from modelyard.workers.instance import InstanceInfo, StartRequest
from tests.fakes.instance import FakeInstance

MIB = 1024 * 1024
SHARED_MB = (64, 4, 6, 8, 10)
LOAD_FIXED_S = 0.020
LOAD_S_PER_MIB = 0.003
SERVICE_S = 0.002


class TimedInstance(FakeInstance):
    """Sleeps its load time on start and ``SERVICE_S`` per call.

    Loads take one of ``slots`` (the host's cores: a real load is CPU work, so eight
    at once on two cores take four times as long each).
    """

    def __init__(self, footprint_bytes: int, load_s: float, slots: asyncio.Semaphore) -> None:
        super().__init__(footprint_bytes)
        self.load_s = load_s
        self.slots = slots

    async def start(self, request: StartRequest) -> InstanceInfo:
        async with self.slots:
            await asyncio.sleep(self.load_s)
        return await super().start(request)

    async def infer(self, inputs: dict[str, np.ndarray], timeout_s: float) -> dict[str, np.ndarray]:
        await asyncio.sleep(SERVICE_S)
        return dict(inputs)


@dataclass
class LiveResult:
    """What one run did."""

    requests: int = 0
    failures: list[str] = field(default_factory=list)
    loads: Counter[str] = field(default_factory=Counter)
    evictions: int = 0
    cold_start_s: float = 0.0
    trace: list[Request] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    """Models by popularity, hottest first."""
    specs: dict[str, ModelSpec] = field(default_factory=dict)
    budget_bytes: int = 0
    wall_s: float = 0.0

    @property
    def total_loads(self) -> int:
        """Loads of every model."""
        return sum(self.loads.values())

    def as_trace(self, name: str = "recorded") -> Trace:
        """The recorded requests with each model's size and load time."""
        return Trace(name, self.trace, self.specs)


def build_models(root: Path) -> tuple[list[ModelConfig], dict[str, ModelSpec], int]:
    """50 model folders: configs, specs for the simulator, and the total footprint.

    A shared model's simulated size is its private part plus a quarter of its file
    (the simulator has no shared ledger; the budget charges the file once per group).
    """
    configs: list[ModelConfig] = []
    specs: dict[str, ModelSpec] = {}
    total = 0.0
    for i, mb in enumerate(np.linspace(1, 8, 30)):
        name = f"p{i:02d}"
        (root / name / "1").mkdir(parents=True)
        size_mb = 1.8 * float(mb) + 6
        configs.append(ModelConfig(name=name, path=name, memory_mb=size_mb))
        load_s = LOAD_FIXED_S + LOAD_S_PER_MIB * size_mb
        specs[name] = ModelSpec(name, int(size_mb * MIB), load_s)
        total += size_mb
    for g, mb in enumerate(SHARED_MB):
        weights = root / "shared-src" / str(g) / "model.onnx.data"
        weights.parent.mkdir(parents=True)
        with weights.open("wb") as f:
            f.truncate(mb * MIB)  # sparse: the budget reads sizes, not pages
        total += mb
        for k in range(4):
            name = f"s{g}{k}"
            version = root / name / "1"
            version.mkdir(parents=True)
            (version / "model.onnx").write_bytes(b"graph")
            os.link(weights, version / "model.onnx.data")
            configs.append(
                ModelConfig(
                    name=name,
                    path=name,
                    runtime="onnx",
                    share_weights=True,
                    memory_mb=mb + 6,
                )
            )
            load_s = LOAD_FIXED_S + LOAD_S_PER_MIB * (mb + 6)
            specs[name] = ModelSpec(name, int((6 + mb / 4) * MIB), load_s)
            total += 6
    return configs, specs, int(total * MIB)


def popularity(names: list[str], seed: int = 7) -> list[str]:
    """Popularity order as in the integration test: the 64 MiB group ranks 1, 3, 5, 7."""
    order = [n for n in names if not n.startswith("s0")]
    random.Random(seed).shuffle(order)
    for rank, name in zip((0, 2, 4, 6), ("s00", "s01", "s02", "s03"), strict=True):
        order.insert(rank, name)
    return order


async def run(
    root: Path,
    *,
    n_requests: int = 5000,
    users: int = 8,
    policy: str = "lru",
    protect_hot: bool = True,
    prefetch: bool = False,
    budget_fraction: float = 0.2,
    s: float = 1.1,
    seed: int = 0,
    cores: int = 2,
    time_scale: float = 1.0,
) -> LiveResult:
    """Run ``n_requests`` from ``users`` concurrent users; return what happened."""
    configs, specs, total = build_models(root)
    budget = int(total * budget_fraction)
    settings = ServerSettings(
        model_repository=str(root),
        devices=[DeviceConfig(name="cpu", memory_budget_mb=budget / MIB)],
        models=configs,
        eviction_policy=policy,
        protect_hot=protect_hot,
        prefetch=PrefetchConfig(enabled=prefetch),
    )
    load_s = {c.name: specs[c.name].load_s * time_scale for c in configs}
    slots = asyncio.Semaphore(cores)

    def factory(config: ModelConfig) -> TimedInstance:
        mb = config.memory_mb or 1.0
        private = 6.0 if config.share_weights else mb
        return TimedInstance(int(private * MIB), load_s[config.name], slots)

    async def on_ready(record: ModelRecord) -> None:
        instance = record.instance
        assert instance is not None

        async def execute(batch: dict[str, np.ndarray], deadline: float) -> dict[str, np.ndarray]:
            return await instance.infer(batch, deadline - time.monotonic())

        scheduler = ModelScheduler(str(record.key), SchedulerConfig(), execute)
        await scheduler.start()
        record.scheduler = scheduler

    closing: set[asyncio.Task[None]] = set()

    def on_unloaded(record: ModelRecord) -> None:
        scheduler, record.scheduler = record.scheduler, None
        if scheduler is not None:
            task = asyncio.ensure_future(scheduler.close())
            closing.add(task)
            task.add_done_callback(closing.discard)

    manager = ModelManager(settings, factory, on_ready=on_ready, on_unloaded=on_unloaded)
    router = Router(manager)
    order = popularity([c.name for c in configs])
    weights = [1.0 / (i + 1) ** s for i in range(len(order))]
    result = LiveResult(order=order, specs=specs, budget_bytes=budget)
    remaining = n_requests
    t0 = time.monotonic()
    body: dict[str, Any] = {"x": np.ones((1, 1), np.float32)}

    async def user(k: int) -> None:
        nonlocal remaining
        pick = random.Random(seed * 1000 + k)
        while remaining > 0:
            remaining -= 1
            name = pick.choices(order, weights)[0]
            record = router.resolve(name, None)
            started = time.monotonic()
            result.trace.append(Request(started - t0, name))
            try:
                async with router.route(record, started=started, timeout_s=30.0) as route:
                    await route.scheduler.submit(body, priority=None, deadline=route.deadline)
            except Exception as exc:
                result.failures.append(f"{name}: {type(exc).__name__}: {exc}")
            result.requests += 1

    try:
        await asyncio.gather(*(user(k) for k in range(users)))
    finally:
        result.wall_s = time.monotonic() - t0
        for r in manager.records():
            result.loads[r.key.name] += r.stats.loads
            result.evictions += r.stats.evictions
            result.cold_start_s += r.stats.cold_start_s_total
        await manager.close()
        await asyncio.gather(*closing)
    return result
