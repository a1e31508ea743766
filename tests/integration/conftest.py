"""A real model repository built once per session: ONNX and scikit-learn models."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from modelyard.examples.mlp import build_add_onnx, build_mlp_onnx
from modelyard.examples.sklearn_models import export_sklearn_onnx, train_digits_classifier


@pytest.fixture(scope="session")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``digits-logreg`` (sklearn→ONNX), ``mlp`` (2 MB), ``add`` (versions 1 and 2)."""
    root = tmp_path_factory.mktemp("repo")
    est = train_digits_classifier("logreg")
    export_sklearn_onnx(est, 64, root / "digits-logreg" / "1" / "model.onnx")
    build_mlp_onnx(root / "mlp" / "1" / "model.onnx", 2)
    build_add_onnx(root / "add" / "1" / "model.onnx", 1.0)
    build_add_onnx(root / "add" / "2" / "model.onnx", 2.0)
    (root / "corrupt" / "1").mkdir(parents=True)
    (root / "corrupt" / "1" / "model.onnx").write_bytes(b"this is not an onnx file")
    build_types_onnx(root / "types" / "1" / "model.onnx")
    fakes = Path(__file__).resolve().parents[1] / "fakes" / "fault_models.py"
    for name in ("faulty", "echo", "failing-load", "leaky", "paced", "doubling", "rows"):
        (root / name / "1").mkdir(parents=True)
        # Each python model gets its own module name: one process may import several.
        module = name.replace("-", "_") + "_model.py"
        (root / name / "1" / module).write_text(fakes.read_text(encoding="utf-8"))
    return root


TYPES = {
    "f32": ("FP32", TensorProto.FLOAT),
    "f16": ("FP16", TensorProto.FLOAT16),
    "f64": ("FP64", TensorProto.DOUBLE),
    "i8": ("INT8", TensorProto.INT8),
    "i32": ("INT32", TensorProto.INT32),
    "i64": ("INT64", TensorProto.INT64),
    "u8": ("UINT8", TensorProto.UINT8),
    "b": ("BOOL", TensorProto.BOOL),
    "s": ("BYTES", TensorProto.STRING),
}
"""Input name → (protocol datatype, ONNX type) of the ``types`` model."""


def build_types_onnx(path: Path) -> Path:
    """An ONNX model echoing one [batch, 2] input of every datatype as ``<name>_out``."""
    nodes = [helper.make_node("Identity", [n], [f"{n}_out"]) for n in TYPES]
    graph = helper.make_graph(
        nodes,
        "types",
        [helper.make_tensor_value_info(n, t, ["batch", 2]) for n, (_, t) in TYPES.items()],
        [helper.make_tensor_value_info(f"{n}_out", t, ["batch", 2]) for n, (_, t) in TYPES.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


def python_model(name: str, cls: str, **fields: object) -> dict[str, object]:
    """Config entry of a fault model copied into the repository by ``model_root``."""
    module = name.replace("-", "_") + "_model"
    return {"name": name, "path": name, "runtime": "python", "class": f"{module}:{cls}", **fields}


@pytest.fixture(scope="module")
def llm_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tiny GGUF llamas (``llama-a``, ``llama-b``) for the generation tests."""
    from tests.integration.llm_models import build_llm_repository

    return build_llm_repository(tmp_path_factory.mktemp("llm"))


@pytest.fixture(scope="module")
def expected(llm_root: Path) -> list[int]:
    """``N_TOKENS`` greedy tokens of llama-cpp-python itself on ``llama-a`` and ``PROMPT``."""
    from tests.integration.llm_models import N_TOKENS, PROMPT, reference_tokens

    return reference_tokens(llm_root / "llama-a" / "1" / "model.gguf", PROMPT, N_TOKENS)
