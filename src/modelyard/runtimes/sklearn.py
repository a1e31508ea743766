"""scikit-learn models: ONNX files (via skl2onnx), skops files, or trusted pickles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from modelyard.runtimes.base import RuntimeSpec, TensorSpec, find_model_file
from modelyard.runtimes.onnx import OnnxRuntime


class SklearnRuntime:
    """A scikit-learn estimator; ``.onnx`` runs on ONNX Runtime, ``.skops`` in Python.

    Raw pickle/joblib files load only with ``trusted: true``: unpickling runs
    arbitrary code, so it must be an explicit decision in the model's config.
    """

    def __init__(self) -> None:
        self._onnx: OnnxRuntime | None = None
        self._estimator: Any = None
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []

    @property
    def inputs(self) -> list[TensorSpec]:
        """One FP64 ``input`` [batch, n_features] for Python estimators."""
        return self._onnx.inputs if self._onnx else self._inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        """``predict`` (and ``predict_proba`` for classifiers)."""
        return self._onnx.outputs if self._onnx else self._outputs

    @property
    def supports_batching(self) -> bool:
        """scikit-learn estimators always take a batch of rows."""
        return self._onnx.supports_batching if self._onnx else True

    def load(self, spec: RuntimeSpec) -> None:
        """Load the single model file of the version."""
        version_dir = Path(spec.version_dir)
        path = find_model_file(version_dir, (".onnx", ".skops", ".pkl", ".joblib"), spec.model_file)
        if path.suffix == ".onnx":
            self._onnx = OnnxRuntime()
            self._onnx.load(spec)
            return
        if path.suffix == ".skops":
            import skops.io as sio

            untrusted = sio.get_untrusted_types(file=path)
            allowed = [t for t in untrusted if t.startswith(("sklearn.", "numpy."))]
            rejected = sorted(set(untrusted) - set(allowed))
            if rejected and not spec.trusted:
                raise ValueError(
                    f"{path.name} contains types that are not trusted: {', '.join(rejected)}; "
                    "set 'trusted: true' only if you made this file"
                )
            self._estimator = sio.load(path, trusted=untrusted if spec.trusted else allowed)
        else:
            if not spec.trusted:
                raise ValueError(
                    f"{path.name} is a pickle, which runs code when loaded; refusing it "
                    "unless the model's config sets 'trusted: true' (prefer .onnx or .skops)"
                )
            import joblib  # type: ignore[import-untyped]  # joblib ships no stubs

            self._estimator = joblib.load(path)
        n_features = int(getattr(self._estimator, "n_features_in_", -1))
        self._inputs = [TensorSpec("input", "FP64", (-1, n_features))]
        self._outputs = [TensorSpec("predict", "FP64", (-1,))]
        if hasattr(self._estimator, "predict_proba"):
            n_classes = len(getattr(self._estimator, "classes_", [])) or -1
            self._outputs.append(TensorSpec("predict_proba", "FP64", (-1, n_classes)))

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``predict`` and, where the estimator has it, ``predict_proba``."""
        if self._onnx is not None:
            return self._onnx.infer(inputs)
        x = next(iter(inputs.values()))
        out = {"predict": np.asarray(self._estimator.predict(x), dtype=np.float64)}
        if len(self._outputs) > 1:
            out["predict_proba"] = np.asarray(self._estimator.predict_proba(x), dtype=np.float64)
        return out

    def close(self) -> None:
        """Drop the estimator or session."""
        if self._onnx is not None:
            self._onnx.close()
        self._onnx = None
        self._estimator = None
