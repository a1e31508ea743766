"""The runtime contract: load a model version, infer on named numpy tensors, describe it.

A runtime knows nothing of HTTP, queues or processes. The same object runs inline in
the server process or inside a worker process (``workers/``), so everything that
crosses into it is plain data: a :class:`RuntimeSpec` in, numpy arrays in and out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from modelyard.protocol.types import TensorMetadata

TensorSpec = TensorMetadata
"""A runtime's tensor: the protocol's :class:`TensorMetadata` (one type on both sides)."""


@dataclass(frozen=True, slots=True)
class RuntimeSpec:
    """Everything a runtime needs to load one model version; picklable plain data."""

    kind: str
    """Runtime name: ``onnx``, ``sklearn``, ``python``; with their extras ``torch``,
    ``xgboost``, ``lightgbm``, ``mlflow``, ``huggingface``."""
    version_dir: str
    """Folder of the version to load (``<repo>/<model>/<version>``)."""
    model_name: str = ""
    trusted: bool = False
    """Allow raw pickle files (scikit-learn); off unless the config says so."""
    python_class: str | None = None
    """``module:Class`` of a user model (``python``), or of the module a safetensors
    state dict belongs to (``torch``)."""
    intra_op_threads: int = 1
    """ONNX Runtime intra-op threads; 1 keeps many models from fighting over cores."""
    share_weights: bool = False
    """Keep ONNX external-data weights memory-mapped so replicas share the page cache."""
    device: str = "cpu"
    """``cpu``, a core set (``cpu:0-1``) or ``cuda:N``. Inside a worker, a ``cuda:N``
    spec has been rewritten to ``cuda:0`` once ``CUDA_VISIBLE_DEVICES`` shows only GPU N
    (see ``workers/device.py``)."""
    cores: tuple[int, ...] = ()
    """A core set's CPUs: the worker pins itself there and runs that many threads."""
    gpu_memory_limit_bytes: int | None = None
    """A CUDA model's cap on device memory (ORT ``gpu_mem_limit``, torch's
    per-process memory fraction); None: no cap."""
    options: dict[str, str] = field(default_factory=dict)
    model_file: str = ""
    """The file in ``version_dir`` to load (a config whose ``path`` names one file);
    empty: the runtime finds its file in the folder."""
    huge_pages_min_bytes: int | None = None
    """Mapped files of ``version_dir`` at least this big get transparent huge pages
    (``madvise(MADV_HUGEPAGE)``, see ``workers/huge_pages.py``); None: never."""


class Runtime(Protocol):
    """What every runtime implements. Instances are used from one thread at a time."""

    @property
    def inputs(self) -> list[TensorSpec]:
        """Input tensors the model takes."""
        ...

    @property
    def outputs(self) -> list[TensorSpec]:
        """Output tensors the model returns."""
        ...

    @property
    def supports_batching(self) -> bool:
        """True when the first dimension of every input and output is a free batch axis."""
        ...

    def load(self, spec: RuntimeSpec) -> None:
        """Load the version named by ``spec``; raise on any failure."""
        ...

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model on already-validated inputs; return every output by name."""
        ...

    def close(self) -> None:
        """Release what the runtime holds."""
        ...


class DeclaredTensors:
    """The tensor metadata part of a runtime: ``inputs``, ``outputs`` and batching.

    Runtimes fill ``_inputs`` and ``_outputs`` when they load; a model can batch when
    the first dimension of every tensor is free.
    """

    def __init__(self) -> None:
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []

    @property
    def inputs(self) -> list[TensorSpec]:
        """Input tensors the model takes."""
        return self._inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        """Output tensors the model returns."""
        return self._outputs

    @property
    def supports_batching(self) -> bool:
        """True when every input and output has a dynamic first dimension."""
        return all(t.shape and t.shape[0] == -1 for t in (*self._inputs, *self._outputs))


def find_model_file(version_dir: Path, suffixes: tuple[str, ...], name: str = "") -> Path:
    """The single model file in ``version_dir`` with one of ``suffixes`` (or the one ``name``d).

    Raises ``FileNotFoundError`` with a message naming the folder (or file) and suffixes.
    """
    if name:
        path = version_dir / name
        if not path.is_file():
            raise FileNotFoundError(f"model file {path} does not exist")
        if not name.endswith(suffixes):
            raise FileNotFoundError(f"model file {path} is not a {'/'.join(suffixes)} file")
        return path
    candidates = sorted(
        p for p in version_dir.iterdir() if p.is_file() and p.name.endswith(suffixes)
    )
    if not candidates:
        raise FileNotFoundError(f"no {'/'.join(suffixes)} file in {version_dir}")
    for preferred in ("model" + s for s in suffixes):
        for c in candidates:
            if c.name == preferred:
                return c
    return candidates[0]


def cuda_index(spec: RuntimeSpec) -> int | None:
    """The GPU index a ``cuda:N`` spec runs on (None: a CPU device)."""
    kind, _, index = spec.device.partition(":")
    return int(index or 0) if kind == "cuda" else None


def torch_device(spec: RuntimeSpec) -> str:
    """The device as torch names it: ``cuda:N``, or ``cpu`` for the host and core sets
    (a core set is the worker's affinity, not a torch device)."""
    index = cuda_index(spec)
    return "cpu" if index is None else f"cuda:{index}"
