"""share_weights: replicas of one model with external-data weights share their pages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelyard.workers.factory import WorkerFactory
from modelyard.workers.instance import StartRequest
from modelyard.workers.process import ProcessInstance

from .conftest import Starter, onnx_spec

SIDE = 2048
WEIGHTS_BYTES = SIDE * SIDE * 4  # 16 MiB


@pytest.fixture(scope="module")
def big_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``y = x @ w`` with ``w`` random FP32 [2048, 2048] stored as ONNX external data."""
    version_dir = tmp_path_factory.mktemp("big") / "1"
    version_dir.mkdir()
    w = np.random.default_rng(0).standard_normal((SIDE, SIDE)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", SIDE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", SIDE])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(
        model,
        str(version_dir / "model.onnx"),
        save_as_external_data=True,
        location="weights.bin",
        size_threshold=1024,
    )
    return version_dir


@pytest.mark.parametrize(
    ("share", "low", "high"),
    [(False, 0.9, 1.2), (True, 0.4, 0.65)],
    ids=["private", "shared"],
)
async def test_two_replicas_pss_per_worker(
    start_instance: Starter,
    onnx_dirs: dict[str, Path],
    big_model: Path,
    share: bool,
    low: float,
    high: float,
) -> None:
    empty = await start_instance(onnx_spec(onnx_dirs["identity"]))
    replicas = [await start_instance(onnx_spec(big_model, share_weights=share)) for _ in range(2)]
    x = np.ones((1, SIDE), np.float32)
    results = [await r.infer({"x": x}, timeout_s=10.0) for r in replicas]
    np.testing.assert_array_equal(results[0]["y"], results[1]["y"])

    base = await empty.sample_memory()
    for replica in replicas:
        sample = await replica.sample_memory()
        # PSS above a worker serving an empty model, sampled together so that the shared
        # libraries divide among the same processes: the model's share of memory.
        model_pss = sample.pss_bytes - base.pss_bytes
        assert low * WEIGHTS_BYTES < model_pss < high * WEIGHTS_BYTES, (share, model_pss)


async def test_a_sharing_replica_reports_its_mapped_weights_apart(
    factory: WorkerFactory, big_model: Path
) -> None:
    # The only mapper of the file holds its pages privately (they count in its USS); the
    # footprint must leave them out, since the budget charges the file once by itself.
    instance = ProcessInstance(factory)
    try:
        info = await instance.start(StartRequest(onnx_spec(big_model, share_weights=True)))
        mapped = info.details["mapped_weight_private_bytes"]
        assert isinstance(mapped, int)
        assert 0.9 * WEIGHTS_BYTES < mapped <= 1.01 * WEIGHTS_BYTES, mapped
        assert info.footprint_bytes < 0.5 * WEIGHTS_BYTES, info.footprint_bytes
    finally:
        await instance.stop()
