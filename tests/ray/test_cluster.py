"""Ray mode on a local cluster (head + nodes ``a`` and ``b`` as separate processes).

One cluster for the module, so the tests run in this order: models spread across nodes
by budget; two ingresses share one set of workers; a node killed under load; a node
that joins adds its budget.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ray.conftest import LocalCluster, add_body, add_model, expected, ray_server
from tests.servers import write_config

ray = pytest.importorskip("ray", reason="Ray mode needs the 'ray' extra")

from modelyard.manager.states import ModelState  # noqa: E402
from modelyard.ray_app import RayApp  # noqa: E402

# 300 s: the first test also starts the cluster, which may be tried twice (conftest).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

_MIB = 1 << 20


def check_budgets(app: RayApp) -> None:
    """Invariant 1 on every node's device."""
    for name, dev in app.manager.budget.devices.items():
        assert dev.reserved_bytes <= dev.budget_bytes, name


async def test_models_spread_across_nodes_by_budget(cluster: LocalCluster, add_root: Path) -> None:
    # 120 MiB declared each, 400 MiB per node: at most three per node when placed.
    models = [add_model(k, preload=True) for k in range(1, 5)]
    config = write_config(add_root, models)
    async with ray_server(config) as (app, client):
        assert sorted(app.manager.devices.devices) == ["a/cpu", "b/cpu"]
        assert app.manager.budget.device("a/cpu").budget_bytes == 400 * _MIB
        for k in range(1, 5):
            r = await client.post(f"/v2/models/add-{k}/infer", json=add_body())
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == expected(k)
        placed = {str(r.key): r.device for r in app.manager.records()}
        assert set(placed.values()) == {"a/cpu", "b/cpu"}, placed
        check_budgets(app)
        # Each replica is a Ray actor on its node, verified there.
        record = app.manager.record_for("add-1", "1")
        assert record.info is not None
        assert record.info.details["ray_node"] == record.device.split("/")[0]
        # Loads claim the idle actors started ahead on each node (ray.spare_actors).
        spares = [r.info.details["from_spare"] for r in app.manager.records() if r.info]
        assert any(spares), spares
        assert record.state is ModelState.READY


def named_actors() -> list[str]:
    """Names of the live named actors of the namespace (shared workers)."""
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True))


async def test_two_ingresses_share_one_set_of_workers(
    cluster: LocalCluster, add_root: Path
) -> None:
    config = write_config(add_root, [add_model(1, preload=True)])
    shared = {"shared_workers": True, "budget_share": 0.5}
    async with ray_server(config, **shared) as (one, client_one):
        async with ray_server(config, **shared) as (two, client_two):
            # Each ingress spends half of each node's budget.
            assert one.manager.budget.device("a/cpu").budget_bytes == 200 * _MIB
            first = one.manager.record_for("add-1", "1")
            second = two.manager.record_for("add-1", "1")
            assert first.device == second.device
            assert named_actors() == [f"add-1:1@{first.device}"]
            assert first.info is not None
            assert second.info is not None
            assert first.info.details["actor_pid"] == second.info.details["actor_pid"]
            for client in (client_one, client_two):
                r = await client.post("/v2/models/add-1/infer", json=add_body())
                assert r.json()["outputs"][0]["data"] == expected(1)
        # The first ingress's lease keeps the shared worker alive.
        r = await client_one.post("/v2/models/add-1/infer", json=add_body(2))
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == expected(1, 2)
    # The last lease released stops the actor.
    for _ in range(50):
        if not named_actors():
            break
        await asyncio.sleep(0.1)
    assert named_actors() == []


# "doesn't exist any more": a restart sent to the node in the moment it died, before the
# node table said so, is refused by Ray's scheduler; that load fails with a 503 and the
# model is placed again on a live node (the test checks it recovers).
_TYPED_503 = (
    "died",
    "not ready",
    "is loading",
    "restarting",
    "was lost",
    "doesn't exist any more",
    # A restart sent to the dying node fails its load; a request routed to the model in
    # that moment finds its scheduler closed (never ran; typed 503).
    "closed",
)


async def test_node_killed_under_load(cluster: LocalCluster, add_root: Path) -> None:
    config = write_config(add_root, [add_model(k, preload=True) for k in range(1, 5)])
    async with ray_server(config) as (app, client):
        on_b = sorted(r.key.name for r in app.manager.records() if r.device == "b/cpu")
        assert on_b, "placement put nothing on node b"
        results: list[tuple[int, int, Any]] = []
        not_ready_seen: list[str] = []
        stop = asyncio.Event()

        async def hammer(k: int) -> None:
            while not stop.is_set():
                r = await client.post(f"/v2/models/add-{k}/infer", json=add_body())
                results.append((k, r.status_code, r.json()))

        async def watch_readiness() -> None:
            while not stop.is_set():
                for name in on_b:
                    r = await client.get(f"/v2/models/{name}/ready")
                    if r.status_code != 200:
                        not_ready_seen.append(name)
                await asyncio.sleep(0.05)

        tasks = [asyncio.create_task(hammer(k)) for k in range(1, 5) for _ in range(2)]
        tasks.append(asyncio.create_task(watch_readiness()))
        await asyncio.sleep(1.0)
        before = len(results)
        cluster.kill("b")  # from the main thread (Ray's node sets signal handlers)

        def recovered() -> bool:
            return all(
                r.state is ModelState.READY and not r.device.startswith("b/")
                for r in app.manager.records()
            )

        for _ in range(300):
            if recovered() and len(results) > before + 50:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*tasks)

        assert recovered(), [(str(r.key), r.state, r.device) for r in app.manager.records()]
        wrong = [
            (k, body)
            for k, status, body in results
            if status == 200 and body["outputs"][0]["data"] != expected(k)
        ]
        assert wrong == []
        failed = [(status, body) for _, status, body in results if status != 200]
        for status, body in failed:
            assert status == 503, (status, body)
            assert any(word in body["error"] for word in _TYPED_503), body
        # A request in flight on b when it died ran again on a live node (WorkerLostError is
        # recovered), so none is answered with the lost worker's error.
        in_flight_error = re.compile(r"model '[^']+': its worker on b/")
        lost_in_flight = [body for _, body in failed if in_flight_error.match(body["error"])]
        assert lost_in_flight == [], lost_in_flight
        events = [(e.kind, e.model, e.message) for e in app.manager.events.recent(200)]
        # Only b's models stopped being ready, and each of them did: seen by the readiness
        # poll, or, when its restart on a spare actor of a live node came back within one
        # poll, in the event log ("crashed" puts it back to LOADING).
        crashed = {name for kind, name, _ in events if kind == "crashed"}
        assert set(not_ready_seen) <= set(on_b)
        assert set(on_b) <= set(not_ready_seen) | crashed, (not_ready_seen, crashed)
        assert ("node_lost", "(cluster)", "node b was lost") in events
        moved = {name for kind, name, _ in events if kind == "moved"}
        assert moved <= set(on_b), [e for e in events if e[1] != "add-1"]
        # Every model of b is logged leaving it: "moved", or, for a restart sent to b in
        # the moment it died (refused by Ray's scheduler, a failed load), "placed" on a
        # live node by the load that followed.
        placed_away = {
            name for kind, name, msg in events if kind == "placed" and not msg.startswith("b/")
        }
        assert set(on_b) <= moved | placed_away, [e for e in events if e[1] != "add-1"]
        check_budgets(app)
        assert not app.manager.devices["b/cpu"].is_usable
        r = await client.get("/v2/health/ready")
        assert r.status_code == 200


async def test_a_node_that_joins_adds_its_budget(cluster: LocalCluster, add_root: Path) -> None:
    # add-5 declares more than node a has free once add-1 is there.
    faulty = {"name": "faulty", "path": "faulty", "runtime": "python", "memory_mb": 10}
    faulty["class"] = "faulty_model:FaultyModel"
    models = [add_model(1, preload=True), add_model(5, memory_mb=380), faulty]
    config = write_config(add_root, models)
    async with ray_server(config) as (app, client):
        assert "c/cpu" not in app.manager.devices.devices
        watcher = app.cluster_devices
        assert watcher is not None
        watcher.changed.clear()
        cluster.add("c")  # from the main thread (Ray's node sets signal handlers)
        async with asyncio.timeout(10):
            while "c/cpu" not in app.manager.devices.devices:
                await watcher.changed.wait()
                watcher.changed.clear()
        assert app.manager.budget.device("c/cpu").budget_bytes == 400 * _MIB
        r = await client.post("/v2/models/add-5/infer", json=add_body())
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == expected(5)
        first = app.manager.record_for("add-1", "1")
        fifth = app.manager.record_for("add-5", "1")
        assert first.state is ModelState.READY, "add-1 was evicted instead"
        if "b" not in cluster.nodes:
            assert fifth.device == "c/cpu"
        kinds = [(e.kind, e.model) for e in app.manager.events.recent(200)]
        assert ("node_joined", "(cluster)") in kinds
        check_budgets(app)
        await _deadlines_and_model_errors(client, app)


def _x(value: float) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [value]}]}


async def _deadlines_and_model_errors(client: httpx.AsyncClient, app: RayApp) -> None:
    """A model error comes back typed; an actor that overruns its deadline is a 504,
    is killed and restarted, and the model serves again."""
    r = await client.post("/v2/models/faulty/infer", json=_x(3.0))  # raises in the model
    assert r.status_code == 500, r.text
    assert "failing on demand" in r.json()["error"]
    hang = await client.post(
        "/v2/models/faulty/infer", json=_x(2.0), headers={"X-Modelyard-Timeout-Ms": "1500"}
    )
    assert hang.status_code == 504, hang.text
    r = await client.post("/v2/models/faulty/infer", json=_x(7.0))
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [7.0]
    crashed = [e.message for e in app.manager.events.recent(200) if e.kind == "crashed"]
    assert any("overrunning its deadline" in m for m in crashed), crashed


async def test_an_actor_the_nodes_cpus_cannot_hold_is_refused_with_the_reason(
    cluster: LocalCluster, add_root: Path
) -> None:
    # Two CPUs per actor: each 4-CPU node holds two, the cluster four; budgets would
    # take six. Without the check a fifth load waits its whole load timeout for Ray.
    models = [add_model(k, load_timeout_s=60) for k in range(1, 6)]
    config = write_config(add_root, models)
    async with ray_server(config, actor_num_cpus=2) as (app, client):
        answers = [
            await client.post(f"/v2/models/add-{k}/infer", json=add_body()) for k in range(1, 6)
        ]
        refused = [r for r in answers if r.status_code != 200]
        assert refused, [r.status_code for r in answers]
        for r in refused:
            assert "Ray cannot start model" in r.text, r.text
            assert "CPUs are held by this server's 2 actor(s)" in r.text, r.text
        served = [k for k, r in enumerate(answers, 1) if r.status_code == 200]
        assert len(served) >= 2
        for k in served:
            assert answers[k - 1].json()["outputs"][0]["data"] == expected(k)
        check_budgets(app)
