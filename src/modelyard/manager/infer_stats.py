"""Per-version inference statistics in the shape of Triton's statistics extension.

One :class:`InferStats` per model version (``ModelRecord.infer_stats``), kept for the
server's lifetime across loads and unloads. The data plane counts each request's
outcome (:meth:`InferStats.succeeded`, :meth:`InferStats.failed`); the scheduler's
batch hook counts each model call (:meth:`InferStats.executed`). Only sums and counts:
O(1) per request, plus one entry per distinct batch size.

modelyard copies inputs to the worker and outputs back as part of one model call, so
``compute_input`` and ``compute_output`` count every executed request with 0 ns: their
time is inside ``compute_infer``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class Duration:
    """A count and the nanoseconds it summed to."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float, times: int = 1) -> None:
        """Count ``times`` events of ``seconds`` each."""
        self.count += times
        self.ns += int(seconds * 1e9) * times

    def as_dict(self) -> dict[str, int]:
        """``{"count", "ns"}``."""
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchStats:
    """The model calls of one batch size."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class InferStats:
    """What one model version has done since the server started."""

    inference_count: int = 0
    """Inferences (batch rows) of successful requests."""
    execution_count: int = 0
    """Model calls (one per batch)."""
    last_inference_ms: int = 0
    """When the last successful request finished, in ms since the epoch (0: never)."""
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    batches: dict[int, BatchStats] = field(default_factory=dict)

    def succeeded(self, rows: int, seconds: float) -> None:
        """A request of ``rows`` inferences answered after ``seconds``, now."""
        success = self.success  # Duration.add, inline: this runs on every request
        success.count += 1
        success.ns += int(seconds * 1e9)
        self.inference_count += rows
        self.last_inference_ms = int(time.time() * 1000)

    def failed(self, seconds: float) -> None:
        """A request that failed after ``seconds``."""
        self.fail.add(seconds)

    def executed(self, rows: int, queue_waits_s: list[float], compute_s: float) -> None:
        """One model call of ``rows`` rows for requests that waited ``queue_waits_s``."""
        # Per batch: the counts inline, and the zero durations counted without adding 0.
        self.execution_count += 1
        requests = len(queue_waits_s)
        queue = self.queue
        queue.count += requests
        queue.ns += int(sum(queue_waits_s) * 1e9)
        compute_ns = int(compute_s * 1e9)
        self.compute_input.count += requests
        self.compute_infer.count += requests
        self.compute_infer.ns += compute_ns * requests
        self.compute_output.count += requests
        batch = self.batches.get(rows)
        if batch is None:
            batch = self.batches[rows] = BatchStats()
        batch.compute_input.count += 1
        batch.compute_infer.count += 1
        batch.compute_infer.ns += compute_ns
        batch.compute_output.count += 1

    def as_dict(self, name: str, version: str) -> dict[str, object]:
        """Triton's ``$model_stat`` JSON object (the gRPC message's field names)."""
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(),
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(),
                "cache_hit": Duration().as_dict(),
                "cache_miss": Duration().as_dict(),
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": b.compute_input.as_dict(),
                    "compute_infer": b.compute_infer.as_dict(),
                    "compute_output": b.compute_output.as_dict(),
                }
                for size, b in sorted(self.batches.items())
            ],
        }
