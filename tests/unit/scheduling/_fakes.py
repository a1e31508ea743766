"""Fakes for the scheduler's unit tests: a settable clock and models that record their calls."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from modelyard.clock import Clock
from modelyard.errors import ServerError
from modelyard.scheduling import ModelScheduler, SchedulerConfig
from tests.fakes.clock import FakeClock

__all__ = ["FakeClock"]


def reference_model(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A row-independent model: what every request must get back, batched or not."""
    x = inputs["x"]
    return {"y": x * 2 + 1, "total": x.reshape(x.shape[0], -1).sum(axis=1)}


@dataclass
class Call:
    """One execute call as the model saw it."""

    inputs: dict[str, np.ndarray]
    deadline: float

    @property
    def rows(self) -> int:
        return int(self.inputs["x"].shape[0])

    @property
    def ids(self) -> list[int]:
        """The first element of every row: tests tag requests with it."""
        x = self.inputs["x"]
        return [int(v) for v in x.reshape(x.shape[0], -1)[:, 0]]


@dataclass
class FakeModel:
    """``execute`` that records calls, can be held at a gate, and fails on demand.

    ``gate``: while not set, every call waits on it (requests pile up behind the first).
    ``fail_with``: raised by every call while set. ``fail_if``: raises when it returns an
    exception for a call's inputs. ``on_call``: runs at the start of every call (e.g. to
    move a fake clock). ``steps``: event-loop turns each call takes. ``model``: the
    function computed (default :func:`reference_model`).
    """

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    fail_with: ServerError | None = None
    fail_if: Callable[[dict[str, np.ndarray]], Exception | None] | None = None
    on_call: Callable[[], None] | None = None
    steps: int = 0
    model: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] = reference_model
    calls: list[Call] = field(default_factory=list)
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    running: int = 0
    max_running: int = 0

    def __post_init__(self) -> None:
        self.gate.set()

    def hold(self) -> None:
        """Make calls wait until :meth:`release`."""
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    async def __call__(
        self, inputs: dict[str, np.ndarray], deadline: float
    ) -> dict[str, np.ndarray]:
        self.calls.append(Call(inputs, deadline))
        self.entered.set()
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            if self.on_call is not None:
                self.on_call()
            await self.gate.wait()
            for _ in range(self.steps):
                await asyncio.sleep(0)
            if self.fail_with is not None:
                raise self.fail_with
            if self.fail_if is not None and (error := self.fail_if(inputs)) is not None:
                raise error
            return self.model(inputs)
        finally:
            self.running -= 1


def tensor(request_id: int, rows: int = 1, width: int = 3, dtype: str = "float32") -> np.ndarray:
    """``rows`` rows of ``width`` values whose first element is ``request_id``."""
    data = np.arange(rows * width, dtype=dtype).reshape(rows, width) + 1000
    data[:, 0] = request_id
    return data


async def settle(condition: Callable[[], bool], *, steps: int = 1000) -> None:
    """Let the event loop run until ``condition`` holds (no wall-clock sleeps)."""
    for _ in range(steps):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


class MakeScheduler(Protocol):
    """The ``make_scheduler`` fixture: builds a scheduler that is closed at teardown."""

    def __call__(
        self,
        config: SchedulerConfig | None = None,
        model: FakeModel | None = None,
        clock: Clock | None = None,
    ) -> ModelScheduler: ...
