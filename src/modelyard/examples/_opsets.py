"""ONNX format versions that every example model is written with.

Pinned low enough that the oldest onnxruntime the project supports (1.18) runs them all.
"""

from __future__ import annotations

ONNX_OPSET = 17
"""Default-domain opset."""

ONNX_ML_OPSET = 3
"""``ai.onnx.ml`` opset (tree ensembles, scalers, SVMs)."""

ONNX_IR_VERSION = 8
"""IR version written into the model files."""
