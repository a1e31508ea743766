"""How a node of Ray's table becomes devices: names and budgets from its resources."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="Ray mode needs the 'ray' extra")

from modelyard.config.ray import RayConfig
from modelyard.workers.cluster_nodes import NodeDevice
from modelyard.workers.ray_cluster import read_node

MIB = 1 << 20
NODE_ID = "f0e1d2c3b4a5968778695a4b3c2d1e0f"


def test_name_and_budgets_come_from_the_node_resources() -> None:
    raw = {
        "NodeID": NODE_ID,
        "Alive": True,
        "Resources": {
            "CPU": 8.0,
            "GPU": 2.0,
            "memory": 64e9,
            "modelyard.node.gpu-a": 1.0,
            "modelyard.memory_mb": 4096.0,
            "modelyard.gpu_memory_mb": 20000.0,
        },
    }
    node = read_node(raw, RayConfig(budget_share=0.5))
    assert node.name == "gpu-a"
    assert node.devices == (
        NodeDevice("cpu", 2048 * MIB),
        NodeDevice("cuda:0", 10000 * MIB),
        NodeDevice("cuda:1", 10000 * MIB),
    )
    assert node.device_names() == ["gpu-a/cpu", "gpu-a/cuda:0", "gpu-a/cuda:1"]


def test_defaults_a_cpu_less_head_and_a_gpu_without_a_budget() -> None:
    head = read_node({"NodeID": NODE_ID, "Alive": True, "Resources": {"memory": 8e9}}, RayConfig())
    assert head.name == NODE_ID[:8]
    assert head.devices == ()  # no CPUs: no actor may run there
    raw = {"NodeID": NODE_ID, "Alive": False, "Resources": {"CPU": 2.0, "GPU": 1.0, "memory": 8e9}}
    node = read_node(raw, RayConfig())
    assert not node.alive
    cpu, gpu = node.devices
    assert cpu == NodeDevice("cpu", int(4e9))  # half of the memory Ray reports
    assert gpu.budget_bytes == 0
    assert "modelyard.gpu_memory_mb" in gpu.unusable_reason
