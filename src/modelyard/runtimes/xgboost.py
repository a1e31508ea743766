"""XGBoost boosters saved with ``save_model`` (``.json`` or ``.ubj``).

xgboost is an optional extra (``modelyard[xgboost]``); it is imported only when a model
with ``runtime: xgboost`` loads, inside the worker that hosts it. Metadata comes from
the booster itself: its feature count, its objective and its number of classes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from modelyard.runtimes.base import DeclaredTensors, RuntimeSpec, TensorSpec, find_model_file

SUFFIXES = (".json", ".ubj")
"""Files the runtime loads: XGBoost's own JSON and Universal Binary JSON formats."""

_PROBABILITY_OBJECTIVES = frozenset({"binary:logistic", "multi:softprob"})
"""Objectives whose prediction is a class probability (classifiers with predict_proba)."""
_LABEL_OBJECTIVES = frozenset({"multi:softmax", "binary:hinge"})
"""Objectives whose prediction is already a class index (no probabilities)."""


class XGBoostRuntime(DeclaredTensors):
    """One XGBoost booster: ``input`` [batch, features] FP32 in.

    Classifiers (``binary:logistic``, ``multi:softprob``) answer ``predict`` (INT64 class
    index, as ``XGBClassifier.predict``) and ``predict_proba`` [batch, classes] (as
    ``XGBClassifier.predict_proba``); other objectives answer ``predict`` (FP32), the
    booster's own prediction.
    """

    def __init__(self) -> None:
        super().__init__()
        self._booster: Any = None
        self._objective = ""

    def load(self, spec: RuntimeSpec) -> None:
        """Load the booster file and derive its tensors from its learner parameters."""
        import xgboost

        path = find_model_file(Path(spec.version_dir), SUFFIXES, spec.model_file)
        booster = xgboost.Booster(model_file=str(path))
        booster.set_param({"nthread": spec.intra_op_threads})
        learner = json.loads(booster.save_config())["learner"]
        self._objective = str(learner["objective"]["name"])
        params = learner["learner_model_param"]
        n_classes = int(params.get("num_class", "0"))
        n_targets = int(params.get("num_target", "1"))
        if spec.device.startswith("cuda"):
            booster.set_param({"device": spec.device})
        self._booster = booster
        self._inputs = [TensorSpec("input", "FP32", (-1, booster.num_features()))]
        if self._objective in _PROBABILITY_OBJECTIVES:
            width = n_classes if self._objective == "multi:softprob" else 2
            self._outputs = [
                TensorSpec("predict", "INT64", (-1,)),
                TensorSpec("predict_proba", "FP32", (-1, width)),
            ]
        elif self._objective in _LABEL_OBJECTIVES:
            self._outputs = [TensorSpec("predict", "INT64", (-1,))]
        else:
            shape = (-1,) if n_targets <= 1 else (-1, n_targets)
            self._outputs = [TensorSpec("predict", "FP32", shape)]

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``inplace_predict`` on the batch (no DMatrix copy), shaped like the sklearn API."""
        x = np.ascontiguousarray(inputs["input"], dtype=np.float32)
        raw = np.asarray(self._booster.inplace_predict(x))
        if self._objective == "binary:logistic":
            proba = np.stack([1.0 - raw, raw], axis=1).astype(np.float32)
            return {"predict": (raw > 0.5).astype(np.int64), "predict_proba": proba}
        if self._objective == "multi:softprob":
            proba = raw.reshape(len(x), -1).astype(np.float32)
            return {"predict": np.argmax(proba, axis=1).astype(np.int64), "predict_proba": proba}
        if self._objective in _LABEL_OBJECTIVES:
            labels = raw if self._objective == "multi:softmax" else raw > 0.5
            return {"predict": np.asarray(labels).astype(np.int64)}
        return {"predict": raw.astype(np.float32)}

    def close(self) -> None:
        """Drop the booster."""
        self._booster = None
