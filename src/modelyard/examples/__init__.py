"""Example models and repositories built locally from bundled data; nothing is downloaded.

- :mod:`~modelyard.examples.sklearn_models`: digits and iris classifiers, ONNX and skops.
- :mod:`~modelyard.examples.mlp`: numpy-built ONNX MLPs of a chosen size, identity, add.
- :mod:`~modelyard.examples.minilm`: all-MiniLM-L6-v2 exported to ONNX (``torch`` extra).
- :mod:`~modelyard.examples.repository`: whole repositories plus their ``modelyard.yaml``.
"""

from __future__ import annotations

from modelyard.examples.minilm import export_minilm_onnx, minilm_available, tokenize
from modelyard.examples.mlp import build_add_onnx, build_identity_onnx, build_mlp_onnx
from modelyard.examples.repository import (
    build_digits_workload,
    build_example_repository,
    build_pressure_workload,
    digits_sample,
)
from modelyard.examples.sklearn_models import (
    DIGITS_CLASSIFIERS,
    export_sklearn_onnx,
    save_skops,
    train_digits_classifier,
    train_iris_classifier,
)

__all__ = [
    "DIGITS_CLASSIFIERS",
    "build_add_onnx",
    "build_digits_workload",
    "build_example_repository",
    "build_identity_onnx",
    "build_mlp_onnx",
    "build_pressure_workload",
    "digits_sample",
    "export_minilm_onnx",
    "export_sklearn_onnx",
    "minilm_available",
    "save_skops",
    "tokenize",
    "train_digits_classifier",
    "train_iris_classifier",
]
