"""The one set of fault models for tests, loaded with ``runtime: python``. Real processes,
fake faults.

The worker tests load them with ``version_dir`` = this folder and
``python_class="fault_models:<Class>"`` (the python runtime puts the version folder on
``sys.path``); the server tests copy this file into a model repository (``model_root``
in ``tests/integration/conftest.py``). Inputs choose the fault, so the warm-up batch
(zeros) always behaves.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import time

import numpy as np

from modelyard.runtimes.base import TensorSpec

MIB = 1024 * 1024

_X = [TensorSpec("x", "FP32", (-1, 1))]
_Y = [TensorSpec("y", "FP32", (-1, 1))]

# What x asks of FaultyModel.
CRASH = 1.0
HANG = 2.0
FAIL = 3.0
SLOW = 4.0

# What ``action`` asks of CrashingModel.
BEHAVE = 0
EXIT = 1
"""``os._exit(3)``."""
SIGKILL_SELF = 2
SEGFAULT = 3
"""Read address 0 through ctypes."""
SIGTERM_SELF = 4
GARBLE = 5
"""Send the server a datagram that is no message (an unknown tag), then echo."""
NOT_A_MESSAGE = b"\x92\xa1?\x01"
"""MessagePack ``["?", 1]``: shaped like a message, with a tag no message has."""


def _send_not_a_message() -> None:
    # The worker's channel is its one SOCK_SEQPACKET socket; the model cannot reach it
    # otherwise, which is the point: only a broken worker sends such a thing.
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=int(name))
        except (OSError, ValueError):
            continue
        try:
            if sock.type == socket.SOCK_SEQPACKET:
                sock.send(NOT_A_MESSAGE)
        except OSError:
            pass
        finally:
            sock.detach()


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


class CrashingModel:
    """Echoes ``x``; ``action`` (one INT32) crashes the process in the chosen way (or
    breaks the message protocol)."""

    inputs = [TensorSpec("x", "FP32", (-1,)), TensorSpec("action", "INT32", (1,))]
    outputs = [TensorSpec("y", "FP32", (-1,))]

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Crash as asked, else echo."""
        action = int(inputs["action"].reshape(-1)[0])
        if action == EXIT:
            os._exit(3)
        if action == SIGKILL_SELF:
            os.kill(os.getpid(), signal.SIGKILL)
        if action == SEGFAULT:
            ctypes.string_at(0)
        if action == SIGTERM_SELF:
            os.kill(os.getpid(), signal.SIGTERM)
        if action == GARBLE:
            _send_not_a_message()
        return {"y": inputs["x"].copy()}


class HangingModel:
    """Echoes ``x`` after ``delay_ms`` (one INT32); a negative delay hangs forever."""

    inputs = [TensorSpec("x", "FP32", (-1,)), TensorSpec("delay_ms", "INT32", (1,))]
    outputs = [TensorSpec("y", "FP32", (-1,))]

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Sleep, then echo."""
        delay_ms = int(inputs["delay_ms"].reshape(-1)[0])
        if delay_ms < 0:
            while True:
                time.sleep(3600)
        time.sleep(delay_ms / 1000)
        return {"y": inputs["x"].copy()}


class LeakyModel:
    """Each call allocates and keeps ``x`` (FP32 [batch, 1], the first value) MiB more, every
    page touched; returns the MiB kept in all, one row per input row."""

    inputs = _X
    outputs = [TensorSpec("held_mb", "INT64", (-1, 1))]

    def __init__(self) -> None:
        self._hoard: list[np.ndarray] = []

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Allocate, touch every page, keep it."""
        x = inputs["x"]
        mb = int(x.reshape(-1)[0])
        if mb > 0:
            self._hoard.append(np.ones(mb * MIB, dtype=np.uint8))
        held = sum(a.nbytes for a in self._hoard) // MIB
        return {"held_mb": np.full((x.shape[0], 1), held, dtype=np.int64)}


class FailingLoadModel:
    """Raises while loading."""

    def load(self, version_dir: str) -> None:
        """Fail with a message the test looks for."""
        raise RuntimeError("weights are corrupt: checksum mismatch; this model refuses to load")

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Never reached."""
        raise AssertionError("not loaded")


class RaisingModel:
    """Raises ValueError when ``x`` holds a negative number, else echoes."""

    inputs = [TensorSpec("x", "FP32", (-1,))]
    outputs = [TensorSpec("y", "FP32", (-1,))]

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Reject negatives."""
        x = inputs["x"]
        if np.any(x < 0):
            raise ValueError("negative values are not allowed")
        return {"y": x.copy()}


class RawEchoModel:
    """Returns every input unchanged under ``<name>_out`` (any dtype, BYTES included)."""

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Echo."""
        return {f"{name}_out": value.copy() for name, value in inputs.items()}


PACE_S = 0.04
"""Seconds every call of :class:`PacedModel` takes, whatever its batch: a capacity that
CPU contention does not move (it sleeps)."""


class PacedModel(EchoModel):
    """``y = x + 1``, taking :data:`PACE_S` per call: a model of known, fixed capacity."""

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Sleep the pace, then add one."""
        time.sleep(PACE_S)
        return {"y": (inputs["x"] + 1).astype(np.float32)}


class DoublingModel(EchoModel):
    """``y = 2 x`` at once: a cheap fallback whose answers differ from the others'."""

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Double."""
        return {"y": (inputs["x"] * 2).astype(np.float32)}


ROW_S = 0.0002
"""Seconds per row every call of :class:`RowsModel` takes: 4,500 rows take 0.9 s."""


class RowsModel(EchoModel):
    """``y = x``, taking :data:`ROW_S` per row: a model whose batch cost grows with its
    rows (issue 33's slow first call, and requests too big for a deadline)."""

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Sleep for the rows, then echo."""
        time.sleep(ROW_S * len(inputs["x"]))
        return {"y": inputs["x"].astype(np.float32)}


def no_temp_dir() -> None:
    """A fork server preload hook (``fault_models:no_temp_dir``, this folder on
    ``PYTHONPATH``): the workers it forks find no temporary folder, as on a full or
    read-only disk, so a spare's llama.cpp warm-up (it writes its model there) fails."""
    import tempfile

    tempfile.tempdir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no-such-dir")
