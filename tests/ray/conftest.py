"""A local Ray cluster for the Ray-mode tests: a head and worker nodes as separate
processes on 127.0.0.1, each node with its own resources, started once per module.

Never ``ray start``: ``ray.cluster_utils.Cluster`` with loopback addresses only, the
fast health checks (a lost node is declared dead in about 1.5 s) and lean settings.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

# Read by Ray when it is imported: every Ray process of the test cluster then listens on
# 127.0.0.1 only (with node_ip_address below), and nothing is reported anywhere.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

ray = pytest.importorskip("ray", reason="Ray mode needs the 'ray' extra")

from ray.cluster_utils import Cluster  # noqa: E402

from modelyard.config.settings import load_settings  # noqa: E402
from modelyard.examples.mlp import build_add_onnx  # noqa: E402
from modelyard.ray_app import RayApp  # noqa: E402

_MIB = 1 << 20
# A killed node is declared dead within about 5 s (5 missed checks), well inside the
# node-kill test's 30 s; a node that is starting is left alone for its first 10 s, since
# on a loaded 2-core CI machine a raylet that had to answer within 1.5 s of starting was
# declared dead before it registered ("The current node timed out during startup").
HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 10_000,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 5,
}
NODE_BUDGET_MB = 400


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "ray" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.integration)


def node_args(name: str, budget_mb: float = NODE_BUDGET_MB) -> dict[str, Any]:
    """A worker node named ``name`` with a CPU budget of ``budget_mb``."""
    return {
        "num_cpus": 4,
        "resources": {f"modelyard.node.{name}": 1, "modelyard.memory_mb": budget_mb},
        "object_store_memory": 100 * _MIB,
        "node_ip_address": "127.0.0.1",
    }


@dataclass
class LocalCluster:
    """The test cluster and its worker nodes by name."""

    cluster: Cluster
    nodes: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, budget_mb: float = NODE_BUDGET_MB) -> None:
        """Start node ``name`` (a new process tree) and wait until it has joined."""
        self.nodes[name] = self.cluster.add_node(**node_args(name, budget_mb))
        self.cluster.wait_for_nodes()

    def kill(self, name: str) -> None:
        """Kill node ``name``'s processes at once (no graceful drain)."""
        self.cluster.remove_node(self.nodes.pop(name), allow_graceful=False)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Head (no CPUs: it holds no model) plus nodes ``a`` and ``b``; this process is
    its driver, shared by every server a test starts."""
    local = _start_cluster()
    try:
        ray.init(address=local.cluster.address, namespace="modelyard", log_to_driver=False)
        yield local
    finally:
        ray.shutdown()
        local.cluster.shutdown()  # type: ignore[no-untyped-call,unused-ignore]


def _start_cluster(attempts: int = 2) -> LocalCluster:
    """Head plus nodes ``a`` and ``b``. Ray gives a starting node a fixed 30 s to register
    with the head; on an overloaded machine a start may miss it, so a failed start is shut
    down and tried once more (the cluster is test scaffolding, not the code under test)."""
    for attempt in range(attempts):
        c = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "include_dashboard": False,
                "object_store_memory": 100 * _MIB,
                "node_ip_address": "127.0.0.1",
                "_system_config": HEALTH_CHECKS,
            },
        )
        local = LocalCluster(c)
        try:
            local.add("a")
            local.add("b")
        except Exception:
            c.shutdown()  # type: ignore[no-untyped-call,unused-ignore]
            if attempt == attempts - 1:
                raise
            continue
        return local
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def add_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``add-1`` … ``add-5``: ``output = input + k``, so a wrong route is a wrong answer;
    ``faulty``: the fault model of tests/fakes (raises, hangs or echoes as asked)."""
    root = tmp_path_factory.mktemp("ray-repo")
    for k in range(1, 6):
        build_add_onnx(root / f"add-{k}" / "1" / "model.onnx", float(k))
    fakes = Path(__file__).resolve().parents[1] / "fakes" / "fault_models.py"
    (root / "faulty" / "1").mkdir(parents=True)
    (root / "faulty" / "1" / "faulty_model.py").write_text(fakes.read_text(encoding="utf-8"))
    return root


def add_model(k: int, **fields: Any) -> dict[str, Any]:
    """The config of ``add-k``: 120 MiB declared, so three fit a 400 MiB node unmeasured."""
    return {"name": f"add-{k}", "path": f"add-{k}", "memory_mb": 120, **fields}


def add_body(rows: int = 1) -> dict[str, Any]:
    """A request of ``rows`` rows of ``[0, 1, 2, 3]``."""
    data = [float(i) for i in range(4)] * rows
    return {"inputs": [{"name": "input", "datatype": "FP32", "shape": [rows, 4], "data": data}]}


def expected(k: int, rows: int = 1) -> list[float]:
    """What ``add-k`` answers to :func:`add_body`."""
    return [float(i + k) for i in range(4)] * rows


@contextlib.asynccontextmanager
async def ray_server(
    config: Path, **ray_fields: Any
) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """A server in Ray mode on 127.0.0.1 (the test process is already the driver)."""
    settings = load_settings(
        config,
        host="127.0.0.1",
        http_port=0,
        grpc_port=None,
        ray={"address": "auto", "poll_interval_s": 0.25, **ray_fields},
    ).model_copy(update={"grpc_port": None})
    app = RayApp(settings)
    await app.start()
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{app.http_port}", timeout=30
        ) as client:
            yield app, client
    finally:
        await app.stop()
