"""The classification extension: an output's top-k classes instead of its raw tensor.

A requested output with the parameter ``classification: k`` (a positive integer) is
answered as a BYTES tensor of ``"score:index"`` strings, ``"score:index:label"`` when
the model has a labels file, highest score first: over each row (the first dimension
is the batch) of a model that batches, over the whole tensor of one that does not.
``k`` larger than the number of classes gives every class.

Labels: ``labels.txt`` in the version folder, else in the model folder, one label a
line, line ``i`` naming class ``i``. The file is read once per version (bounded by
:data:`MAX_LABELS_BYTES`); a class past its last line has no label.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from modelyard.errors import InvalidInputError
from modelyard.protocol.types import InferOutput

CLASSIFICATION = "classification"
"""The requested output's parameter that asks for the top-k classes."""
LABELS_FILE = "labels.txt"
MAX_LABELS_BYTES = 4 * 1024 * 1024
"""Largest labels file read; a larger one is refused by name, not read."""


def classification_k(output: str, params: dict[str, Any]) -> int | None:
    """The ``classification`` parameter of a requested output (None: not asked)."""
    k = params.get(CLASSIFICATION)
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInputError(
            f"output {output!r}: parameter 'classification' must be a positive integer "
            f"(the number of classes to return), got {k!r}"
        )
    return k


def read_labels(version_dir: Path) -> tuple[str, ...]:
    """The labels of a model version: its folder's ``labels.txt``, else its model
    folder's; empty when neither exists."""
    for folder in (version_dir, version_dir.parent):
        path = folder / LABELS_FILE
        if not path.is_file():
            continue
        if path.stat().st_size > MAX_LABELS_BYTES:
            raise InvalidInputError(
                f"the model's {LABELS_FILE} is over {MAX_LABELS_BYTES} bytes; "
                "classification cannot use it"
            )
        text = path.read_text(encoding="utf-8", errors="replace")
        return tuple(line.rstrip("\r") for line in text.split("\n"))
    return ()


class LabelCache:
    """Labels by version folder, each read once (:func:`read_labels`)."""

    def __init__(self) -> None:
        self._by_folder: dict[Path, tuple[str, ...]] = {}

    def get(self, version_dir: Path) -> tuple[str, ...]:
        """The labels of the version in ``version_dir`` (empty: none)."""
        labels = self._by_folder.get(version_dir)
        if labels is None:
            labels = self._by_folder[version_dir] = read_labels(version_dir)
        return labels


def _top_k(scores: np.ndarray, k: int, labels: tuple[str, ...]) -> list[bytes]:
    # Stable sort on the negated scores: equal scores keep their class order.
    order = np.argsort(-scores, kind="stable")[:k]
    result = []
    for index in order.tolist():
        text = f"{float(scores[index]):f}:{index}"
        if index < len(labels) and labels[index]:
            text += f":{labels[index]}"
        result.append(text.encode("utf-8"))
    return result


def classify(
    name: str, array: np.ndarray, k: int, *, batched: bool, labels: tuple[str, ...]
) -> InferOutput:
    """The top ``k`` classes of ``array`` as a BYTES output named ``name``."""
    if array.dtype.kind not in "biuf":
        raise InvalidInputError(
            f"output {name!r}: classification needs a numeric output, this one is {array.dtype}"
        )
    rows = array.reshape(array.shape[0], -1) if batched and array.ndim >= 2 else None
    if rows is None:
        flat = array.reshape(-1).astype(np.float64)
        items = _top_k(flat, k, labels)
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return InferOutput(name, "BYTES", (len(items),), out)
    width = min(k, rows.shape[1])
    out = np.empty((rows.shape[0], width), dtype=object)
    for i, row in enumerate(rows.astype(np.float64)):
        out[i, :] = _top_k(row, k, labels)
    return InferOutput(name, "BYTES", (rows.shape[0], width), out)
