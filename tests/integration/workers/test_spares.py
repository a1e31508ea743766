"""Spare workers: idle worker processes started ahead that a load claims.

Real fork server, real workers, real memory groups where the cgroup backend is active.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from modelyard.workers.factory import WorkerFactory
from modelyard.workers.instance import StartRequest
from modelyard.workers.limits import Cgroup1Limiter, Cgroup2Limiter
from modelyard.workers.process import ProcessInstance
from tests.fakes.fault_models import SLOW
from tests.polling import wait_until

from .conftest import (
    TEST_FACTORY_CONFIG,
    Starter,
    fault_spec,
    instances_on,
    is_gone,
    onnx_spec,
)

MIB = 1024 * 1024
READY_S = 10.0
"""How long a spare may take to appear (fork on a loaded 2-core box)."""


@pytest.fixture
async def spared() -> AsyncIterator[WorkerFactory]:
    """A started factory that keeps one spare worker."""
    f = WorkerFactory(dataclasses.replace(TEST_FACTORY_CONFIG, spare_workers=1))
    await f.start()
    yield f
    await f.close()


@pytest.fixture
async def start_on_spared(spared: WorkerFactory) -> AsyncIterator[Starter]:
    """``start_instance`` on ``spared`` (without starting a second factory)."""
    async with instances_on(spared) as start:
        yield start


async def _one_spare(factory: WorkerFactory) -> int:
    await wait_until(lambda: len(factory.spare_pids) == 1, READY_S, what="a spare worker appears")
    return factory.spare_pids[0]


async def _warm_sent(factory: WorkerFactory, pid: int) -> None:
    # The Warm goes out once no call waits for a first answer (spares.py: _QUIET_WAIT_S).
    await wait_until(lambda: factory.warm_spare_pids == [pid], READY_S, what="its Warm sent")


async def test_a_load_claims_the_spare_and_a_new_spare_follows(
    spared: WorkerFactory, start_on_spared: Starter, onnx_dirs: dict[str, Path]
) -> None:
    spare_pid = await _one_spare(spared)
    assert spared.fork_server_info is not None
    assert psutil.Process(spare_pid).ppid() == spared.fork_server_info.pid

    instance = await start_on_spared(onnx_spec(onnx_dirs["identity"]))

    assert instance.pid == spare_pid, "the load took the spare instead of forking"
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal((await instance.infer({"x": x}, 5.0))["y"], x)
    new_pid = await _one_spare(spared)
    assert new_pid != spare_pid
    assert psutil.pid_exists(new_pid)


async def test_a_claimed_spare_gets_the_models_limit_in_its_own_group(
    spared: WorkerFactory, start_on_spared: Starter, onnx_dirs: dict[str, Path]
) -> None:
    limiter = spared.limiter
    if not isinstance(limiter, Cgroup1Limiter | Cgroup2Limiter):
        pytest.skip("the rlimit backend places nothing ahead; covered by the load tests")
    spare_pid = await _one_spare(spared)
    groups = {g: (g / "cgroup.procs").read_text().split() for g in limiter.base.glob("modelyard-*")}
    spare_group = next(g for g, pids in groups.items() if str(spare_pid) in pids)

    instance = await start_on_spared(onnx_spec(onnx_dirs["identity"]), 256 * MIB)

    assert instance.pid == spare_pid
    assert str(instance.pid) in (spare_group / "cgroup.procs").read_text().split()
    limit_file = "memory.max" if isinstance(limiter, Cgroup2Limiter) else "memory.limit_in_bytes"
    assert int((spare_group / limit_file).read_text()) == 256 * MIB
    await instance.stop()
    await wait_until(
        lambda: not spare_group.exists(), READY_S, what="the group goes with the worker"
    )


async def test_a_killed_spare_is_replaced_and_loads_still_work(
    spared: WorkerFactory, start_on_spared: Starter, onnx_dirs: dict[str, Path]
) -> None:
    dead = await _one_spare(spared)
    os.kill(dead, signal.SIGKILL)

    await wait_until(
        lambda: spared.spare_pids not in ([], [dead]), READY_S, what="the dead spare is replaced"
    )
    replacement = spared.spare_pids[0]
    instance = await start_on_spared(onnx_spec(onnx_dirs["mlp"]))

    assert instance.pid == replacement
    out = await instance.infer({"x": np.ones((1, 16), np.float32)}, 5.0)
    assert out["y"].shape == (1, 8)


async def test_without_spares_a_load_forks_its_own_worker(
    factory: WorkerFactory, start_instance: Starter, onnx_dirs: dict[str, Path]
) -> None:
    assert factory.config.spare_workers == 0
    await asyncio.sleep(0.2)  # room for a (wrongly) started spare to show up
    assert factory.fork_server_info is not None
    assert psutil.Process(factory.fork_server_info.pid).children() == []

    instance = await start_instance(onnx_spec(onnx_dirs["identity"]))

    assert instance.is_alive
    assert factory.spare_pids == []
    await asyncio.sleep(0.2)
    children = psutil.Process(factory.fork_server_info.pid).children()
    assert [p.pid for p in children] == [instance.pid], "no spare made after the load"


async def test_closing_the_factory_reaps_its_spares_and_their_groups() -> None:
    factory = WorkerFactory(dataclasses.replace(TEST_FACTORY_CONFIG, spare_workers=2))
    await factory.start()
    await wait_until(lambda: len(factory.spare_pids) == 2, READY_S, what="two spares appear")
    pids = factory.spare_pids
    limiter = factory.limiter

    await factory.close()

    assert all(is_gone(pid) for pid in pids)
    assert factory.spare_pids == []
    if isinstance(limiter, Cgroup1Limiter | Cgroup2Limiter):
        assert list(limiter.base.glob(f"modelyard-{os.getpid()}-*")) == []


async def test_a_spare_warms_its_runtimes_ahead_and_still_serves_any_model(
    onnx_dirs: dict[str, Path],
) -> None:
    """A spare told to warm ONNX Runtime reports it in its load; a spare that was not
    reports nothing; a warmed spare serves a model of another runtime just as well."""
    warm = dataclasses.replace(TEST_FACTORY_CONFIG, spare_workers=1, warm=("onnx",))
    cold = dataclasses.replace(TEST_FACTORY_CONFIG, spare_workers=1)
    x = np.ones((2, 4), np.float32)
    cases = [
        (warm, onnx_spec(onnx_dirs["identity"]), True, ["onnx"]),
        (warm, fault_spec("EchoModel"), True, ["onnx"]),
        (cold, onnx_spec(onnx_dirs["identity"]), False, []),
    ]
    for config, spec, warmed, expected in cases:
        factory = WorkerFactory(config)
        await factory.start()
        instance = ProcessInstance(factory)
        try:
            spare_pid = await _one_spare(factory)
            if warmed:
                await _warm_sent(factory, spare_pid)
            info = await instance.start(StartRequest(spec))
            assert instance.pid == spare_pid
            assert info.details["warmed_runtimes"] == expected, spec.kind
            out = await instance.infer({"x": x}, 5.0)
            np.testing.assert_array_equal(next(iter(out.values())), x)
        finally:
            await instance.stop()
            await factory.close()


async def test_a_spare_claimed_before_its_warm_loads_cold(onnx_dirs: dict[str, Path]) -> None:
    """A spare's Warm waits while a call to a worker waits for its first answer (so that
    it does not compete with it, e.g. the first request of the load that made room for
    it); one claimed before then is not sent it, and loads and serves as a cold one does."""
    config = dataclasses.replace(TEST_FACTORY_CONFIG, spare_workers=1, warm=("onnx",))
    factory = WorkerFactory(config)
    await factory.start()
    # What a call sent to one of the factory's workers and not yet answered registers.
    waiting = factory.answers.begin()
    instance = ProcessInstance(factory)
    try:
        spare_pid = await _one_spare(factory)
        await asyncio.sleep(0.3)
        assert factory.warm_spare_pids == [], "the Warm did not wait for the answer"
        info = await instance.start(StartRequest(onnx_spec(onnx_dirs["identity"])))
        assert instance.pid == spare_pid
        assert info.details["warmed_runtimes"] == []
        x = np.ones((2, 4), np.float32)
        np.testing.assert_array_equal((await instance.infer({"x": x}, 5.0))["y"], x)
    finally:
        waiting.end()
        await instance.stop()
        await factory.close()


async def test_a_refill_waits_for_the_first_answer_of_the_load_that_claimed_a_spare(
    onnx_dirs: dict[str, Path],
) -> None:
    """The next spare is made once the claiming model's first request has had its answer
    (a generative model's first token), not beside it; then it is made and warmed."""
    config = dataclasses.replace(TEST_FACTORY_CONFIG, spare_workers=1, warm=("onnx",))
    factory = WorkerFactory(config)
    await factory.start()
    instance = ProcessInstance(factory)
    try:
        await _warm_sent(factory, await _one_spare(factory))
        await instance.start(StartRequest(fault_spec("FaultyModel")))
        slow = np.full((1, 1), SLOW, np.float32)  # answered after 0.3 s
        call = asyncio.ensure_future(instance.infer({"x": slow}, 5.0))
        while not call.done():  # past the refill's own 0.1 s delay
            assert factory.spare_pids == [], "a spare was made beside the first request"
            await asyncio.sleep(0.01)
        await call
        await _warm_sent(factory, await _one_spare(factory))
    finally:
        await instance.stop()
        await factory.close()


def test_the_factory_warms_the_repositorys_warmable_runtimes_only() -> None:
    assert WorkerFactory.for_runtimes(["onnx", "sklearn"], 1).config.warm == ("onnx",)
    assert WorkerFactory.for_runtimes(["llama_cpp", "python"], 1).config.warm == ("llama_cpp",)
    assert WorkerFactory.for_runtimes(["python"], 1).config.warm == ()
    assert WorkerFactory.for_runtimes([], 1).config.warm == ("onnx",), "discovered: onnx"
