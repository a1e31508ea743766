"""BenchConfig: everything one ``modelyard bench`` run needs, validated up front."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    model_validator,
)

from modelyard.bench.workload import MixSpec


class BenchConfig(BaseModel):
    """One benchmark: the target, the workload and the phases to run.

    A phase runs per concurrency level, or in open loop per (rate, concurrency) pair. Each
    phase warms up for ``warmup_s``, then measures ``requests`` requests or ``duration_s``
    seconds.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = "http://127.0.0.1:8080"
    """Base URL of the server's KServe v2 REST endpoint."""
    grpc_target: str | None = None
    """``host:port`` of the server's gRPC endpoint; when set, requests go over gRPC."""
    token: SecretStr | None = None
    """Bearer token sent with every request (the server's data token, or its management
    token when the model list comes from the repository index)."""
    ca_file: Path | None = None
    """PEM CA bundle to trust for an ``https://`` URL; with ``grpc_target``, gRPC uses TLS."""
    models: tuple[str, ...] = ()
    """Models to send to; empty means every READY model the server lists."""
    mix: MixSpec = MixSpec()
    """How requests are spread over the models."""
    concurrency: tuple[PositiveInt, ...] = (1,)
    """Requests in flight per phase (closed loop), or the most in flight (open loop)."""
    rates: tuple[PositiveFloat, ...] = ()
    """Open loop: target requests per second, one phase each; empty means closed loop."""
    replay_trace_timing: bool = False
    """Open loop that sends at the trace's own timestamps (needs a ``trace`` mix)."""
    duration_s: PositiveFloat | None = 10.0
    """Measured seconds per phase, unless ``requests`` is set."""
    requests: PositiveInt | None = None
    """Measured requests per phase; takes precedence over ``duration_s``."""
    warmup_s: NonNegativeFloat = 2.0
    """Seconds at the start of each phase whose requests are not counted."""
    engine: Literal["python", "wrk"] = "python"
    """Who sends: this process (``python``) or the ``wrk`` tool, closed loop over REST only."""
    http_client: Literal["raw", "aiohttp"] = "raw"
    """REST client: pre-built HTTP/1.1 over asyncio streams, or aiohttp (needed for HTTPS)."""
    payload_files: dict[str, Path] = Field(default_factory=dict)
    """Model name → v2 JSON request body to send instead of a generated one."""
    seed: int = 0
    """Seeds the model mix, the payload data and the open-loop arrivals."""
    request_timeout_s: PositiveFloat = 30.0
    """A request without a response by then counts as a ``timeout`` error."""
    max_phase_s: PositiveFloat = 600.0
    """Hard cap on one phase's measured time when it is bounded by ``requests``."""
    progress: bool = False
    """Print a live progress line on stderr."""

    @property
    def is_open_loop(self) -> bool:
        """Whether arrivals are scheduled (open loop) rather than back to back."""
        return bool(self.rates) or self.replay_trace_timing

    @model_validator(mode="after")
    def _check_combinations(self) -> BenchConfig:
        if not self.concurrency:
            raise ValueError("concurrency needs at least one level")
        if self.requests is None and self.duration_s is None:
            raise ValueError("set duration_s or requests")
        if self.replay_trace_timing:
            if self.mix.kind != "trace":
                raise ValueError("replay_trace_timing needs a trace mix")
            if self.rates:
                raise ValueError("replay_trace_timing and rates are exclusive")
        if self.mix.kind == "trace" and self.models:
            raise ValueError("a trace names its own models; do not also set models")
        if self.engine == "wrk":
            if self.grpc_target is not None:
                raise ValueError("the wrk engine speaks REST only")
            if self.is_open_loop:
                raise ValueError("the wrk engine runs closed loop only")
            if self.requests is not None:
                raise ValueError("the wrk engine runs for a duration, not a request count")
        return self
