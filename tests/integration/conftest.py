"""A real model repository built once per session: ONNX and scikit-learn models."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    fakes = Path(__file__).resolve().parents[1] / "fakes" / "models.py"
    for name in ("faulty", "echo", "failing-load", "leaky"):
        (root / name / "1").mkdir(parents=True)
        # Each python model gets its own module name: one process may import several.
        module = name.replace("-", "_") + "_model.py"
        (root / name / "1" / module).write_text(fakes.read_text(encoding="utf-8"))
    return root


def python_model(name: str, cls: str, **fields: object) -> dict[str, object]:
    """Config entry of a fault model copied into the repository by ``model_root``."""
    module = name.replace("-", "_") + "_model"
    return {"name": name, "path": name, "runtime": "python", "class": f"{module}:{cls}", **fields}
