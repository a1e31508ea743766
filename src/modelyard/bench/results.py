"""What one benchmark phase measured, and the cheap recorder that collects it."""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

ERROR_NOT_SENT = "not_sent"
"""Outcome of an open-loop arrival that was still unsent when the phase's time ran out."""


@dataclass(frozen=True)
class BenchResult:
    """One phase of a benchmark: a concurrency level and, in open loop, a target rate.

    ``requests`` counts every measured request whatever its outcome; ``qps`` counts those that
    were sent (all but ``not_sent``) per second of the measured window. Latency statistics
    cover successful requests only; in open loop they run from the *scheduled* send time, so
    queueing in the client counts (no coordinated omission). The ``wrk`` engine cannot
    separate failures, so its latencies include them.
    """

    engine: str
    mode: Literal["closed", "open"]
    concurrency: int
    target_rate: float | None
    requests: int
    ok: int
    duration_s: float
    qps: float
    mean_ms: float | None
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    errors: dict[str, int] = field(default_factory=dict)
    """Failed requests by code: HTTP status (``"503"``), gRPC status name, ``"timeout"``,
    ``"connection_error"`` or ``"not_sent"``."""
    requests_by_model: dict[str, int] = field(default_factory=dict)
    client_cpu_s: float = 0.0
    """User + system CPU seconds the benchmark process (or ``wrk``) spent in the window."""
    client_cpu_fraction: float = 0.0
    """``client_cpu_s`` over the window's wall time: 1.0 is one core kept busy."""

    @property
    def error_count(self) -> int:
        """Failed requests of every code."""
        return sum(self.errors.values())

    @property
    def client_cpu_ms_per_request(self) -> float | None:
        """Client CPU milliseconds per request, or ``None`` without requests."""
        return self.client_cpu_s * 1000 / self.requests if self.requests else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; :meth:`from_dict` reads it back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchResult:
        """Rebuild a result written by :meth:`to_dict`, ignoring unknown keys."""
        names = cls.__dataclass_fields__.keys()
        return cls(**{key: value for key, value in data.items() if key in names})


class Recorder:
    """Collects outcomes of one phase; ``record`` is on the hot path, so it only appends."""

    __slots__ = ("by_model", "done", "errors", "latencies_ns")

    def __init__(self) -> None:
        self.latencies_ns = array("q")
        self.errors: dict[str, int] = {}
        self.by_model: dict[str, int] = {}
        self.done = 0
        """Requests finished in this phase, warm-up included (for the progress line)."""

    def record(self, model: str, latency_ns: int, error: str | None) -> None:
        """Count one measured request."""
        self.by_model[model] = self.by_model.get(model, 0) + 1
        if error is None:
            self.latencies_ns.append(latency_ns)
        else:
            self.errors[error] = self.errors.get(error, 0) + 1

    def summarise(
        self,
        *,
        engine: str,
        mode: Literal["closed", "open"],
        concurrency: int,
        target_rate: float | None,
        duration_s: float,
        client_cpu_s: float,
    ) -> BenchResult:
        """The phase's result; ``duration_s`` is the measured window's wall time."""
        ok = len(self.latencies_ns)
        requests = ok + sum(self.errors.values())
        sent = requests - self.errors.get(ERROR_NOT_SENT, 0)
        stats = latency_stats_ms(np.frombuffer(self.latencies_ns, dtype=np.int64) / 1e6)
        return BenchResult(
            engine=engine,
            mode=mode,
            concurrency=concurrency,
            target_rate=target_rate,
            requests=requests,
            ok=ok,
            duration_s=duration_s,
            qps=sent / duration_s if duration_s > 0 else 0.0,
            errors=dict(sorted(self.errors.items())),
            requests_by_model=dict(sorted(self.by_model.items())),
            client_cpu_s=client_cpu_s,
            client_cpu_fraction=client_cpu_s / duration_s if duration_s > 0 else 0.0,
            **stats,
        )


def latency_stats_ms(latencies_ms: np.ndarray[Any, Any]) -> dict[str, float | None]:
    """``mean_ms``, ``p50_ms``, ``p90_ms``, ``p99_ms`` and ``max_ms`` (``None`` if empty)."""
    if latencies_ms.size == 0:
        return dict.fromkeys(("mean_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms"))
    p50, p90, p99 = np.percentile(latencies_ms, [50, 90, 99]).tolist()
    return {
        "mean_ms": _finite(float(latencies_ms.mean())),
        "p50_ms": _finite(p50),
        "p90_ms": _finite(p90),
        "p99_ms": _finite(p99),
        "max_ms": _finite(float(latencies_ms.max())),
    }


def _finite(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None
