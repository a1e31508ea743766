"""Which refusals send a request to its fallback, and when two models' tensors match."""

from __future__ import annotations

import pytest

from modelyard.errors import (
    CircuitOpenError,
    DeadlineExceededError,
    DeadlineUnreachableError,
    InternalError,
    InvalidInputError,
    LoadShedError,
    MemoryBudgetError,
    ModelLoadError,
    ModelNotReadyError,
    OverloadedError,
    ServerError,
    WorkerCrashedError,
)
from modelyard.manager.fallback import allows_fallback, fallback_reason, tensor_mismatch
from modelyard.runtimes.base import TensorSpec
from modelyard.workers.instance import InstanceInfo


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (OverloadedError("full"), "queue_full"),
        (DeadlineUnreachableError("late"), "deadline"),
        (LoadShedError("shed"), "shed"),
        (CircuitOpenError("open"), "circuit_open"),
        (MemoryBudgetError("no room"), "unavailable"),
        (ModelLoadError("bad file"), "unavailable"),
        (ModelNotReadyError("failed"), "unavailable"),
        # Refusals after the request may have run, or that are the client's: no fallback.
        (DeadlineExceededError("late"), None),
        (WorkerCrashedError("crash"), None),
        (InvalidInputError("bad"), None),
        (InternalError("bug"), None),
    ],
)
def test_fallback_reasons(error: ServerError, reason: str | None) -> None:
    assert fallback_reason(error) == reason


def test_a_request_may_forbid_fallback() -> None:
    assert allows_fallback({})
    assert allows_fallback({"fallback": True})
    assert not allows_fallback({"fallback": False})
    with pytest.raises(InvalidInputError, match="must be true or false"):
        allows_fallback({"fallback": "no"})


def _info(inputs: dict[str, str], outputs: dict[str, str]) -> InstanceInfo:
    return InstanceInfo(
        inputs=[TensorSpec(n, d, (-1, 4)) for n, d in inputs.items()],
        outputs=[TensorSpec(n, d, (-1, 4)) for n, d in outputs.items()],
        supports_batching=True,
        footprint_bytes=0,
    )


def test_tensor_mismatch_compares_names_and_datatypes() -> None:
    model = _info({"x": "FP32"}, {"y": "FP32"})
    assert tensor_mismatch(model, _info({"x": "FP32"}, {"y": "FP32"})) is None
    wrong_type = tensor_mismatch(model, _info({"x": "FP64"}, {"y": "FP32"}))
    assert wrong_type is not None
    assert wrong_type.startswith("inputs differ")
    assert "x: FP64" in wrong_type
    wrong_name = tensor_mismatch(model, _info({"x": "FP32"}, {"z": "FP32"}))
    assert wrong_name is not None
    assert wrong_name.startswith("outputs differ")
