"""Ray mode on a local cluster (head + nodes ``a`` and ``b`` as separate processes).

One cluster for the module, so the tests run in this order: models spread across nodes
by budget; two ingresses share one set of workers; a node killed under load; a node
that joins adds its budget.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.ray.conftest import add_body, add_model, expected, node_args
from tests.servers import write_config

ray = pytest.importorskip("ray", reason="Ray mode needs the 'ray' extra")

from ray.cluster_utils import Cluster  # noqa: E402

from modelyard.config.settings import load_settings  # noqa: E402
from modelyard.manager.states import ModelState  # noqa: E402
from modelyard.ray_app import RayApp  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

_MIB = 1 << 20


@contextlib.asynccontextmanager
async def ray_server(
    config: Path, **ray_fields: Any
) -> AsyncIterator[tuple[RayApp, httpx.AsyncClient]]:
    """A server in Ray mode on 127.0.0.1 (the test process is already the driver)."""
    settings = load_settings(
        config,
        host="127.0.0.1",
        http_port=0,
        grpc_port=None,
        ray={"address": "auto", "poll_interval_s": 0.25, **ray_fields},
    )
    app = RayApp(settings)
    await app.start()
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{app.http_port}", timeout=30
        ) as client:
            yield app, client
    finally:
        await app.stop()


def check_budgets(app: RayApp) -> None:
    """Invariant 1 on every node's device."""
    for name, dev in app.manager.budget.devices.items():
        assert dev.reserved_bytes <= dev.budget_bytes, name


async def test_models_spread_across_nodes_by_budget(cluster: Cluster, add_root: Path) -> None:
    # 150 MiB declared each, 400 MiB per node: at most two per node when placed.
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
        assert record.state is ModelState.READY
