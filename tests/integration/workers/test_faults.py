"""Workers that crash, hang, leak or fail to load: typed errors, nothing else affected."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from modelyard.errors import (
    DeadlineExceededError,
    InternalError,
    ModelLoadError,
    WorkerCrashedError,
)
from modelyard.workers.factory import WorkerFactory, WorkerFactoryConfig
from modelyard.workers.instance import StartRequest
from modelyard.workers.limits import RlimitLimiter
from modelyard.workers.process import ProcessInstance
from tests.fakes import fault_models

from .conftest import TEST_FACTORY_CONFIG, Starter, fault_spec, onnx_spec

MIB = 1024 * 1024
PROMPT_S = 2.0
"""A crashed worker's callers must hear of it well within this."""
LIMIT_MB = 200


def _crash_inputs(action: int) -> dict[str, np.ndarray]:
    return {"x": np.ones(2, np.float32), "action": np.array([action], np.int32)}


def _hang_inputs(delay_ms: int) -> dict[str, np.ndarray]:
    return {"x": np.ones(2, np.float32), "delay_ms": np.array([delay_ms], np.int32)}


def _leak(mb: int) -> dict[str, np.ndarray]:
    return {"x": np.array([[mb]], np.float32)}


async def _leak_repeatedly(
    instance: ProcessInstance, mb: int, times: int, pause_s: float = 0
) -> None:
    for _ in range(times):
        await instance.infer(_leak(mb), timeout_s=10.0)
        await asyncio.sleep(pause_s)


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        (fault_models.EXIT, "exited with code 3"),
        (fault_models.SIGKILL_SELF, "SIGKILL"),
        (fault_models.SEGFAULT, "SIGSEGV"),
        (fault_models.SIGTERM_SELF, "SIGTERM"),
    ],
    ids=["os-exit", "sigkill", "segfault", "sigterm"],
)
async def test_a_crash_fails_the_call_with_the_reason(
    start_instance: Starter, action: int, reason: str
) -> None:
    instance = await start_instance(fault_spec("CrashingModel"))
    reasons: list[str] = []
    instance.set_exit_callback(reasons.append)

    with pytest.raises(WorkerCrashedError, match=reason):
        await instance.infer(_crash_inputs(action), timeout_s=10.0)

    assert not instance.is_alive
    assert len(reasons) == 1
    assert reason in reasons[0]
    with pytest.raises(WorkerCrashedError, match=reason):
        await instance.infer(_crash_inputs(0), timeout_s=1.0)


async def test_a_datagram_that_is_no_message_is_a_protocol_error_not_a_crash(
    start_instance: Starter,
) -> None:
    instance = await start_instance(fault_spec("CrashingModel"))
    reasons: list[str] = []
    instance.set_exit_callback(reasons.append)
    started = time.monotonic()

    with pytest.raises(InternalError, match=r"broke the message protocol .*Invalid value '\?'"):
        await instance.infer(_crash_inputs(fault_models.GARBLE), timeout_s=10.0)

    assert time.monotonic() - started < PROMPT_S
    deadline = time.monotonic() + PROMPT_S
    while instance.is_alive and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not instance.is_alive, "a worker that broke the protocol must not serve again"
    assert len(reasons) == 1
    assert "malformed message" in reasons[0]


async def test_sigkill_fails_every_waiting_call_promptly_and_fires_the_callback_once(
    start_instance: Starter,
) -> None:
    instance = await start_instance(fault_spec("HangingModel"))
    reasons: list[str] = []
    instance.set_exit_callback(reasons.append)
    calls = [
        asyncio.ensure_future(instance.infer(_hang_inputs(-1), timeout_s=30.0)) for _ in range(5)
    ]
    await asyncio.sleep(0.1)
    pid = instance.pid
    assert pid is not None
    t0 = time.monotonic()

    psutil.Process(pid).send_signal(signal.SIGKILL)
    results = await asyncio.gather(*calls, return_exceptions=True)

    assert time.monotonic() - t0 < PROMPT_S
    assert all(isinstance(r, WorkerCrashedError) for r in results), results
    assert all("SIGKILL" in str(r) for r in results)
    assert reasons == [instance.exit_reason]
    assert "SIGKILL" in reasons[0]


async def test_other_workers_are_unaffected_by_a_crash(
    start_instance: Starter, onnx_dirs: dict[str, Path]
) -> None:
    healthy = await start_instance(onnx_spec(onnx_dirs["identity"]))
    crashing = await start_instance(fault_spec("CrashingModel"))
    with pytest.raises(WorkerCrashedError):
        await crashing.infer(_crash_inputs(fault_models.SIGKILL_SELF), timeout_s=5.0)
    x = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal((await healthy.infer({"x": x}, timeout_s=5.0))["y"], x)


async def test_a_hang_is_killed_at_the_deadline(start_instance: Starter) -> None:
    instance = await start_instance(fault_spec("HangingModel"))
    reasons: list[str] = []
    instance.set_exit_callback(reasons.append)
    pid = instance.pid
    assert pid is not None
    timeout_s = 0.5
    t0 = time.monotonic()

    with pytest.raises(DeadlineExceededError, match="did not answer within"):
        await instance.infer(_hang_inputs(-1), timeout_s=timeout_s)

    assert time.monotonic() - t0 < timeout_s + 1.0
    assert not psutil.pid_exists(pid)
    assert not instance.is_alive
    assert len(reasons) == 1
    assert reasons[0].startswith("killed after overrunning its deadline")


async def test_a_short_deadline_after_a_long_one_is_still_kept(start_instance: Starter) -> None:
    # One deadline timer per worker, armed at the earliest deadline asked for: a call
    # answered in time leaves it armed at its own (long) deadline, and a later call's
    # shorter one must still be watched.
    instance = await start_instance(fault_spec("HangingModel"))
    await instance.infer(_hang_inputs(0), timeout_s=30.0)
    t0 = time.monotonic()

    with pytest.raises(DeadlineExceededError, match="did not answer within"):
        await instance.infer(_hang_inputs(-1), timeout_s=0.3)

    assert time.monotonic() - t0 < 0.3 + 1.0


async def test_an_earlier_calls_deadline_does_not_end_a_later_call(start_instance: Starter) -> None:
    # The timer stays armed at the first call's deadline (0.3 s away) after its answer;
    # when it fires, the later call's own deadline (5 s) has not come, so it runs on.
    instance = await start_instance(fault_spec("HangingModel"))
    await instance.infer(_hang_inputs(0), timeout_s=0.3)

    out = await instance.infer(_hang_inputs(700), timeout_s=5.0)

    assert out["y"].shape == (2,)
    assert instance.is_alive


async def test_calls_queued_behind_a_hang_time_out_without_killing(start_instance: Starter) -> None:
    instance = await start_instance(fault_spec("HangingModel"))
    first = asyncio.ensure_future(instance.infer(_hang_inputs(400), timeout_s=5.0))
    await asyncio.sleep(0.05)

    with pytest.raises(DeadlineExceededError, match="busy worker"):
        await instance.infer(_hang_inputs(0), timeout_s=0.1)

    assert (await first)["y"].shape == (2,)
    assert instance.is_alive


async def test_a_load_error_is_a_model_load_error_with_the_message(factory: WorkerFactory) -> None:
    instance = ProcessInstance(factory)
    with pytest.raises(ModelLoadError, match="RuntimeError: weights are corrupt") as info:
        await instance.start(StartRequest(fault_spec("FailingLoadModel")))
    assert any("Traceback" in note for note in getattr(info.value, "__notes__", []))
    pid = instance.pid
    assert pid is not None
    assert not psutil.pid_exists(pid)
    assert not instance.is_alive


async def test_a_missing_model_file_is_a_model_load_error(
    factory: WorkerFactory, tmp_path: Path
) -> None:
    instance = ProcessInstance(factory)
    with pytest.raises(ModelLoadError, match="FileNotFoundError"):
        await instance.start(StartRequest(onnx_spec(tmp_path)))


async def test_allocation_past_the_cgroup_limit_is_an_oom_kill(
    start_instance: Starter, factory: WorkerFactory
) -> None:
    if not factory.memory_limit_backend.startswith("cgroup"):
        pytest.skip(f"no cgroup memory controller here ({factory.memory_limit_backend})")
    instance = await start_instance(fault_spec("LeakyModel"), memory_limit_bytes=LIMIT_MB * MIB)
    reasons: list[str] = []
    instance.set_exit_callback(reasons.append)
    await instance.infer(_leak(50), timeout_s=10.0)

    with pytest.raises(WorkerCrashedError, match=rf"killed by OOM \(memory limit {LIMIT_MB} MiB\)"):
        await _leak_repeatedly(instance, 50, times=10)

    assert len(reasons) == 1
    assert "OOM" in reasons[0]


async def test_rlimit_makes_a_large_allocation_fail_with_a_clear_error(
    start_instance: Starter,
) -> None:
    f = WorkerFactory(TEST_FACTORY_CONFIG, limiter=RlimitLimiter())
    await f.start()
    try:
        instance = await start_instance(fault_spec("LeakyModel"), LIMIT_MB * MIB, on=f)
        with pytest.raises(InternalError, match=f"memory limit of {LIMIT_MB} MiB"):
            await instance.infer(_leak(2 * LIMIT_MB), timeout_s=10.0)
        assert instance.is_alive
        assert (await instance.infer(_leak(1), timeout_s=10.0))["held_mb"].tolist() == [[1]]
        await instance.stop()
    finally:
        await f.close()


async def test_the_watchdog_kills_a_worker_that_creeps_past_its_limit(
    start_instance: Starter,
) -> None:
    f = WorkerFactory(
        WorkerFactoryConfig(watchdog_interval_s=0.05), limiter=RlimitLimiter(set_rlimit=False)
    )
    await f.start()
    try:
        instance = await start_instance(fault_spec("LeakyModel"), LIMIT_MB * MIB, on=f)
        reasons: list[str] = []
        instance.set_exit_callback(reasons.append)
        with pytest.raises(WorkerCrashedError, match=f"memory limit {LIMIT_MB} MiB"):
            await _leak_repeatedly(instance, 20, times=40, pause_s=0.06)
        assert len(reasons) == 1
        assert "watchdog" in reasons[0]
    finally:
        await f.close()


async def test_a_call_with_no_time_left_is_refused_without_killing(start_instance: Starter) -> None:
    instance = await start_instance(fault_spec("HangingModel"))
    with pytest.raises(DeadlineExceededError, match="no time left"):
        await instance.infer(_hang_inputs(0), timeout_s=0.0)
    assert instance.is_alive
