"""Runtimes behind one small interface; pick one by name with :func:`create_runtime`."""

from __future__ import annotations

from modelyard.runtimes.base import Runtime, RuntimeSpec, TensorSpec
from modelyard.runtimes.generation import GenerativeRuntime

GENERATIVE_KINDS = frozenset({"llama_cpp", "transformers"})
"""Runtimes that generate text (:func:`create_generative_runtime`), not tensors."""


def create_generative_runtime(kind: str) -> GenerativeRuntime:
    """A new, unloaded generative runtime of ``kind`` (``llama_cpp``, ``transformers``)."""
    if kind == "llama_cpp":
        from modelyard.runtimes.llama_cpp import LlamaCppRuntime

        runtime: GenerativeRuntime = LlamaCppRuntime()
        return runtime
    if kind == "transformers":
        from modelyard.runtimes.hf_causal_lm import CausalLMRuntime

        hf_runtime: GenerativeRuntime = CausalLMRuntime()
        return hf_runtime
    raise ValueError(f"unknown generative runtime {kind!r}")


WARMABLE_KINDS = frozenset({"onnx", "llama_cpp"})
"""Runtimes with process-wide state that a spare worker can start ahead (:func:`prewarm`)."""


def prewarm(kind: str) -> bool:
    """Start ``kind``'s process-wide state in this (spare) worker; whether it did (False
    for runtimes without any, see :data:`WARMABLE_KINDS`, and for a llama.cpp built with
    a GPU backend)."""
    if kind == "onnx":
        from modelyard.runtimes.onnx import prewarm as prewarm_onnx

        prewarm_onnx()
        return True
    if kind == "llama_cpp":
        from modelyard.runtimes.llama_warm import prewarm as prewarm_llama_cpp

        return prewarm_llama_cpp()
    return False


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


__all__ = [
    "GENERATIVE_KINDS",
    "WARMABLE_KINDS",
    "GenerativeRuntime",
    "Runtime",
    "RuntimeSpec",
    "TensorSpec",
    "create_generative_runtime",
    "create_runtime",
    "prewarm",
]
