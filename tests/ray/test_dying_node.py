"""A restart sent to a node that is dying but not yet declared dead (Ray mode).

Node ``b``'s raylet is stopped (SIGSTOP: the node still counts as alive until Ray's
health checks give up on it, a few seconds) and the actors serving on ``b`` are killed.
Each model's restart then goes to ``b``, where Ray cannot start an actor, and fails once
Ray declares ``b`` dead; the next attempt moves the model to ``a``. The requests that
arrive meanwhile, or whose batch was queued for the dead actor, wait for that restart
within their deadline and are answered from ``a``: none gets an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.ray.conftest import LocalCluster, add_body, add_model, expected, ray_server
from tests.servers import write_config

ray = pytest.importorskip("ray", reason="Ray mode needs the 'ray' extra")

from modelyard.manager.states import ModelState  # noqa: E402
from modelyard.ray_app import RayApp  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def raylet_of(node: str) -> psutil.Process:
    """The raylet process of test node ``node`` (its command line names its resource)."""
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if proc.name() == "raylet" and f"modelyard.node.{node}" in " ".join(proc.cmdline()):
                return proc
    raise AssertionError(f"no raylet for node {node}")


@contextlib.contextmanager
def dying(cluster: LocalCluster, node: str) -> Iterator[None]:
    """Node ``node`` stops answering (its raylet stopped); killed on exit."""
    raylet_of(node).send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        cluster.kill(node)


def recovered(app: RayApp, names: list[str]) -> bool:
    """Every model of ``names`` is READY on a node other than ``b``."""
    records = [app.manager.record_for(n, "1") for n in names]
    return all(r.state is ModelState.READY and not r.device.startswith("b/") for r in records)


async def test_requests_wait_out_a_restart_sent_to_a_dying_node(
    cluster: LocalCluster, add_root: Path
) -> None:
    config = write_config(add_root, [add_model(k, preload=True) for k in range(1, 5)])
    # No spare actors: a spare already running on b would take the restart even with
    # b's raylet stopped; without one, the restart asks b's raylet for a worker.
    async with ray_server(config, spare_actors=0) as (app, client):
        on_b = sorted(r.key.name for r in app.manager.records() if r.device == "b/cpu")
        assert on_b, "placement put nothing on node b"
        results: list[tuple[str, int, Any]] = []
        stop = asyncio.Event()

        async def hammer(name: str) -> None:
            while not stop.is_set():
                r = await client.post(f"/v2/models/{name}/infer", json=add_body())
                results.append((name, r.status_code, r.json()))

        tasks = [asyncio.create_task(hammer(n)) for n in on_b for _ in range(3)]
        await asyncio.sleep(1.0)
        with dying(cluster, "b"):
            for name in on_b:
                record = app.manager.record_for(name, "1")
                assert record.info is not None
                os.kill(record.info.details["actor_pid"], signal.SIGKILL)
            for _ in range(600):
                if recovered(app, on_b):
                    break
                await asyncio.sleep(0.1)
            before = len(results)
            while len(results) < before + 20:
                await asyncio.sleep(0.1)
            stop.set()
            await asyncio.gather(*tasks)

        assert recovered(app, on_b), [
            (str(r.key), r.state, r.device) for r in app.manager.records()
        ]
        failed = [(name, status, body) for name, status, body in results if status != 200]
        assert failed == []
        wrong = [
            name
            for name, _, body in results
            if body["outputs"][0]["data"] != expected(int(name.split("-")[1]))
        ]
        assert wrong == []
        # The first restart of each was sent to b and failed there; a later one moved it.
        events = [(e.kind, e.model, e.message) for e in app.manager.events.recent(200)]
        attempts = {
            name: int(m.group(1))
            for kind, name, msg in events
            if kind == "restarted" and (m := re.search(r"after (\d+) attempt", msg))
        }
        assert all(attempts.get(name, 0) >= 2 for name in on_b), events
