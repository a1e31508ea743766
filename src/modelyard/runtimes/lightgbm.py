"""LightGBM boosters saved as text model files (``Booster.save_model``, ``.txt``).

lightgbm is an optional extra (``modelyard[lightgbm]``); it is imported only when a
model with ``runtime: lightgbm`` loads, inside its worker. Metadata comes from the
model file's header: its feature count, objective and number of classes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from modelyard.runtimes.base import DeclaredTensors, RuntimeSpec, TensorSpec, find_model_file

SUFFIXES = (".txt", ".lgb")
"""LightGBM's text model format (``.lgb`` is what MLflow names it)."""

_CLASSIFIER_OBJECTIVES = frozenset({"binary", "multiclass", "multiclassova", "cross_entropy"})
"""Objectives whose prediction is a class probability."""


def read_header(path: Path) -> dict[str, str]:
    """The ``key=value`` lines before the first tree of a LightGBM text model."""
    header: dict[str, str] = {}
    with path.open(encoding="utf-8") as f:
        first = f.readline().strip()
        if first != "tree":
            raise ValueError(f"{path.name} is not a LightGBM text model (no 'tree' header)")
        for line in f:
            line = line.strip()
            if line.startswith("Tree="):
                break
            key, sep, value = line.partition("=")
            if sep:
                header[key] = value
    return header


def is_lightgbm_model(path: Path) -> bool:
    """True when ``path`` starts like a LightGBM text model (used to guess the runtime)."""
    try:
        with path.open("rb") as f:
            return f.read(16).startswith(b"tree\nversion=")
    except OSError:
        return False


class LightGBMRuntime(DeclaredTensors):
    """One LightGBM booster: ``input`` [batch, features] FP32 in.

    Classifiers answer ``predict`` (INT64 class index, the argmax of the probabilities)
    and ``predict_proba`` [batch, classes] (as ``LGBMClassifier.predict_proba``); other
    objectives answer ``predict`` (FP64), the booster's own prediction.
    """

    def __init__(self) -> None:
        super().__init__()
        self._booster: Any = None
        self._objective = ""
        self._threads = 1

    def load(self, spec: RuntimeSpec) -> None:
        """Load the text model; tensors from its header."""
        import lightgbm

        path = find_model_file(Path(spec.version_dir), SUFFIXES, spec.model_file)
        header = read_header(path)
        self._objective = header.get("objective", "regression").split()[0]
        n_features = int(header.get("max_feature_idx", "-2")) + 1
        n_classes = int(header.get("num_class", "1"))
        self._booster = lightgbm.Booster(model_file=str(path))
        self._threads = spec.intra_op_threads
        self._inputs = [TensorSpec("input", "FP32", (-1, n_features if n_features > 0 else -1))]
        if self._objective in _CLASSIFIER_OBJECTIVES:
            width = n_classes if n_classes > 1 else 2
            self._outputs = [
                TensorSpec("predict", "INT64", (-1,)),
                TensorSpec("predict_proba", "FP64", (-1, width)),
            ]
        else:
            self._outputs = [TensorSpec("predict", "FP64", (-1,))]

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``Booster.predict`` on the batch, shaped like the sklearn API."""
        x = np.asarray(inputs["input"])
        raw = np.asarray(self._booster.predict(x, num_threads=self._threads), dtype=np.float64)
        if self._objective not in _CLASSIFIER_OBJECTIVES:
            return {"predict": raw}
        proba = raw if raw.ndim == 2 else np.stack([1.0 - raw, raw], axis=1)
        return {"predict": np.argmax(proba, axis=1).astype(np.int64), "predict_proba": proba}

    def close(self) -> None:
        """Drop the booster."""
        self._booster = None
