"""One model call for one batch: concatenate, execute with the batch deadline, split.

``execute`` is the worker layer's entry point (it picks the replica); this module only
shapes the call and reports what happened, as a :class:`CallReport`. Answering the
requests, and feeding the breaker, the adaptive controller and the metrics hook, is the
scheduler's job.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from modelyard.clock import Clock
from modelyard.errors import (
    DeadlineExceededError,
    InternalError,
    ModelLoadError,
    ServerError,
    WorkerCrashedError,
)
from modelyard.scheduling.batcher import concat_inputs, split_outputs
from modelyard.scheduling.request_queue import QueuedRequest

logger = logging.getLogger(__name__)

Execute = Callable[[dict[str, np.ndarray], float], Awaitable[dict[str, np.ndarray]]]
"""``execute(batched_inputs, deadline_monotonic) -> outputs``; raises ServerError subclasses."""

MODEL_FAULTS: tuple[type[ServerError], ...] = (
    WorkerCrashedError,
    ModelLoadError,
    DeadlineExceededError,
    InternalError,
)
"""Errors that are the model's fault, and so count against its circuit breaker."""


@dataclass(frozen=True, slots=True)
class CallReport:
    """What one model call did."""

    requests: list[QueuedRequest]
    """The requests sent, in batch order."""
    outputs: list[dict[str, np.ndarray]]
    """Each request's share of the outputs; empty when the call failed."""
    error: ServerError | None
    deadline: float
    """The batch deadline: the earliest of its requests'."""
    started: float
    ended: float

    @property
    def rows(self) -> int:
        """Rows in the batch."""
        return total_rows(self.requests)

    @property
    def compute_s(self) -> float:
        """How long the call took."""
        return self.ended - self.started

    @property
    def is_late(self) -> bool:
        """True when the call succeeded only after the batch deadline."""
        return self.error is None and self.ended > self.deadline

    @property
    def is_model_fault(self) -> bool:
        """True when the outcome counts as a failure against the model."""
        return self.is_late or isinstance(self.error, MODEL_FAULTS)


def total_rows(requests: Sequence[QueuedRequest]) -> int:
    """Rows of ``requests`` together (a loop: no generator per request, on every batch)."""
    total = 0
    for request in requests:
        total += request.rows
    return total


async def call_model(
    name: str, execute: Execute, clock: Clock, requests: list[QueuedRequest]
) -> CallReport:
    """Run ``requests`` (which share a batch key) as one call; never raises a ServerError.

    Exceptions other than :class:`ServerError` become :class:`InternalError`, and so do
    outputs whose axis 0 does not match the batch. Cancellation propagates.
    """
    deadline = requests[0].deadline
    for request in requests:  # a loop: no generator per request
        if request.deadline < deadline:
            deadline = request.deadline
    error: ServerError | None = None
    parts: list[dict[str, np.ndarray]] = []
    started = clock.monotonic()
    try:
        outputs = await execute(concat_inputs([r.inputs for r in requests]), deadline)
    except ServerError as exc:
        error = exc
    except Exception as exc:
        error = untyped_error(name, exc)
    else:
        try:
            parts = split_outputs(outputs, [r.rows for r in requests])
        except ValueError as exc:  # the model broke the batch contract
            error = InternalError(f"model {name!r}: {exc}")
    return CallReport(requests, parts, error, deadline, started, clock.monotonic())


def untyped_error(name: str, exc: Exception) -> InternalError:
    """The typed error of a model call that raised something untyped (logged; call it
    inside the ``except`` so the traceback is logged too)."""
    logger.exception("model %r: the model call raised", name)
    return InternalError(f"model {name!r}: the model call raised {type(exc).__name__}: {exc}")
