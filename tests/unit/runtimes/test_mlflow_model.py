"""Reading MLmodel files without MLflow: signature to v2 tensors, routes, requirements."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from modelyard.runtimes.base import TensorSpec
from modelyard.runtimes.mlflow import native_route
from modelyard.runtimes.mlflow_model import (
    MLflowModel,
    missing_mlflow_message,
    read_mlmodel,
    version_note,
)


def _write(
    folder: Path,
    flavors: Mapping[str, object],
    signature: Mapping[str, object] | None = None,
    requirements: str = "mlflow==2.9.2\nscikit-learn==1.4.0\n",
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    doc: dict[str, object] = {"flavors": flavors, "mlflow_version": "2.9.2"}
    if signature is not None:
        doc["signature"] = {k: json.dumps(v) for k, v in signature.items()}
    (folder / "MLmodel").write_text(yaml.safe_dump(doc), encoding="utf-8")
    (folder / "requirements.txt").write_text(requirements, encoding="utf-8")
    return folder


PYFUNC = {"python_function": {"loader_module": "mlflow.sklearn", "model_path": "model.pkl"}}


def test_column_signature_becomes_one_batch_tensor_per_column(tmp_path: Path) -> None:
    columns = [
        {"type": "double", "name": "age"},
        {"type": "string", "name": "city"},
        {"type": "long", "name": "visits"},
        {"type": "boolean", "name": "member"},
    ]
    model = read_mlmodel(
        _write(tmp_path, PYFUNC, {"inputs": columns, "outputs": [{"type": "long"}]})
    )
    assert model.inputs is not None
    assert model.inputs.columns
    assert model.inputs.tensors == [
        TensorSpec("age", "FP64", (-1,)),
        TensorSpec("city", "BYTES", (-1,)),
        TensorSpec("visits", "INT64", (-1,)),
        TensorSpec("member", "BOOL", (-1,)),
    ]
    assert model.outputs is not None
    assert model.outputs.tensors == [TensorSpec("predict", "INT64", (-1,))]


def test_tensor_signature_keeps_names_dtypes_and_shapes(tmp_path: Path) -> None:
    inputs = [
        {
            "type": "tensor",
            "name": "pixels",
            "tensor-spec": {"dtype": "float32", "shape": [-1, 28, 28]},
        },
        {"type": "tensor", "name": "mask", "tensor-spec": {"dtype": "bool", "shape": [-1, 28]}},
    ]
    outputs = [{"type": "tensor", "tensor-spec": {"dtype": "float64", "shape": [-1, 10]}}]
    model = read_mlmodel(_write(tmp_path, PYFUNC, {"inputs": inputs, "outputs": outputs}))
    assert model.inputs is not None
    assert not model.inputs.columns
    assert model.inputs.tensors == [
        TensorSpec("pixels", "FP32", (-1, 28, 28)),
        TensorSpec("mask", "BOOL", (-1, 28)),
    ]
    assert model.outputs is not None
    assert model.outputs.tensors == [TensorSpec("predict", "FP64", (-1, 10))]


def test_unknown_column_type_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'decimal'"):
        read_mlmodel(_write(tmp_path, PYFUNC, {"inputs": [{"type": "decimal", "name": "x"}]}))


def test_folder_without_mlmodel_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not an MLflow model folder"):
        read_mlmodel(tmp_path)


ROUTES = [
    ({"onnx": {"data": "model.onnx"}}, ("onnx", "model.onnx")),
    ({"xgboost": {"data": "model.ubj", "model_format": "ubj"}}, ("xgboost", "model.ubj")),
    ({"xgboost": {"data": "model.xgb", "model_format": "xgb"}}, None),
    (
        {"sklearn": {"pickled_model": "model.skops", "serialization_format": "skops"}},
        ("sklearn", "model.skops"),
    ),
    ({"python_function": {"loader_module": "my_module"}}, None),
]


@pytest.mark.parametrize(
    ("flavors", "route"), ROUTES, ids=["onnx", "ubj", "old-xgb", "skops", "pyfunc"]
)
def test_native_flavours_route_to_modelyard_runtimes(
    tmp_path: Path, flavors: dict[str, object], route: tuple[str, str] | None
) -> None:
    model = read_mlmodel(_write(tmp_path, {**PYFUNC, **flavors}))
    assert native_route(model) == route


def test_lightgbm_route_needs_the_text_format(tmp_path: Path) -> None:
    folder = _write(tmp_path, {"lightgbm": {"data": "model.lgb"}})
    (folder / "model.lgb").write_bytes(b"not a text model")
    assert native_route(read_mlmodel(folder)) is None
    (folder / "model.lgb").write_text("tree\nversion=v4\nnum_class=1\n", encoding="utf-8")
    assert native_route(read_mlmodel(folder)) == ("lightgbm", "model.lgb")


def test_missing_mlflow_message_names_the_pinned_version(tmp_path: Path) -> None:
    model = read_mlmodel(_write(tmp_path, PYFUNC))
    assert model.pinned == "mlflow==2.9.2"
    message = missing_mlflow_message(model)
    assert "pins mlflow==2.9.2" in message
    assert "mlflow-skinny==2.9.2" in message
    assert "modelyard[mlflow]" in message


def test_version_note_only_when_versions_differ(tmp_path: Path) -> None:
    model: MLflowModel = read_mlmodel(_write(tmp_path, PYFUNC, requirements="mlflow-skinny==2.9.2"))
    assert model.pinned == "mlflow-skinny==2.9.2"
    assert version_note(model, "2.9.2") == ""
    assert version_note(model, None) == ""
    assert (
        version_note(model, "3.1.0") == "the model pins MLflow 2.9.2; this server has MLflow 3.1.0"
    )
