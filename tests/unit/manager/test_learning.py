"""Cache learning off the request path (``manager/learning.py``): a request is recorded,
learnt within ``LEARN_EVERY_S`` in a batch that leaves exactly what one request at a
time leaves, and any choice made before then learns the recorded requests first."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from pathlib import Path

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import DeviceConfig, PrefetchConfig, ServerSettings
from modelyard.errors import ModelNotFoundError
from modelyard.manager.demand import DemandTracker
from modelyard.manager.episodes import EpisodeWeights
from modelyard.manager.eviction import ArrivalCostPolicy, DecayedGdsfPolicy
from modelyard.manager.learning import LEARN_EVERY_S, RequestEvents
from modelyard.manager.manager import ModelManager
from modelyard.manager.prefetch import Prefetcher
from modelyard.manager.records import ModelKey, ModelRecord
from tests.fakes.clock import FakeClock
from tests.fakes.instance import FakeInstance

MIB = 1024 * 1024
NAMES = ("timer", "busy", "a", "b", "c", "tick")


class _Learners:
    """What the manager teaches per request: hot-rule demand, two policies, prefetcher."""

    def __init__(self, records: dict[str, ModelRecord]) -> None:
        self.records = records
        self.demand = DemandTracker(60.0)
        self.weights = EpisodeWeights()
        self.policy = ArrivalCostPolicy(period_s=100.0)  # a short "day": its bins fill
        self.gdsf = DecayedGdsfPolicy(30.0)
        self.prefetcher = Prefetcher(
            PrefetchConfig(min_observations=2, min_probability=0.3),
            self._resolve,
            lambda r: 10_000 * MIB,  # room for anything: every decision is a load
            lambda r: 10 * MIB,
        )

    def _resolve(self, name: str) -> ModelRecord:
        if name not in self.records:
            raise ModelNotFoundError(name)
        return self.records[name]

    def one(self, record: ModelRecord, now: float) -> None:
        """One request, learnt as the manager learnt it before batches."""
        self.demand.observe(record.key, now, self.weights(record.key, now))
        self.policy.on_request(record, now)
        self.gdsf.on_request(record, now)
        self.prefetcher.after(record.key.name, now)

    def run(self, record: ModelRecord, times: Sequence[float], cold: bool) -> None:
        self.gdsf.on_requests(record, times)
        self.prefetcher.after_run(record.key.name, times)

    def state(self, now: float) -> object:
        """Everything a later decision reads, at ``now``."""
        records = list(self.records.values())
        p = self.prefetcher
        return (
            self.demand.hot(now, 0.4),
            self.demand.top(now),
            [self.demand.demand(r.key, now) for r in records],
            [self.policy.value(r) for r in records],
            [cycle.factor(r.key, now) for r in records if (cycle := self.policy.time_of_day)],
            [self.policy.imminent(r) for r in records],
            [r.key.name for r in self.policy.order(records)],
            [self.gdsf.value(r) for r in records],
            [p.predictor.predict(n) for n in NAMES],
            p.predictor.sole_reliable(),
            [p.histograms.p_within(n, now, 5.0) for n in NAMES],
            [p.windows.window(n) for n in NAMES],
            p.windows.due(now),
            [p.windows.factor(n, now) for n in NAMES],
        )


def _stream(seed: int) -> list[tuple[str, float]]:
    """A metronome alone for 20 s (a pre-warm window from runs of requests), then runs of
    one model (bursts), a timer every 10 s, independent requests in between."""
    rng = random.Random(seed)
    out: list[tuple[str, float]] = [("tick", 0.5 * i) for i in range(1, 41)]
    t = 20.0
    next_timer = 30.0
    while t < 400.0:
        if t >= next_timer:
            out.append(("timer", next_timer))
            next_timer += 10.0
        name = rng.choice(NAMES[1:-1])
        for _ in range(rng.choice((1, 1, 2, 5, 30))):
            t += rng.choice((0.0, 0.001, 0.05, 0.3, 1.5, 4.0))
            out.append((name, t))
    return out


def _records() -> dict[str, ModelRecord]:
    out = {}
    for i, name in enumerate(NAMES):
        r = ModelRecord(ModelKey(name, "1"), ModelConfig(name=name, path=name), Path(name))
        r.reserved_bytes = (i + 1) * 10 * MIB
        r.timings.total_s = 0.1 * (i + 1)
        out[name] = r
    return out


async def test_a_batch_leaves_what_one_request_at_a_time_leaves() -> None:
    stream = _stream(seed=7)
    one, batched = _Learners(_records()), _Learners(_records())
    events = RequestEvents(
        demand=batched.demand,
        policy=batched.policy,
        after=batched.run,
        hot_weight=batched.weights.run,
    )
    rng = random.Random(1)
    i = 0
    while i < len(stream):
        batch = stream[i : i + rng.choice((1, 3, 17, 64))]
        for name, t in batch:
            one.one(one.records[name], t)
            events.record(batched.records[name], t)
        assert events.pending == len(batch), "nothing is learnt inside the turn"
        events.flush()
        i += len(batch)
        now = batch[-1][1]
        assert batched.state(now) == one.state(now)
    assert one.prefetcher.windows.window("tick") is not None, "the stream makes a window"
    assert events.learnt == len(stream)
    assert events.batches < len(stream) / 5


def _manager(tmp_path: Path) -> tuple[ModelManager, FakeClock]:
    for name in ("a", "b"):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.onnx").write_bytes(b"x" * 4096)
    settings = ServerSettings(
        model_repository=str(tmp_path),
        devices=[DeviceConfig(name="cpu", memory_budget_mb=100)],
        models=[ModelConfig(name=n, path=n, memory_mb=40) for n in ("a", "b")],
        eviction_policy="arrival-cost",
    )
    clock = FakeClock()
    manager = ModelManager(settings, lambda config: FakeInstance(40 * MIB), clock=clock)
    return manager, clock


async def test_a_request_is_learnt_within_the_learning_delay(tmp_path: Path) -> None:
    manager, clock = _manager(tmp_path)
    a = manager.resolve("a", None)
    policy = manager.policy
    assert isinstance(policy, ArrivalCostPolicy)
    manager.touch(a)
    # What the request must see at once is written at once ...
    assert a.stats.requests == 1
    assert a.stats.last_used == clock.monotonic()
    # ... the learning waits: past the end of the turn, until LEARN_EVERY_S.
    assert manager.learning.pending == 1
    assert policy.episodes.demand(a.key, clock.monotonic()) == 0.0
    await asyncio.sleep(0)
    assert manager.learning.pending == 1
    await asyncio.sleep(LEARN_EVERY_S * 2)
    assert manager.learning.pending == 0
    assert manager.learning.batches == 1
    assert policy.episodes.demand(a.key, clock.monotonic()) == 1.0
    assert manager.demand.demand(a.key, clock.monotonic()) == 1.0
    await manager.close()


async def test_a_choice_in_the_same_turn_learns_the_recorded_requests_first(
    tmp_path: Path,
) -> None:
    manager, clock = _manager(tmp_path)
    a, b = (manager.resolve(n, None) for n in ("a", "b"))
    for record in (a, b):
        await manager.ensure_ready(record, deadline=None)
    manager.touch(a)
    clock.advance(5)
    await asyncio.sleep(LEARN_EVERY_S * 2)  # a's request is learnt
    for _ in range(20):  # b is asked for often, all before the next flush
        manager.touch(b)
        clock.advance(2)
    assert manager.learning.pending == 20
    # The hot set, chosen now, counts b's requests: b is the hottest, not a.
    assert set(manager.admission.hot()) == {b.key}
    assert manager.learning.pending == 0
    await manager.close()


async def test_closing_learns_what_is_pending_and_schedules_nothing_after(tmp_path: Path) -> None:
    manager, clock = _manager(tmp_path)
    a = manager.resolve("a", None)
    manager.touch(a)
    assert manager.learning.pending == 1
    await manager.close()  # before its tasks close: a prefetch it decides is cancelled
    assert manager.learning.pending == 0
    assert manager.demand.demand(a.key, clock.monotonic()) == 1.0
    manager.touch(a)  # a straggler after the close is learnt at once, on no timer
    assert manager.learning.pending == 0
    assert manager.learning.learnt == 2
