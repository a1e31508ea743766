"""A user's own model class, named by import path (``module:Class``).

The class follows the seed design's ``ModelLoader`` strategy::

    class MyModel:
        inputs = [TensorSpec("x", "FP32", (-1, 4))]      # optional; else taken from load()
        outputs = [TensorSpec("y", "FP32", (-1, 1))]
        def load(self, version_dir: str) -> None: ...
        def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

The version folder is put on ``sys.path`` first, so a ``model.py`` beside the weights
can be named as ``model:MyModel``.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import numpy as np

from modelyard.runtimes.base import DeclaredTensors, RuntimeSpec, TensorSpec


def _as_specs(value: Any, what: str) -> list[TensorSpec]:
    specs: list[TensorSpec] = []
    for item in value or []:
        if isinstance(item, TensorSpec):
            specs.append(item)
        elif isinstance(item, dict):
            specs.append(TensorSpec(item["name"], item["datatype"], tuple(item["shape"])))
        else:
            raise TypeError(f"{what} entries must be TensorSpec or dicts, got {item!r}")
    return specs


class PythonRuntime(DeclaredTensors):
    """Wraps an instance of the user's class."""

    def __init__(self) -> None:
        super().__init__()
        self._model: Any = None
        self._batching = True

    @property
    def supports_batching(self) -> bool:
        """The class's ``supports_batching`` attribute (default True)."""
        return self._batching

    def load(self, spec: RuntimeSpec) -> None:
        """Import the class, instantiate it and call its ``load``."""
        if not spec.python_class:
            raise ValueError("runtime 'python' needs 'class: module:Class'")
        module_name, _, class_name = spec.python_class.partition(":")
        if spec.version_dir not in sys.path:
            sys.path.insert(0, spec.version_dir)
        module = importlib.import_module(module_name)
        cls = getattr(module, class_name)
        model = cls()
        if hasattr(model, "load"):
            model.load(spec.version_dir)
        self._model = model
        self._inputs = _as_specs(getattr(model, "inputs", None), "inputs")
        self._outputs = _as_specs(getattr(model, "outputs", None), "outputs")
        self._batching = bool(getattr(model, "supports_batching", True))

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Call the class's ``predict``."""
        result = self._model.predict(inputs)
        if not isinstance(result, dict):
            raise TypeError(f"predict() must return a dict of arrays, got {type(result).__name__}")
        return {k: np.asarray(v) for k, v in result.items()}

    def close(self) -> None:
        """Call the class's ``close`` if it has one."""
        if self._model is not None and hasattr(self._model, "close"):
            self._model.close()
        self._model = None
