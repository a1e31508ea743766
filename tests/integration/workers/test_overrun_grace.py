"""An overrun is answered, not punished (issue 33): the caller gets its
DeadlineExceededError at the deadline; the worker is stopped only if the call still runs
after the model's ``overrun_grace_s``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import numpy as np
import psutil
import pytest

from modelyard.errors import DeadlineExceededError
from modelyard.workers.factory import WorkerFactory
from modelyard.workers.instance import StartRequest
from modelyard.workers.process import ProcessInstance

from .conftest import fault_spec, is_gone

GRACE_S = 1.5


def _hang_inputs(delay_ms: int) -> dict[str, np.ndarray]:
    return {"x": np.ones(2, np.float32), "delay_ms": np.array([delay_ms], np.int32)}


@pytest.fixture
async def graced(factory: WorkerFactory) -> AsyncIterator[ProcessInstance]:
    instance = ProcessInstance(factory, overrun_grace_s=GRACE_S)
    await instance.start(StartRequest(fault_spec("HangingModel")))
    try:
        yield instance
    finally:
        await instance.stop()
        assert instance.pid is None or is_gone(instance.pid)


async def test_an_overrun_within_the_grace_keeps_the_worker(graced: ProcessInstance) -> None:
    reasons: list[str] = []
    graced.set_exit_callback(reasons.append)
    pid = graced.pid
    assert pid is not None
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError, match=r"runs on for up to 1\.5s"):
        await graced.infer(_hang_inputs(600), timeout_s=0.2)
    assert time.monotonic() - t0 < 0.2 + 0.5, "the caller was not answered at its deadline"
    # The next call waits for the overrunning one to end (within the grace), then runs
    # on the same worker.
    out = await graced.infer(_hang_inputs(0), timeout_s=5.0)
    np.testing.assert_array_equal(out["y"], np.ones(2, np.float32))
    assert graced.pid == pid
    assert psutil.pid_exists(pid)
    assert graced.is_alive
    assert reasons == []


async def test_a_call_still_running_after_the_grace_is_stopped(graced: ProcessInstance) -> None:
    reasons: list[str] = []
    graced.set_exit_callback(reasons.append)
    pid = graced.pid
    assert pid is not None
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        await graced.infer(_hang_inputs(-1), timeout_s=0.2)
    assert time.monotonic() - t0 < 0.2 + 0.5
    assert graced.is_alive, "stopped at the deadline, before its grace"
    deadline = time.monotonic() + GRACE_S + 5.0
    while graced.is_alive and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not graced.is_alive
    assert is_gone(pid)
    assert len(reasons) == 1
    assert reasons[0].startswith("killed after overrunning its deadline by more than")
