"""ModelRecord: what the manager knows of one model version; ModelEntry: of one model."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from modelyard.config.model_config import ModelConfig
from modelyard.manager.infer_stats import InferStats
from modelyard.manager.keys import Holder, ModelKey, ReplicaKey
from modelyard.manager.replica import Replica, ReplicaState
from modelyard.manager.retry import LoadBackoff
from modelyard.manager.states import ModelState

if TYPE_CHECKING:
    from modelyard.manager.offload import OffloadPlan
    from modelyard.scheduling.generation_scheduler import GenerationScheduler
    from modelyard.scheduling.scheduler import ModelScheduler
    from modelyard.workers.instance import InstanceInfo, ModelInstance

__all__ = [
    "DEFAULT_ALIAS",
    "AliasRoute",
    "Holder",
    "LoadTimings",
    "ModelEntry",
    "ModelKey",
    "ModelRecord",
    "ModelStats",
    "Replica",
    "ReplicaKey",
    "ReplicaState",
]


@dataclass
class LoadTimings:
    """Model-switch latency of the last load, split by phase (seconds)."""

    queue_wait_s: float = 0.0
    process_start_s: float = 0.0
    runtime_load_s: float = 0.0
    warmup_s: float = 0.0
    total_s: float = 0.0


@dataclass
class ModelStats:
    """Per-version counters shown in the stats view."""

    requests: int = 0
    loads: int = 0
    unloads: int = 0
    evictions: int = 0
    restarts: int = 0
    prefetches: int = 0
    """Loads started by the predictor rather than a request."""
    prefetch_hits: int = 0
    """Prefetched loads a request then used."""
    prefetch_wasted: int = 0
    """Prefetched loads evicted before any request used them."""
    prefetch_hidden_s: float = 0.0
    """Load seconds requests did not wait because a prefetch had started the load."""
    page_cache_warms: int = 0
    """Times the files were read into the page cache for a predicted load that did not fit."""
    cold_starts: int = 0
    cold_start_s_total: float = 0.0
    last_used: float = 0.0
    """When the last request came, on the manager's clock (0: never)."""


@dataclass(eq=False)
class ModelRecord:
    """One version of one model and everything the manager tracks about it."""

    key: ModelKey
    config: ModelConfig
    path: Path
    state: ModelState = ModelState.UNLOADED
    reason: str = ""
    load_task: asyncio.Task[None] | None = None
    requests_awaiting_load: int = 0
    """Requests waiting for the load in progress (not preloads or explicit loads): one of
    them is sent the moment the model turns READY, and its footprint read waits for it."""
    reserved_bytes: int = 0
    measured_bytes: int | None = None
    timings: LoadTimings = field(default_factory=LoadTimings)
    stats: ModelStats = field(default_factory=ModelStats)
    infer_stats: InferStats = field(default_factory=InferStats)
    """Triton-shaped inference statistics (``GET /v2/models/{m}/stats``)."""
    leases: int = 0
    """Requests routed to this version that have not finished yet (queued or not)."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pinned: bool = False
    state_since: float = field(default_factory=time.monotonic)
    model_file: str = ""
    """The one file to load in ``path`` when the config's ``path`` names a file."""
    base_file: Path | None = None
    """A LoRA adapter's base GGUF file (the config's ``base``), resolved at each load."""
    backoff: LoadBackoff = field(default_factory=LoadBackoff)
    """When requests may retry a failed load."""
    device: str = ""
    """The device its first replica is placed on (or was, last; for ``devices: auto``,
    empty until the first placement)."""
    replicas: list[Replica] = field(default_factory=list)
    """Extra replicas (scale-out), each its own worker; empty for most models."""
    busy_since: float | None = None
    """Since when the model's queues have stayed above the scale-out target (None: not)."""
    queue_wait_s: float = 0.0
    """The longest queue wait of a request run since the scaler last looked (its replicas'
    schedulers report it after each batch)."""
    next_replica: int = 1
    """The index the next extra replica gets."""

    prefetched_at: float | None = None
    """When a prefetch started loading it, until a request uses it (None: not prefetched)."""
    offload: OffloadPlan | None = None
    """A GGUF model on a GPU: how many layers its last load put there, and why."""
    footprint_pending: ModelInstance | None = None
    """The instance serving on its admission reservation whose measured footprint is not
    committed yet (``manager/footprints.py``); None once it is, or when none is pending."""

    first: Replica = field(init=False, repr=False)
    """The version's first replica: its worker, its scheduler(s), its leases (the
    loader starts, restarts and stops it; extra replicas are in ``replicas``)."""

    def __post_init__(self) -> None:
        if not self.device:
            allowed = self.config.allowed_devices
            self.device = allowed[0] if allowed else ""
        self.first = Replica(ReplicaKey(self.key.name, self.key.version, 0), self.device)

    # The first replica's parts, read and written through the record as before.

    @property
    def instance(self) -> ModelInstance | None:
        """The first replica's worker instance (None: not loaded)."""
        return self.first.instance

    @instance.setter
    def instance(self, value: ModelInstance | None) -> None:
        self.first.instance = value

    @property
    def info(self) -> InstanceInfo | None:
        """What the first replica's worker reported when it loaded."""
        return self.first.info

    @info.setter
    def info(self, value: InstanceInfo | None) -> None:
        self.first.info = value

    @property
    def scheduler(self) -> ModelScheduler | None:
        """The first replica's tensor scheduler."""
        return self.first.scheduler

    @scheduler.setter
    def scheduler(self, value: ModelScheduler | None) -> None:
        self.first.scheduler = value

    @property
    def generation(self) -> GenerationScheduler | None:
        """The first replica's generation scheduler (generative models)."""
        return self.first.generation

    @property
    def in_flight(self) -> int:
        """Batches running on the first replica's instance now."""
        return self.first.in_flight

    @in_flight.setter
    def in_flight(self, value: int) -> None:
        self.first.in_flight = value

    @property
    def route_leases(self) -> int:
        """Requests routed to the first replica itself (not to an extra one)."""
        return self.first.leases

    @route_leases.setter
    def route_leases(self, value: int) -> None:
        self.first.leases = value

    def serving(self) -> list[Replica]:
        """Every replica of this version, the first first."""
        return [self.first, *self.replicas]

    @property
    def is_ready(self) -> bool:
        """True when requests can be served now."""
        instance = self.first.instance
        return self.state is ModelState.READY and instance is not None and instance.is_alive

    @property
    def pending(self) -> int:
        """Requests queued or running for this version (on any of its replicas)."""
        first = self.first
        queued = first.scheduler.pending if first.scheduler is not None else 0
        if first.generation is not None:
            queued += first.generation.pending
        for r in self.replicas:
            if r.scheduler is not None:
                queued += r.scheduler.pending
            if r.generation is not None:
                queued += r.generation.pending
        return max(queued, first.in_flight, self.leases)

    @property
    def pending_on_self(self) -> int:
        """Requests queued, running or routed on the first replica alone."""
        return self.first.pending


@dataclass(frozen=True, slots=True)
class AliasRoute:
    """Where an alias sends traffic: one version, or a weighted split (canary)."""

    targets: tuple[tuple[str, float], ...]
    """``(version, weight)`` pairs; weights need not sum to 1."""

    @property
    def versions(self) -> list[str]:
        """The versions this route can pick."""
        return [v for v, _ in self.targets]

    def pick(self, rng: random.Random) -> str:
        """One version, chosen by weight."""
        if len(self.targets) == 1:
            return self.targets[0][0]
        return rng.choices(self.versions, [w for _, w in self.targets])[0]

    def to_dict(self) -> dict[str, float]:
        """``{version: weight}``."""
        return dict(self.targets)


DEFAULT_ALIAS = "default"
"""The alias requests get when they name no version."""

SINGLE_FILE_VERSION = "1"
"""The version of a model whose config ``path`` names one model file."""


@dataclass(eq=False)
class ModelEntry:
    """A configured model: its config, its known versions and its aliases."""

    config: ModelConfig
    path: Path
    versions: dict[str, ModelRecord] = field(default_factory=dict)
    aliases: dict[str, AliasRoute] = field(default_factory=dict)
    """Alias name → route (``default``, ``stable``, ``canary``, …)."""
    alias_history: dict[str, list[AliasRoute]] = field(default_factory=dict)
    """Previous routes of each alias, newest last (for rollback)."""
    runtime_pin: bool | None = None
    """Pinned or unpinned over the API (None: as the config says); wins over the config."""

    @property
    def pinned(self) -> bool:
        """Whether this model's versions are kept loaded: the runtime pin, else the config's."""
        return self.config.pinned if self.runtime_pin is None else self.runtime_pin
