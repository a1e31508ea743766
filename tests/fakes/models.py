"""Fault models for tests, loaded with ``runtime: python``. Real processes, fake faults.

A request's input ``x`` (FP32 [batch, 1]) chooses the behaviour, so one loaded model
can answer normally and misbehave on demand.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np

from modelyard.runtimes.base import TensorSpec

_X = [TensorSpec("x", "FP32", (-1, 1))]
_Y = [TensorSpec("y", "FP32", (-1, 1))]

CRASH = 1.0
HANG = 2.0
FAIL = 3.0
SLOW = 4.0


class EchoModel:
    """``y = x``; a baseline that behaves."""

    inputs = _X
    outputs = _Y

    def load(self, version_dir: str) -> None:
        """Nothing to load."""

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Echo."""
        return {"y": inputs["x"].astype(np.float32)}


class FaultyModel(EchoModel):
    """Echo, but x == 1 kills the process, 2 hangs, 3 raises, 4 sleeps 0.3 s."""

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Misbehave as the input asks."""
        x = inputs["x"]
        if np.any(x == CRASH):
            os.kill(os.getpid(), signal.SIGKILL)
        if np.any(x == HANG):
            time.sleep(3600)
        if np.any(x == FAIL):
            raise RuntimeError("failing on demand")
        if np.any(x == SLOW):
            time.sleep(0.3)
        return {"y": x.astype(np.float32)}


class FailingLoadModel(EchoModel):
    """Raises while loading."""

    def load(self, version_dir: str) -> None:
        """Fail."""
        raise RuntimeError("this model refuses to load")


class LeakyModel(EchoModel):
    """Each call keeps ``x`` MiB more, never freed."""

    def __init__(self) -> None:
        self._kept: list[bytearray] = []

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Allocate and touch x MiB, then echo."""
        mib = int(inputs["x"].reshape(-1)[0])
        block = bytearray(mib * 1024 * 1024)
        block[::4096] = b"x" * len(block[::4096])
        self._kept.append(block)
        return {"y": inputs["x"].astype(np.float32)}
