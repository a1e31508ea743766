"""Fixtures for worker-process tests: ONNX models built here, a factory, tracked instances."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import psutil
import pytest
from onnx import TensorProto, helper

from modelyard.runtimes.base import RuntimeSpec
from modelyard.workers.factory import WorkerFactory, WorkerFactoryConfig
from modelyard.workers.forkserver import preload_for
from modelyard.workers.instance import StartRequest
from modelyard.workers.process import ProcessInstance

FAKES_DIR = Path(__file__).resolve().parents[2] / "fakes"
"""Holds ``fault_models.py``; used as the version folder of ``runtime: python`` models."""

TYPES = {
    "f32": TensorProto.FLOAT,
    "f16": TensorProto.FLOAT16,
    "f64": TensorProto.DOUBLE,
    "i8": TensorProto.INT8,
    "i32": TensorProto.INT32,
    "i64": TensorProto.INT64,
    "u8": TensorProto.UINT8,
    "b": TensorProto.BOOL,
    "s": TensorProto.STRING,
}
"""Inputs of the ``types`` model, each echoed as ``<name>_out``."""

MLP_IN = 16


def _save(model: onnx.ModelProto, path: Path) -> Path:
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


def _opset() -> list[onnx.OperatorSetIdProto]:
    return [helper.make_opsetid("", 17)]


def build_identity(path: Path) -> Path:
    """``y = x``, FP32 [batch, 4]."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    return _save(helper.make_model(graph, opset_imports=_opset()), path)


def build_types(path: Path) -> Path:
    """Echo of one [batch, 2] input per datatype, strings included."""
    graph = helper.make_graph(
        [helper.make_node("Identity", [n], [f"{n}_out"]) for n in TYPES],
        "types",
        [helper.make_tensor_value_info(n, t, ["batch", 2]) for n, t in TYPES.items()],
        [helper.make_tensor_value_info(f"{n}_out", t, ["batch", 2]) for n, t in TYPES.items()],
    )
    return _save(helper.make_model(graph, opset_imports=_opset()), path)


def build_mlp(path: Path, seed: int = 0) -> Path:
    """``relu(x @ w1 + b1) @ w2`` with random weights, FP32 [batch, 16] → [batch, 8]."""
    rng = np.random.default_rng(seed)
    w1 = helper.make_tensor(
        "w1",
        TensorProto.FLOAT,
        [MLP_IN, 32],
        rng.standard_normal(MLP_IN * 32).astype(np.float32).tolist(),
    )
    b1 = helper.make_tensor(
        "b1", TensorProto.FLOAT, [32], rng.standard_normal(32).astype(np.float32).tolist()
    )
    w2 = helper.make_tensor(
        "w2", TensorProto.FLOAT, [32, 8], rng.standard_normal(32 * 8).astype(np.float32).tolist()
    )
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"]),
            helper.make_node("Add", ["h", "b1"], ["hb"]),
            helper.make_node("Relu", ["hb"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", MLP_IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        initializer=[w1, b1, w2],
    )
    return _save(helper.make_model(graph, opset_imports=_opset()), path)


@pytest.fixture(scope="session")
def onnx_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Version folders of the ``identity``, ``types`` and ``mlp`` models."""
    root = tmp_path_factory.mktemp("worker-models")
    build_identity(root / "identity" / "1" / "model.onnx")
    build_types(root / "types" / "1" / "model.onnx")
    build_mlp(root / "mlp" / "1" / "model.onnx")
    return {name: root / name / "1" for name in ("identity", "types", "mlp")}


def onnx_spec(version_dir: Path, name: str = "m", *, share_weights: bool = False) -> RuntimeSpec:
    """A spec for the ONNX model in ``version_dir``."""
    return RuntimeSpec("onnx", str(version_dir), model_name=name, share_weights=share_weights)


def fault_spec(cls: str) -> RuntimeSpec:
    """A spec for ``fault_models:<cls>``."""
    return RuntimeSpec("python", str(FAKES_DIR), model_name=cls, python_class=f"fault_models:{cls}")


TEST_FACTORY_CONFIG = WorkerFactoryConfig(watchdog_interval_s=0.1, stop_grace_s=1.0)


def llama_factory_config(**fields: Any) -> WorkerFactoryConfig:
    """The test factory with llama.cpp preloaded and no spare worker unless ``fields`` say."""
    return dataclasses.replace(
        TEST_FACTORY_CONFIG, **{"preload": preload_for(["llama_cpp"]), "spare_workers": 0, **fields}
    )


@pytest.fixture
async def factory() -> AsyncIterator[WorkerFactory]:
    """A started factory (fork server), closed after the test."""
    f = WorkerFactory(TEST_FACTORY_CONFIG)
    await f.start()
    yield f
    await f.close()


Starter = Callable[..., Awaitable[ProcessInstance]]


@contextlib.asynccontextmanager
async def instances_on(factory: WorkerFactory) -> AsyncIterator[Starter]:
    """A starter of instances on ``factory`` (or the ``on`` it is given); on exit every
    instance is stopped and its process must be gone."""
    started: list[ProcessInstance] = []

    async def start(
        spec: RuntimeSpec, memory_limit_bytes: int | None = None, on: WorkerFactory | None = None
    ) -> ProcessInstance:
        instance = ProcessInstance(on or factory)
        started.append(instance)
        await instance.start(StartRequest(spec, memory_limit_bytes=memory_limit_bytes))
        return instance

    yield start
    for instance in started:
        await instance.stop()
    for instance in started:
        assert instance.pid is None or is_gone(instance.pid), f"{instance.pid} outlived stop()"


@pytest.fixture
async def start_instance(factory: WorkerFactory) -> AsyncIterator[Starter]:
    """``await start_instance(spec, memory_limit_bytes=None)``: a started instance.

    At teardown every instance is stopped and its process must be gone.
    """
    async with instances_on(factory) as start:
        yield start


def is_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie not yet reaped counts as gone, and so does
    one its parent is reaping right now: state X, dead)."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True
