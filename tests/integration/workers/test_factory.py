"""The worker factory: fork server, cold spawn, memory-limit groups, shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from modelyard.errors import WorkerCrashedError
from modelyard.workers.factory import WorkerFactory, WorkerFactoryConfig
from modelyard.workers.instance import StartRequest
from modelyard.workers.limits import Cgroup1Limiter, Cgroup2Limiter
from modelyard.workers.process import ProcessInstance
from tests.fakes import fault_models

from .conftest import Starter, fault_spec, is_gone, onnx_spec

MIB = 1024 * 1024
MAX_FORK_SERVER_THREADS = 2
"""The main thread, plus the one idle thread ONNX Runtime's module starts at import."""


async def test_the_fork_server_has_not_started_thread_pools(factory: WorkerFactory) -> None:
    info = factory.fork_server_info
    assert info is not None
    assert 1 <= info.threads <= MAX_FORK_SERVER_THREADS
    assert psutil.Process(info.pid).num_threads() <= MAX_FORK_SERVER_THREADS


async def test_workers_are_children_of_the_fork_server(
    factory: WorkerFactory, start_instance: Starter, onnx_dirs: dict[str, Path]
) -> None:
    instance = await start_instance(onnx_spec(onnx_dirs["identity"]))
    assert instance.pid is not None
    assert factory.fork_server_info is not None
    assert psutil.Process(instance.pid).ppid() == factory.fork_server_info.pid


async def test_the_limit_backend_is_named_and_its_group_goes_with_the_worker(
    factory: WorkerFactory, start_instance: Starter, onnx_dirs: dict[str, Path]
) -> None:
    assert factory.memory_limit_backend in {"cgroup2", "cgroup1", "rlimit"}
    instance = await start_instance(onnx_spec(onnx_dirs["identity"]), 256 * MIB)
    limiter = factory.limiter
    if not isinstance(limiter, Cgroup1Limiter | Cgroup2Limiter):
        pytest.skip("no cgroup backend here")
    groups = list(limiter.base.glob(f"modelyard-{os.getpid()}-*"))
    assert len(groups) == 1
    assert str(instance.pid) in (groups[0] / "cgroup.procs").read_text().split()

    await instance.stop()

    for _ in range(50):
        if not groups[0].exists():
            break
        await asyncio.sleep(0.02)
    assert not groups[0].exists()


async def test_closing_the_factory_kills_its_workers(onnx_dirs: dict[str, Path]) -> None:
    factory = WorkerFactory()
    await factory.start()
    instance = ProcessInstance(factory)
    await instance.start(StartRequest(onnx_spec(onnx_dirs["identity"])))
    pid = instance.pid
    assert factory.fork_server_info is not None
    server_pid = factory.fork_server_info.pid
    assert pid is not None

    await factory.close()

    assert not instance.is_alive
    assert not psutil.pid_exists(server_pid)
    assert is_gone(pid)
    await instance.stop()


async def test_a_dead_fork_server_fails_its_workers_calls_and_is_restarted(
    start_instance: Starter,
) -> None:
    factory = WorkerFactory()
    await factory.start()
    try:
        instance = await start_instance(fault_spec("HangingModel"), on=factory)
        reasons: list[str] = []
        instance.set_exit_callback(reasons.append)
        call = asyncio.ensure_future(
            instance.infer({"x": np.ones(1, np.float32), "delay_ms": np.array([-1], np.int32)}, 30)
        )
        await asyncio.sleep(0.05)
        assert factory.fork_server_info is not None
        os.kill(factory.fork_server_info.pid, signal.SIGKILL)

        with pytest.raises(WorkerCrashedError, match="fork server"):
            await asyncio.wait_for(call, 5.0)
        assert len(reasons) == 1
        assert not factory.fork_server_alive

        again = await start_instance(fault_spec("HangingModel"), on=factory)  # restarts it

        assert factory.fork_server_alive
        assert again.is_alive
    finally:
        await factory.close()


@pytest.mark.slow
async def test_a_cold_spawned_worker_serves_and_reports_its_crash(
    start_instance: Starter, onnx_dirs: dict[str, Path]
) -> None:
    factory = WorkerFactory(WorkerFactoryConfig(start_method="spawn"))
    await factory.start()
    try:
        t0 = time.perf_counter()
        ident = await start_instance(onnx_spec(onnx_dirs["identity"]), on=factory)
        assert time.perf_counter() - t0 > 0
        x = np.ones((2, 4), np.float32)
        np.testing.assert_array_equal((await ident.infer({"x": x}, 5.0))["y"], x)
        crashing = await start_instance(fault_spec("CrashingModel"), on=factory)
        with pytest.raises(WorkerCrashedError, match="SIGKILL"):
            await crashing.infer(
                {"x": x[0], "action": np.array([fault_models.SIGKILL_SELF], np.int32)}, 5.0
            )
    finally:
        await factory.close()
