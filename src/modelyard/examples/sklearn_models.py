"""Small scikit-learn classifiers on the bundled digits and iris data sets, and their exports.

Everything here trains in about a second on two cores from data that ships inside
scikit-learn, so examples, tests and benchmarks never download anything. Classifiers are
exported to ONNX with plain tensor outputs (``label`` int64 ``[N]`` and ``probabilities``
float ``[N, classes]``), or saved with skops for the scikit-learn runtime.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.calibration import CalibratedClassifierCV
from sklearn.datasets import load_digits, load_iris
from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC
from threadpoolctl import threadpool_limits

from modelyard.examples._opsets import ONNX_IR_VERSION, ONNX_ML_OPSET, ONNX_OPSET

DIGITS_CLASSIFIERS: tuple[str, ...] = ("logreg", "random-forest", "mlp", "svc", "gradient-boosting")
"""Kinds accepted by :func:`train_digits_classifier`, in the order the workloads list them."""

DIGITS_FEATURES = 64
"""Features per digits sample (8x8 pixel intensities, 0 to 16)."""

IRIS_FEATURES = 4
"""Features per iris sample."""


def digits_data() -> tuple[np.ndarray, np.ndarray]:
    """The digits data set: features float32 ``[1797, 64]`` and labels int64 ``[1797]``."""
    bunch = load_digits()
    return bunch.data.astype(np.float32), bunch.target.astype(np.int64)


def iris_data() -> tuple[np.ndarray, np.ndarray]:
    """The iris data set: features float32 ``[150, 4]`` and labels int64 ``[150]``."""
    bunch = load_iris()
    return bunch.data.astype(np.float32), bunch.target.astype(np.int64)


def _digits_estimator(kind: str, seed: int) -> BaseEstimator:
    # Scaling first makes logistic regression, the MLP and the SVC converge in few
    # iterations; trees do not need it.
    if kind == "logreg":
        return make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=seed))
    if kind == "random-forest":
        return RandomForestClassifier(n_estimators=20, random_state=seed, n_jobs=1)
    if kind == "mlp":
        return make_pipeline(
            StandardScaler(),
            MLPClassifier(hidden_layer_sizes=(64,), max_iter=300, random_state=seed),
        )
    if kind == "svc":
        # NOTE: scikit-learn 1.9 deprecates SVC(probability=True) in favour of this
        # wrapper: the same RBF SVC, with sigmoid-calibrated probabilities.
        svc = CalibratedClassifierCV(SVC(kernel="rbf", random_state=seed), ensemble=False)
        return make_pipeline(StandardScaler(), svc)
    if kind == "gradient-boosting":
        return GradientBoostingClassifier(n_estimators=20, random_state=seed)
    known = ", ".join(DIGITS_CLASSIFIERS)
    raise ValueError(f"unknown digits classifier {kind!r}; known: {known}")


def _fit(estimator: BaseEstimator, features: np.ndarray, labels: np.ndarray) -> BaseEstimator:
    # NOTE: the MLP may stop at max_iter before its loss settles; that is fine for an
    # example model, and the warning would fail test runs that treat warnings as errors.
    # One BLAS/OpenMP thread: these data sets are far too small for more to help, and
    # on a busy machine extra threads only spin (the MLP took 7x the CPU time with two).
    with warnings.catch_warnings(), threadpool_limits(limits=1):
        warnings.simplefilter("ignore", ConvergenceWarning)
        estimator.fit(features, labels)
    return estimator


def train_digits_classifier(kind: str, seed: int = 0) -> Any:
    """Train one classifier of ``kind`` (see :data:`DIGITS_CLASSIFIERS`) on all of digits.

    The result is deterministic for a given ``seed``. Scale-sensitive models are
    ``StandardScaler`` pipelines, so every estimator takes the raw 64 pixel values.
    Raises ``ValueError`` for an unknown ``kind``.
    """
    features, labels = digits_data()
    return _fit(_digits_estimator(kind, seed), features, labels)


def train_iris_classifier(seed: int = 0) -> Any:
    """Train a scaled logistic regression on all of iris (4 features, 3 classes)."""
    features, labels = iris_data()
    estimator = make_pipeline(
        StandardScaler(), LogisticRegression(max_iter=1000, random_state=seed)
    )
    return _fit(estimator, features, labels)


def _classifier_options(estimator: Any) -> dict[int, dict[str, bool]]:
    # zipmap=False keeps probabilities a plain [N, classes] tensor instead of a
    # sequence of maps, which the Open Inference Protocol cannot carry.
    final = estimator.steps[-1][1] if isinstance(estimator, Pipeline) else estimator
    if not isinstance(final, ClassifierMixin):
        return {}
    options = {id(final): {"zipmap": False}}
    if final is not estimator:
        options[id(estimator)] = {"zipmap": False}
    return options


def _write_atomic(data: bytes, path: Path) -> None:
    # Write beside the target and rename, so a half-written file never looks finished.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def export_sklearn_onnx(estimator: Any, n_features: int, path: Path) -> Path:
    """Convert a fitted estimator to ONNX at ``path`` and return ``path``.

    The model takes one input ``input`` float32 ``[None, n_features]``. A classifier
    returns ``label`` int64 ``[N]`` and ``probabilities`` float32 ``[N, classes]``.
    """
    # skl2onnx is imported here: it is slow to import and only builders need it.
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    with warnings.catch_warnings():
        # NOTE: skl2onnx's SVC converter reads ``probA_``, which scikit-learn 1.9
        # deprecates with a FutureWarning even when it is empty.
        warnings.simplefilter("ignore", FutureWarning)
        model = convert_sklearn(
            estimator,
            initial_types=[("input", FloatTensorType([None, n_features]))],
            target_opset={"": ONNX_OPSET, "ai.onnx.ml": ONNX_ML_OPSET},
            options=_classifier_options(estimator),
        )
    model.ir_version = min(model.ir_version, ONNX_IR_VERSION)
    _write_atomic(model.SerializeToString(), path)
    return path


def save_skops(estimator: Any, path: Path) -> Path:
    """Save a fitted estimator in skops format at ``path`` (a ``.skops`` file); return it."""
    import skops.io

    _write_atomic(skops.io.dumps(estimator), path)
    return path


def digits_sample(n: int = 1) -> np.ndarray:
    """The first ``n`` digits rows as float32 ``[n, 64]``, wrapping around past 1797."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    features, _ = digits_data()
    return np.ascontiguousarray(features[np.arange(n) % len(features)])


def iris_sample(n: int = 1) -> np.ndarray:
    """The first ``n`` iris rows as float32 ``[n, 4]``, wrapping around past 150."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    features, _ = iris_data()
    return np.ascontiguousarray(features[np.arange(n) % len(features)])
