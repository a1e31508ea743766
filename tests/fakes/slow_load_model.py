"""A fault model for ``runtime: python`` whose load takes a while, copied into a version folder.

Each start of its worker (the first load and every restart) sleeps :data:`LOAD_S` (or the
seconds written in a ``load_s`` file beside it), so a test can watch what the server says
while a load is still running. Self-contained: the server imports it from the version
folder, not from ``tests``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from modelyard.runtimes.base import TensorSpec

LOAD_S = 0.3
"""Seconds every load sleeps."""


class SlowLoadModel:
    """``y = x`` after a slow load."""

    inputs = [TensorSpec("x", "FP32", (-1, 1))]
    outputs = [TensorSpec("y", "FP32", (-1, 1))]

    def load(self, version_dir: str) -> None:
        """Take :data:`LOAD_S` seconds, or as many as the folder's ``load_s`` file says
        (then first write a ``loading`` file beside it, for a test to wait on)."""
        override = Path(version_dir) / "load_s"
        if not override.exists():
            time.sleep(LOAD_S)
            return
        load_s = float(override.read_text())
        (Path(version_dir) / "loading").touch()
        time.sleep(load_s)

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Echo."""
        return {"y": inputs["x"].astype(np.float32)}
