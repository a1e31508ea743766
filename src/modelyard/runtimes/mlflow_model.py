"""Reading an MLflow model folder without MLflow: the ``MLmodel`` file, its signature and
the MLflow version its requirements pin.

Kept apart from the runtime so that routing a native flavour to modelyard's own runtime
(and describing what is missing) never imports ``mlflow``, which is slow to import and
an optional extra.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from modelyard.runtimes.base import TensorSpec

MLMODEL = "MLmodel"
"""The file that makes a folder an MLflow model."""

# MLflow column types (mlflow.types.DataType) to protocol datatypes.
_COLUMN_TYPES: dict[str, str] = {
    "boolean": "BOOL",
    "integer": "INT32",
    "long": "INT64",
    "float": "FP32",
    "double": "FP64",
    "string": "BYTES",
    "binary": "BYTES",
    "datetime": "BYTES",
}

# numpy dtype names in MLflow tensor specs to protocol datatypes.
_TENSOR_TYPES: dict[str, str] = {
    "bool": "BOOL",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "str": "BYTES",
    "object": "BYTES",
    "bytes": "BYTES",
}

_PIN = re.compile(r"^\s*(mlflow(?:-skinny)?)\s*==\s*([A-Za-z0-9.+-]+)")


@dataclass(frozen=True)
class Schema:
    """One side of a signature as protocol tensors; ``columns`` when column-based."""

    tensors: list[TensorSpec]
    columns: bool
    """True for a column-based schema (one [batch] tensor per DataFrame column)."""


@dataclass(frozen=True)
class MLflowModel:
    """What modelyard needs from an ``MLmodel`` file."""

    folder: Path
    flavors: dict[str, dict[str, Any]]
    mlflow_version: str
    """The version that saved the model (``mlflow_version`` in ``MLmodel``)."""
    pinned: str
    """The MLflow requirement of the model's ``requirements.txt`` (``mlflow==X``), or ''."""
    inputs: Schema | None
    outputs: Schema | None
    extra: dict[str, Any] = field(default_factory=dict)


def _schema(text: object, side: str) -> Schema | None:
    if not text:
        return None
    items = json.loads(str(text))
    specs: list[TensorSpec] = []
    columns = bool(items) and all(item.get("type") != "tensor" for item in items)
    default = "input" if side == "inputs" else "predict"
    for i, item in enumerate(items):
        name = item.get("name") or (default if len(items) == 1 else f"{default}-{i}")
        if item.get("type") == "tensor":
            tensor = item["tensor-spec"]
            datatype = _TENSOR_TYPES.get(str(tensor["dtype"]), "BYTES")
            shape = tuple(int(d) for d in tensor.get("shape", [-1]))
        else:
            if item.get("type") not in _COLUMN_TYPES:
                raise ValueError(f"MLflow {side} column {name!r} has type {item.get('type')!r}")
            datatype = _COLUMN_TYPES[item["type"]]
            shape = (-1,)
        specs.append(TensorSpec(str(name), datatype, shape))
    return Schema(specs, columns)


def pinned_mlflow(folder: Path) -> str:
    """``mlflow==X`` (or ``mlflow-skinny==X``) from the model's ``requirements.txt``."""
    path = folder / "requirements.txt"
    if not path.is_file():
        return ""
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _PIN.match(line)
        if match:
            return f"{match.group(1)}=={match.group(2)}"
    return ""


def read_mlmodel(folder: Path) -> MLflowModel:
    """Parse ``folder/MLmodel``; raises ``FileNotFoundError`` or ``ValueError``."""
    path = folder / MLMODEL
    if not path.is_file():
        raise FileNotFoundError(f"no {MLMODEL} file in {folder} (not an MLflow model folder)")
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("flavors"), dict):
        raise ValueError(f"{path} has no 'flavors' mapping")
    signature = doc.get("signature") or {}
    return MLflowModel(
        folder=folder,
        flavors={str(k): dict(v or {}) for k, v in doc["flavors"].items()},
        mlflow_version=str(doc.get("mlflow_version", "")),
        pinned=pinned_mlflow(folder),
        inputs=_schema(signature.get("inputs"), "inputs"),
        outputs=_schema(signature.get("outputs"), "outputs"),
    )


def installed_mlflow() -> str | None:
    """The installed MLflow version (full or skinny distribution), without importing it."""
    for dist in ("mlflow", "mlflow-skinny"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def missing_mlflow_message(model: MLflowModel) -> str:
    """What to install to load ``model``'s pyfunc flavour on a server without MLflow."""
    wanted = model.pinned or (f"mlflow=={model.mlflow_version}" if model.mlflow_version else "")
    pin = f" and pins {wanted} in its requirements" if wanted else ""
    version = wanted.partition("==")[2]
    skinny = f"mlflow-skinny=={version}" if version else "mlflow-skinny"
    return (
        f"MLflow is not installed on this server: the model's pyfunc flavour needs it{pin}; "
        f"install the mlflow extra (pip install 'modelyard[mlflow]', or '{skinny}' with "
        "pandas) or save the model with a flavour modelyard serves natively "
        "(onnx, xgboost, lightgbm text, sklearn)"
    )


def version_note(model: MLflowModel, installed: str | None) -> str:
    """'' when the installed MLflow matches the model's pin, else a sentence saying both."""
    wanted = model.pinned.partition("==")[2] or model.mlflow_version
    if not wanted or installed is None or wanted == installed:
        return ""
    return f"the model pins MLflow {wanted}; this server has MLflow {installed}"
