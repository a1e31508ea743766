"""Build ready-to-serve model repositories from the example models.

Each builder lays out Triton-style folders ``<root>/<model>/1/<file>``, writes
``<root>/modelyard.yaml`` naming every model, and returns the YAML's path. Builders are
idempotent: a model whose file already exists is left alone (files are written under a
temporary name and renamed, so an existing file is always complete), and the YAML is
rewritten each time.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from modelyard.examples.minilm import export_minilm_onnx, minilm_available, minilm_model_dir
from modelyard.examples.mlp import MIB, build_identity_onnx, build_mlp_onnx
from modelyard.examples.sklearn_models import (
    DIGITS_CLASSIFIERS,
    DIGITS_FEATURES,
    IRIS_FEATURES,
    export_sklearn_onnx,
    save_skops,
    train_digits_classifier,
    train_iris_classifier,
)
from modelyard.examples.sklearn_models import digits_sample as _digits_sample

CONFIG_FILE = "modelyard.yaml"
"""Name of the server configuration written at the repository root."""

VERSION = "1"
"""The one version folder every example model gets."""

DEFAULT_BUDGET_MB = 2048
"""CPU memory budget of the example repository and the digits workload."""

_ONNX_FILE = "model.onnx"
_SKOPS_FILE = "model.skops"


@dataclass(frozen=True, slots=True)
class _Entry:
    """One model: how to build its file and what the YAML says about it."""

    name: str
    file: str
    build: Callable[[Path], Path]
    runtime: str = "onnx"
    preload: bool = True
    max_batch_size: int = 8
    priority: int = 3
    timeout_s: float = 1.0
    isolation: str | None = None
    python_class: str | None = None
    generation: dict[str, int] | None = None
    """The ``generation:`` block of a generative model (its memory is then estimated
    from the GGUF header, so no ``memory_mb`` is declared)."""


def _estimate_memory_mb(version_dir: Path) -> float:
    # A first guess the server replaces with the measured footprint: the weights once
    # in memory, half again for runtime buffers, plus a few MiB of session overhead.
    size = sum(f.stat().st_size for f in version_dir.iterdir() if f.is_file())
    return float(math.ceil(1.5 * size / MIB) + 4)


def _digits_entry(kind: str) -> _Entry:
    def build(path: Path) -> Path:
        return export_sklearn_onnx(train_digits_classifier(kind), DIGITS_FEATURES, path)

    return _Entry(name=f"digits-{kind}", file=_ONNX_FILE, build=build, priority=1)


def _iris_onnx(path: Path) -> Path:
    return export_sklearn_onnx(train_iris_classifier(), IRIS_FEATURES, path)


def _iris_skops(path: Path) -> Path:
    return save_skops(train_iris_classifier(), path)


def _mlp_entry(name: str, size_mb: float, seed: int, **fields: Any) -> _Entry:
    def build(path: Path) -> Path:
        return build_mlp_onnx(path, size_mb, seed=seed, external_data=True)

    return _Entry(name=name, file=_ONNX_FILE, build=build, timeout_s=5.0, **fields)


def _materialise(root: Path, entry: _Entry) -> dict[str, Any]:
    """Build ``entry``'s file unless it exists; return its ``models:`` item."""
    version_dir = root / entry.name / VERSION
    target = version_dir / entry.file
    if not target.is_file():
        entry.build(target)
    item: dict[str, Any] = {
        "name": entry.name,
        "path": entry.name,
        "runtime": entry.runtime,
        "preload": entry.preload,
        "max_batch_size": entry.max_batch_size,
        "priority": entry.priority,
        "timeout_s": entry.timeout_s,
    }
    if entry.generation is None:
        item["memory_mb"] = _estimate_memory_mb(version_dir)
    else:
        item["generation"] = dict(entry.generation)
    if entry.isolation is not None:
        item["isolation"] = entry.isolation
    if entry.python_class is not None:
        item["class"] = entry.python_class
    return item


def _write_config(root: Path, models: list[dict[str, Any]], budget_mb: float) -> Path:
    config = {
        "model_repository": ".",
        "http_port": 8080,
        "grpc_port": 8081,
        "devices": [{"name": "cpu", "memory_budget_mb": budget_mb}],
        "models": models,
    }
    path = root / CONFIG_FILE
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _build(root: Path, entries: Iterable[_Entry], budget_mb: float) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    return _write_config(root, [_materialise(root, e) for e in entries], budget_mb)


def llm_available() -> bool:
    """True when the ``llm`` extra (llama-cpp-python and gguf) is installed."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("gguf", "llama_cpp"))


def _llama_entry(size: str, seed: int) -> _Entry:
    def build(path: Path) -> Path:
        from modelyard.examples.gguf_llama import SHAPES, write_llama_gguf

        return write_llama_gguf(path, SHAPES[size], seed=seed)

    return _Entry(
        name=f"llama-{size}",
        file="model.gguf",
        build=build,
        runtime="llama_cpp",
        preload=False,
        max_batch_size=0,
        timeout_s=30.0,
        generation={"n_ctx": 1024, "parallel": 2, "n_threads": 2},
    )


LLM_SIZES = ("tiny", "small", "medium")
"""The example GGUF models (about 10, 60 and 250 MB), smallest first."""


def _example_entries(
    *, include_minilm: bool, big_mlp_mb: float, llm_sizes: tuple[str, ...] = ()
) -> list[_Entry]:
    """The models of :func:`build_example_repository`, in YAML order."""
    entries = [_digits_entry(kind) for kind in DIGITS_CLASSIFIERS]
    entries += [
        _Entry(name="iris-logreg", file=_ONNX_FILE, build=_iris_onnx, priority=2),
        _Entry(
            name="iris-skops",
            file=_SKOPS_FILE,
            build=_iris_skops,
            runtime="sklearn",
            preload=False,
            priority=2,
        ),
        _mlp_entry(f"mlp-{big_mlp_mb:g}mb", big_mlp_mb, seed=0, preload=False),
        _Entry(
            name="identity",
            file=_ONNX_FILE,
            build=build_identity_onnx,
            priority=1,
            isolation="inline",
        ),
    ]
    entries += [_llama_entry(size, seed=i) for i, size in enumerate(llm_sizes)]
    if include_minilm:
        entries.append(
            _Entry(
                name="minilm",
                file=_ONNX_FILE,
                build=export_minilm_onnx,
                preload=False,
                max_batch_size=16,
                priority=2,
                timeout_s=10.0,
            )
        )
        entries.append(
            _Entry(
                name="minilm-text",
                file=_ONNX_FILE,
                build=build_text_encoder,
                runtime="python",
                preload=False,
                max_batch_size=16,
                priority=2,
                timeout_s=10.0,
                python_class="modelyard.examples.text_encoder:TextEncoder",
            )
        )
    return entries


def build_text_encoder(path: Path) -> Path:
    """Write the MiniLM graph to ``path`` with the packaged tokenizer beside it, the version
    folder that :class:`modelyard.examples.text_encoder.TextEncoder` serves (text in,
    embedding out); return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(minilm_model_dir() / "tokenizer.json", path.parent / "tokenizer.json")
    return export_minilm_onnx(path)


def build_example_repository(
    root: Path,
    *,
    include_minilm: bool | None = None,
    big_mlp_mb: float = 50,
    llm_sizes: tuple[str, ...] | None = None,
) -> Path:
    """Build the example repository in ``root`` and return its ``modelyard.yaml``.

    Models: ``digits-<kind>`` for every kind in :data:`DIGITS_CLASSIFIERS` and
    ``iris-logreg`` (ONNX, preloaded); ``iris-skops`` (scikit-learn runtime, skops file,
    on demand); ``mlp-<big_mlp_mb>mb`` (random-weight MLP with external data, on demand);
    ``identity`` (inline, for overhead measurements); and ``minilm`` (sentence embeddings,
    on demand) when ``include_minilm`` is true, or when it is ``None`` and the ``torch``
    extra is installed; ``llama-<size>`` (random-weight llama GGUF text generators of
    about 10, 60 and 250 MB, on demand) for ``llm_sizes``, by default ``tiny`` and
    ``small`` when the ``llm`` extra is installed. The CPU budget is 2048 MiB. Without
    MiniLM a fresh build takes a few seconds; MiniLM adds about half a minute, the 250 MB
    GGUF a few seconds.
    """
    if include_minilm is None:
        include_minilm = minilm_available()
    if llm_sizes is None:
        llm_sizes = LLM_SIZES[:2] if llm_available() else ()
    entries = _example_entries(
        include_minilm=include_minilm, big_mlp_mb=big_mlp_mb, llm_sizes=llm_sizes
    )
    return _build(root, entries, DEFAULT_BUDGET_MB)


def build_digits_workload(root: Path) -> Path:
    """Build the five digits classifiers, all preloaded, in ``root``; return the YAML path.

    This is the benchmarks' standard workload: small models, real predictions.
    """
    return _build(root, [_digits_entry(kind) for kind in DIGITS_CLASSIFIERS], DEFAULT_BUDGET_MB)


def pressure_sizes_mb(n: int, min_mb: float, max_mb: float) -> list[float]:
    """``n`` model sizes in MiB spread evenly from ``min_mb`` to ``max_mb``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 < min_mb <= max_mb:
        raise ValueError(f"need 0 < min_mb <= max_mb, got {min_mb} and {max_mb}")
    return [round(float(s), 1) for s in np.linspace(min_mb, max_mb, n)]


def build_pressure_workload(
    root: Path,
    n: int = 20,
    min_mb: float = 50,
    max_mb: float = 200,
    budget_fraction: float = 1 / 3,
) -> Path:
    """Build ``n`` random-weight MLPs of ``min_mb``..``max_mb`` MiB in ``root``.

    None is preloaded. The CPU budget is ``budget_fraction`` of their declared total
    footprint (but never less than the largest model plus a tenth), so only a part of
    them fit at once and serving them all forces evictions. Returns the YAML path.
    """
    if not 0 < budget_fraction <= 1:
        raise ValueError(f"budget_fraction must be in (0, 1], got {budget_fraction}")
    width = len(str(n - 1))
    entries = [
        _mlp_entry(f"mlp-{i:0{width}d}-{size:g}mb", size, seed=i, preload=False)
        for i, size in enumerate(pressure_sizes_mb(n, min_mb, max_mb))
    ]
    root.mkdir(parents=True, exist_ok=True)
    models = [_materialise(root, entry) for entry in entries]
    footprints = [float(item["memory_mb"]) for item in models]
    budget_mb = max(budget_fraction * sum(footprints), 1.1 * max(footprints))
    return _write_config(root, models, float(math.ceil(budget_mb)))


def digits_sample(n: int = 1) -> np.ndarray:
    """The first ``n`` digits rows as float32 ``[n, 64]`` (wrapping around), for clients."""
    return _digits_sample(n)
