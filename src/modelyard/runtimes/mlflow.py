"""MLflow model folders (an ``MLmodel`` file).

A native flavour modelyard serves itself (ONNX, XGBoost JSON/UBJ, LightGBM text,
scikit-learn) is routed to modelyard's own runtime: no MLflow import, no pandas round
trip, and ``predict_proba`` beside ``predict`` (``bench/mlflow_routes.py`` measures
the difference). Anything else loads through ``mlflow.pyfunc`` (the ``mlflow`` extra),
with the model's signature as its v2 metadata. pyfunc runs the model's own code
(cloudpickle, custom ``python_model`` classes), so it needs ``trusted: true``.

``options: {flavor: pyfunc}`` forces pyfunc; ``flavor: <name>`` forces one native
flavour; the default ``auto`` takes the first native flavour that applies.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from modelyard.protocol.datatypes import numpy_dtype, v2_datatype
from modelyard.runtimes.base import Runtime, RuntimeSpec, TensorSpec
from modelyard.runtimes.lightgbm import is_lightgbm_model
from modelyard.runtimes.mlflow_model import (
    MLflowModel,
    Schema,
    installed_mlflow,
    missing_mlflow_message,
    read_mlmodel,
    version_note,
)
from modelyard.runtimes.warmup import make_warmup_inputs

NATIVE_FLAVORS = ("onnx", "xgboost", "lightgbm", "sklearn")
"""Flavours routed to modelyard's own runtimes, in order of preference."""


def native_route(model: MLflowModel, wanted: str = "auto") -> tuple[str, str] | None:
    """``(runtime kind, file)`` of the native flavour to serve ``model`` with, or None."""
    for flavor in NATIVE_FLAVORS if wanted == "auto" else (wanted,):
        conf = model.flavors.get(flavor)
        if conf is None:
            continue
        if flavor == "onnx" and str(conf.get("data", "")).endswith(".onnx"):
            return "onnx", str(conf["data"])
        if flavor == "xgboost" and str(conf.get("data", "")).endswith((".json", ".ubj")):
            return "xgboost", str(conf["data"])
        if flavor == "lightgbm" and is_lightgbm_model(model.folder / str(conf.get("data", ""))):
            return "lightgbm", str(conf["data"])
        if flavor == "sklearn" and conf.get("serialization_format") in (
            "skops",
            "cloudpickle",
            "pickle",
        ):
            return "sklearn", str(conf["pickled_model"])
    return None


def _column(values: np.ndarray, spec: TensorSpec) -> Any:
    if spec.datatype == "BYTES":
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values.reshape(-1)]
    return values.reshape(-1)


def _as_datatype(value: Any, spec: TensorSpec | None) -> np.ndarray:
    arr = np.asarray(value)
    if spec is None:
        return arr
    if spec.datatype == "BYTES":
        out = np.empty(arr.shape, dtype=object)
        out.reshape(-1)[:] = [v if isinstance(v, bytes) else str(v).encode() for v in arr.flat]
        return out
    return arr.astype(numpy_dtype(spec.datatype), copy=False)


class _Pyfunc:
    """A model loaded with ``mlflow.pyfunc``; tensors from its signature."""

    def __init__(self, model: MLflowModel, pyfunc: Any) -> None:
        if model.inputs is None:
            raise ValueError(
                f"the MLflow model in {model.folder} has no input signature; log it with "
                "one (mlflow.models.infer_signature) so its inputs can be described"
            )
        self._inputs: Schema = model.inputs
        self._pyfunc = pyfunc
        self.inputs = model.inputs.tensors
        self.outputs = model.outputs.tensors if model.outputs else []
        if not self.outputs:
            # No output signature: one probe call on generated inputs says what comes back.
            probe = self._convert(self._predict(make_warmup_inputs(self.inputs)), [])
            self.outputs = [
                TensorSpec(name, v2_datatype(arr.dtype), (-1, *arr.shape[1:]))
                for name, arr in probe.items()
            ]

    def _predict(self, inputs: dict[str, np.ndarray]) -> Any:
        if self._inputs.columns:
            import pandas as pd

            frame = pd.DataFrame({t.name: _column(inputs[t.name], t) for t in self.inputs})
            return self._pyfunc.predict(frame)
        if len(self.inputs) == 1:
            return self._pyfunc.predict(inputs[self.inputs[0].name])
        return self._pyfunc.predict({t.name: inputs[t.name] for t in self.inputs})

    def _convert(self, result: Any, specs: list[TensorSpec]) -> dict[str, np.ndarray]:
        by_name = {s.name: s for s in specs}
        if hasattr(result, "columns") and hasattr(result, "to_numpy"):  # a DataFrame
            names = [str(c) for c in result.columns]
            if len(names) == 1 and len(specs) == 1:
                return {specs[0].name: _as_datatype(result.to_numpy()[:, 0], specs[0])}
            return {
                n: _as_datatype(result[c].to_numpy(), by_name.get(n))
                for n, c in zip(names, result.columns, strict=True)
            }
        if isinstance(result, dict):
            return {str(k): _as_datatype(v, by_name.get(str(k))) for k, v in result.items()}
        name = specs[0].name if len(specs) == 1 else "predict"
        return {name: _as_datatype(result, by_name.get(name))}

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._convert(self._predict(inputs), self.outputs)


class MLflowRuntime:
    """An MLflow model folder: a native flavour on modelyard's runtime, else pyfunc."""

    def __init__(self) -> None:
        self._native: Runtime | None = None
        self._pyfunc: _Pyfunc | None = None
        self.route = ""
        """The flavour serving the model (``onnx``, ``xgboost``, … or ``pyfunc``)."""

    @property
    def inputs(self) -> list[TensorSpec]:
        """The native runtime's inputs, or the signature's."""
        if self._native is not None:
            return self._native.inputs
        return self._pyfunc.inputs if self._pyfunc else []

    @property
    def outputs(self) -> list[TensorSpec]:
        """The native runtime's outputs, or the signature's."""
        if self._native is not None:
            return self._native.outputs
        return self._pyfunc.outputs if self._pyfunc else []

    @property
    def supports_batching(self) -> bool:
        """True when every tensor has a free first dimension."""
        if self._native is not None:
            return self._native.supports_batching
        return all(t.shape and t.shape[0] == -1 for t in (*self.inputs, *self.outputs))

    def load(self, spec: RuntimeSpec) -> None:
        """Read ``MLmodel``; load the native flavour or the pyfunc flavour."""
        from modelyard.runtimes import create_runtime

        folder = Path(spec.version_dir)
        model = read_mlmodel(folder)
        wanted = spec.options.get("flavor", "auto")
        route = None if wanted == "pyfunc" else native_route(model, wanted)
        if route is None and wanted not in ("auto", "pyfunc"):
            raise ValueError(f"the MLflow model in {folder} has no usable {wanted!r} flavour")
        if route is not None:
            kind, model_file = route
            native = create_runtime(kind)
            native.load(dataclasses.replace(spec, kind=kind, model_file=model_file))
            self._native, self.route = native, kind
            return
        if "python_function" not in model.flavors:
            raise ValueError(
                f"the MLflow model in {folder} has neither a pyfunc nor a native "
                f"flavour modelyard serves (flavours: {', '.join(model.flavors)})"
            )
        if not spec.trusted:
            raise ValueError(
                "MLflow's pyfunc flavour runs the model's own code when it loads (cloudpickle, "
                "custom classes); set 'trusted: true' only if you made this model"
            )
        try:
            with warnings.catch_warnings():
                # MLflow warns about its own type hints on import; nothing a user can fix.
                warnings.simplefilter("ignore")
                import mlflow.pyfunc
        except ImportError as exc:
            raise ModuleNotFoundError(missing_mlflow_message(model)) from exc
        try:
            pyfunc = mlflow.pyfunc.load_model(str(folder))
        except Exception as exc:
            note = version_note(model, installed_mlflow())
            if not note:
                raise
            raise RuntimeError(f"{type(exc).__name__}: {exc} ({note})") from exc
        self._pyfunc, self.route = _Pyfunc(model, pyfunc), "pyfunc"

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the native runtime, or ``pyfunc.predict`` on a DataFrame / arrays."""
        if self._native is not None:
            return self._native.infer(inputs)
        if self._pyfunc is None:
            raise RuntimeError("model not loaded")
        return self._pyfunc.infer(inputs)

    def close(self) -> None:
        """Drop what was loaded."""
        if self._native is not None:
            self._native.close()
        self._native = None
        self._pyfunc = None
