"""ONNX models built from numpy and ``onnx.helper``: MLPs of a chosen size, identity, add.

These need neither torch nor a model hub. The MLPs have random weights: they exist to
occupy a known number of bytes (memory pressure, eviction, load-time benchmarks), not to
predict anything. Every graph has a dynamic batch dimension named ``batch``.
"""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from modelyard.examples._opsets import ONNX_IR_VERSION, ONNX_OPSET

MIB = 1024 * 1024
"""Bytes in one MiB; every ``*_mb`` size in this package is in MiB."""

HIDDEN_LAYERS = 3
"""Hidden layers of every MLP; their common width is chosen to meet the size target."""

_FLOAT_BYTES = 4


def mlp_weight_bytes(hidden: int, n_in: int, n_out: int, layers: int = HIDDEN_LAYERS) -> int:
    """Bytes of float32 weights and biases of an MLP with ``layers`` hidden layers of ``hidden``."""
    params = n_in * hidden + hidden  # first layer
    params += (layers - 1) * (hidden * hidden + hidden)  # hidden to hidden
    params += hidden * n_out + n_out  # output layer
    return params * _FLOAT_BYTES


def mlp_hidden_width(target_mb: float, n_in: int, n_out: int, layers: int = HIDDEN_LAYERS) -> int:
    """The hidden width whose weights come closest to ``target_mb`` MiB (at least 1)."""
    if target_mb <= 0:
        raise ValueError(f"target_mb must be > 0, got {target_mb}")
    # Solve a*h^2 + b*h + c = target for h: the size is quadratic in the width.
    a = layers - 1
    b = n_in + n_out + layers
    c = n_out - target_mb * MIB / _FLOAT_BYTES
    root = -c / b if a == 0 else (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
    best = max(1, round(root))
    # Rounding the root can land one off the closest integer width; check the neighbours.
    target = target_mb * MIB
    candidates = [w for w in (best - 1, best, best + 1) if w >= 1]
    return min(candidates, key=lambda w: abs(mlp_weight_bytes(w, n_in, n_out, layers) - target))


def _value_info(name: str, width: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", width])


def _make_model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
        ir_version=ONNX_IR_VERSION,
        producer_name="modelyard.examples",
    )
    onnx.checker.check_model(model)
    return model


def _save(model: onnx.ModelProto, path: Path, *, external_data: bool = False) -> Path:
    # Save beside the target and rename last, so an existing model file is always whole
    # (the repository builders skip models whose file exists).
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    if external_data:
        onnx.save_model(
            model,
            str(tmp),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=f"{path.name}.data",
            size_threshold=0,
        )
    else:
        onnx.save_model(model, str(tmp))
    os.replace(tmp, path)
    return path


def build_mlp_onnx(
    path: Path,
    target_mb: float,
    n_in: int = 64,
    n_out: int = 10,
    seed: int = 0,
    external_data: bool = False,
) -> Path:
    """Write an MLP whose float32 weights total about ``target_mb`` MiB to ``path``.

    The graph is ``input`` float32 ``[batch, n_in]`` → :data:`HIDDEN_LAYERS` times
    (Gemm + Relu) → Gemm → ``output`` float32 ``[batch, n_out]``, with random
    He-initialised weights from ``seed``. With ``external_data`` the weights go to
    ``<path.name>.data`` beside the model (ONNX external data), which onnxruntime can
    memory-map. Returns ``path``.
    """
    hidden = mlp_hidden_width(target_mb, n_in, n_out)
    widths = [n_in, *([hidden] * HIDDEN_LAYERS), n_out]
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    current = "input"
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        weight = rng.standard_normal((fan_in, fan_out), dtype=np.float32)
        weight *= np.float32(math.sqrt(2.0 / fan_in))
        bias = np.zeros(fan_out, dtype=np.float32)
        initializers += [
            numpy_helper.from_array(weight, f"w{i}"),
            numpy_helper.from_array(bias, f"b{i}"),
        ]
        is_last = i == len(widths) - 2
        gemm_out = "output" if is_last else f"gemm{i}"
        nodes.append(helper.make_node("Gemm", [current, f"w{i}", f"b{i}"], [gemm_out]))
        if not is_last:
            current = f"relu{i}"
            nodes.append(helper.make_node("Relu", [gemm_out], [current]))
    graph = helper.make_graph(
        nodes,
        f"mlp_{target_mb:g}mb",
        [_value_info("input", n_in)],
        [_value_info("output", n_out)],
        initializer=initializers,
    )
    return _save(_make_model(graph), path, external_data=external_data)


def build_identity_onnx(path: Path, n: int = 4) -> Path:
    """Write an Identity model (``input`` float32 ``[batch, n]`` → ``output``); return ``path``.

    It does no work, so serving it measures the server's own per-request overhead.
    """
    node = helper.make_node("Identity", ["input"], ["output"])
    graph = helper.make_graph(
        [node], "identity", [_value_info("input", n)], [_value_info("output", n)]
    )
    return _save(_make_model(graph), path)


def build_add_onnx(path: Path, value: float) -> Path:
    """Write ``output = input + value`` (float32 ``[batch, 4]``) to ``path``; return it.

    Versions built with different ``value`` answer differently, so tests can tell which
    version served a request.
    """
    constant = numpy_helper.from_array(np.array([value], dtype=np.float32), "value")
    node = helper.make_node("Add", ["input", "value"], ["output"])
    graph = helper.make_graph(
        [node],
        "add",
        [_value_info("input", 4)],
        [_value_info("output", 4)],
        initializer=[constant],
    )
    return _save(_make_model(graph), path)
