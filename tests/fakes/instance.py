"""A fake model instance for the manager's unit tests: no process, no runtime.

It implements :class:`modelyard.workers.instance.ModelInstance`; a test decides how
much memory it reports, whether its start fails, and when its start may finish.
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np

from modelyard.errors import ModelLoadError, ModelNotReadyError
from modelyard.runtimes.base import TensorSpec
from modelyard.workers.instance import ExitCallback, InstanceInfo, StartRequest


class FakeInstance:
    """One started-or-not fake replica."""

    def __init__(
        self,
        footprint_bytes: int,
        *,
        fail: str | None = None,
        gate: asyncio.Event | None = None,
        stop_gate: asyncio.Event | None = None,
    ) -> None:
        self.footprint_bytes = footprint_bytes
        self.fail = fail
        """A start raises ModelLoadError with this reason (None: it succeeds)."""
        self.gate = gate
        """A start waits for this event before it finishes (None: at once)."""
        self.stop_gate = stop_gate
        """A stop waits for this event (a worker process that takes a while to exit)."""
        self.entered = asyncio.Event()
        """Set once a start began (so a test knows the load is inside the instance)."""
        self.alive = False
        self.stopped = False
        self.on_exit: ExitCallback | None = None

    @property
    def is_alive(self) -> bool:
        """True between a successful start and stop (or a simulated crash)."""
        return self.alive

    async def start(self, request: StartRequest) -> InstanceInfo:
        """Report the configured footprint, after the gate opens; or fail."""
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise ModelLoadError(f"model {request.spec.model_name} failed to load: {self.fail}")
        self.alive = True
        spec = TensorSpec("x", "FP32", (-1, 1))
        return InstanceInfo([spec], [spec], True, self.footprint_bytes)

    async def infer(self, inputs: dict[str, np.ndarray], timeout_s: float) -> dict[str, np.ndarray]:
        """Echo the inputs."""
        return dict(inputs)

    async def stop(self) -> None:
        """Mark stopped (idempotent), after the stop gate opens."""
        if self.stop_gate is not None:
            await self.stop_gate.wait()
        self.alive = False
        self.stopped = True

    def set_exit_callback(self, callback: ExitCallback) -> None:
        """Keep the callback so a test can simulate a crash."""
        self.on_exit = callback

    def crash(self, reason: str = "killed") -> None:
        """Die on its own, as a worker process can."""
        self.alive = False
        if self.on_exit is not None:
            self.on_exit(reason)


class DeferringFakeInstance(FakeInstance):
    """A fake that, like a worker process, can measure its footprint after its start
    (``StartRequest.defer_footprint``), and whose measurement waits for ``measure_gate``:
    the fault of a slow memory reading."""

    def __init__(self, footprint_bytes: int, *, measure_gate: asyncio.Event) -> None:
        super().__init__(footprint_bytes)
        self.measure_gate = measure_gate
        self.measuring = asyncio.Event()
        """Set once a measurement began."""
        self._info: InstanceInfo | None = None

    async def start(self, request: StartRequest) -> InstanceInfo:
        """Start as the plain fake does; with ``defer_footprint``, report none yet."""
        info = await super().start(request)
        if request.defer_footprint:
            info = dataclasses.replace(info, footprint_bytes=0, footprint_pending=True)
        self._info = info
        return info

    async def measure_footprint(self, *, after_first_answer: bool = False) -> InstanceInfo:
        """The configured footprint, once the gate opens; ModelNotReadyError once stopped."""
        self.measuring.set()
        await self.measure_gate.wait()
        if self._info is None or not self.alive:
            raise ModelNotReadyError("the fake instance is not running")
        return dataclasses.replace(
            self._info, footprint_bytes=self.footprint_bytes, footprint_pending=False
        )
