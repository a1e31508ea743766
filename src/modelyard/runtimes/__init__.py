"""Runtimes behind one small interface; pick one by name with :func:`create_runtime`."""

from __future__ import annotations

from modelyard.runtimes.base import Runtime, RuntimeSpec, TensorSpec


def create_runtime(kind: str) -> Runtime:
    """A new, unloaded runtime of ``kind``: ``onnx``, ``sklearn``, ``python``; with their
    extras ``torch``, ``xgboost``, ``lightgbm``, ``mlflow`` and ``huggingface``.

    Each runtime module imports its library only when a model loads, so the base
    install imports none of them.
    """
    if kind == "onnx":
        from modelyard.runtimes.onnx import OnnxRuntime

        return OnnxRuntime()
    if kind == "sklearn":
        from modelyard.runtimes.sklearn import SklearnRuntime

        return SklearnRuntime()
    if kind == "python":
        from modelyard.runtimes.python import PythonRuntime

        return PythonRuntime()
    if kind == "torch":
        from modelyard.runtimes.torch import TorchRuntime

        torch_runtime: Runtime = TorchRuntime()
        return torch_runtime
    if kind == "xgboost":
        from modelyard.runtimes.xgboost import XGBoostRuntime

        return XGBoostRuntime()
    if kind == "lightgbm":
        from modelyard.runtimes.lightgbm import LightGBMRuntime

        return LightGBMRuntime()
    if kind == "mlflow":
        from modelyard.runtimes.mlflow import MLflowRuntime

        return MLflowRuntime()
    if kind == "huggingface":
        from modelyard.runtimes.huggingface import HuggingFaceRuntime

        hf_runtime: Runtime = HuggingFaceRuntime()
        return hf_runtime
    raise ValueError(f"unknown runtime {kind!r}")


__all__ = ["Runtime", "RuntimeSpec", "TensorSpec", "create_runtime"]
