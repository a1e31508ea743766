"""ModelConfig: one entry of ``models:`` in ``modelyard.yaml``; times in seconds, sizes in
MiB (see :mod:`modelyard.config.units` for the older names that still load)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, model_validator

from modelyard.config.devices import AUTO, DEVICE_NAME_PATTERN, ReplicasConfig
from modelyard.config.units import OldName, from_old_names

RuntimeKind = Literal[
    "onnx",
    "sklearn",
    "python",
    "torch",
    "xgboost",
    "lightgbm",
    "mlflow",
    "huggingface",
    "llama_cpp",
    "transformers",
]
Isolation = Literal["process", "inline"]

GENERATIVE_RUNTIMES: frozenset[str] = frozenset({"llama_cpp", "transformers"})
"""Runtimes that generate text (served by ``DataPlane.generate``, not tensor inference)."""


class GenerationConfig(BaseModel):
    """Settings of a generative model (``runtime: llama_cpp`` or ``transformers``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", title="generation")

    n_ctx: PositiveInt | None = None
    """Context tokens per sequence (prompt plus generated); default: the model's trained
    length, capped at 4096. The KV-cache reservation is sized from it."""
    n_threads: PositiveInt = 2
    """CPU threads that decode (llama.cpp's ``n_threads``)."""
    n_gpu_layers: NonNegativeInt | Literal["auto"] = "auto"
    """Layers offloaded to the GPU the model is placed on (llama.cpp). ``auto`` (the
    default): as many as fit in the device's free budget, the rest on the CPU, charged
    to the ``cpu`` device (see ``manager/offload.py``); on a CPU device, 0. A number is
    used as it is on a GPU (``layers + 1`` also offloads the output matrix)."""
    parallel: PositiveInt = 1
    """Sequences decoded together (llama.cpp's parallel sequences); requests beyond it
    queue. The KV cache holds ``n_ctx`` tokens for each."""
    n_batch: PositiveInt = 512
    """Prompt tokens evaluated per llama.cpp decode call."""
    weights: Literal["mapped", "repacked"] = "mapped"
    """How llama.cpp holds the weights. ``mapped`` (the default): read from the
    memory-mapped file, shared with every worker that maps it and charged once; loads in
    a fraction of the time. ``repacked``: llama.cpp's extra weight buffers (AMX or
    repacked quantized layouts), a private copy per worker charged as such, for faster
    kernels where the CPU has them (docs/decisions/0035-large-generative-models.md)."""
    prefix_reuse: bool = True
    """Keep what each sequence slot evaluated after its request ends, and start a later
    prompt that begins with the same tokens from there (llama.cpp; the KV cache it lives
    in is already budgeted). Off: every prompt is evaluated in full."""
    brownout_max_tokens: PositiveInt | None = None
    """Under overload, each newly admitted request's ``max_tokens`` is capped at this and
    its answer is marked (see :mod:`modelyard.scheduling.brownout`); None: brownout off."""
    brownout_queue_depth: NonNegativeInt = 0
    """Overload: every ``parallel`` slot busy and at least this many requests already
    waiting when a request arrives (0: every slot busy is enough)."""
    preempt: bool = True
    """A request that finds every slot busy pauses the least important running one when
    its own priority is higher (a smaller number): that sequence stops, and resumes from
    its tokens once a slot is free (vLLM's recompute preemption; greedy output is the
    same as without the pause). False: every request waits for a slot to end."""


BROWNOUT_KEYS = {"brownout_max_tokens", "brownout_queue_depth"}
"""The ``generation:`` keys of brownout."""
SERVER_KEYS = BROWNOUT_KEYS | {"preempt"}
"""The ``generation:`` keys the server applies itself (never passed to a runtime)."""


class VersionPolicy(BaseModel):
    """Which versions of a model are served (Triton's ``version_policy``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    latest: PositiveInt | None = 1
    """Serve the newest N versions (the default: only the newest)."""
    all: bool = False
    """Serve every version in the folder."""
    specific: list[NonNegativeInt | str] | None = None
    """Serve exactly these versions (folder names: ``[1, "1.3", "2024-11-01"]``)."""


class BreakerConfig(BaseModel):
    """A model's circuit breaker: a sliding window of recent outcomes.

    The one breaker type: the YAML's ``breaker:`` block is what the scheduler's
    :class:`~modelyard.scheduling.breaker.CircuitBreaker` runs on.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", title="breaker")

    window: PositiveInt = 20
    """How many recent model calls (one outcome each) the failure ratio is computed over."""
    failure_ratio: float = Field(default=0.5, gt=0, le=1)
    """Open when failures / calls in the window reach this."""
    min_calls: PositiveInt = 10
    """Never open before the window holds this many calls."""
    cooldown_s: float = Field(default=10.0, ge=0)
    """How long the breaker stays open before letting probes through."""
    half_open_probes: PositiveInt = 1
    """Requests let through at once while half-open; the first outcome decides."""

    @model_validator(mode="after")
    def _check(self) -> BreakerConfig:
        if self.min_calls > self.window:
            raise ValueError("breaker min_calls must not exceed window")
        return self


_OLD_NAMES: dict[str, OldName] = {
    "max_queue_delay_us": ("max_queue_delay_s", 1_000_000),
    "latency_slo_ms": ("latency_slo_s", 1000),
    "timeout_ms": ("timeout_s", 1000),
    "load_timeout_ms": ("load_timeout_s", 1000),
}
"""Older names of ModelConfig fields (other units), still accepted."""


def _one_device(data: Any) -> Any:
    """``device: X`` (the older spelling of one device) as ``devices: [X]``."""
    if not isinstance(data, dict) or "device" not in data:
        return data
    data = dict(data)
    device = data.pop("device")
    if "devices" in data and data["devices"] != [device]:
        raise ValueError("set 'device' or 'devices', not both ('device' is the older spelling)")
    data["devices"] = [device]
    return data


class ModelConfig(BaseModel):
    """Configuration of one model, as written under ``models:`` in the YAML file."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", max_length=128)
    """Model name used in URLs and requests."""
    path: str
    """Model folder, Triton-style ``<path>/<version>/<file>``; relative to the repository."""
    runtime: RuntimeKind = "onnx"
    """Runtime that loads the model files. Left out, the server infers it from the files
    (``.gguf`` → ``llama_cpp``, ``MLmodel`` → ``mlflow``, …; see
    :mod:`modelyard.repository.runtime_guess`) and logs the choice; ``onnx`` when
    nothing is recognised."""
    memory_mb: float | None = Field(default=None, gt=0)
    """First guess of the footprint in MiB; replaced by the measured footprint."""
    preload: bool = False
    """Load at start-up; otherwise load on first request."""
    pinned: bool = False
    """Never evict this model."""
    max_batch_size: NonNegativeInt = 8
    """Largest batch handed to one runtime call (0 disables batching)."""
    max_queue_delay_s: float = Field(default=0.0, ge=0)
    """How long the oldest queued request may wait for company (dynamic batching);
    older name ``max_queue_delay_us`` (microseconds)."""
    preferred_batch_sizes: list[PositiveInt] = Field(default_factory=list)
    """Batch sizes the batcher tries to form."""
    latency_slo_s: float | None = Field(default=None, gt=0)
    """Target p99; when set, batch size and delay adapt to keep under it; older name
    ``latency_slo_ms``."""
    latency_slo_by_priority_s: dict[PositiveInt, float] = Field(default_factory=dict)
    """Latency objective per request priority (``{1: 0.05, 3: 0.5}``); classes it does not
    name use ``latency_slo_s``. Under overload the less important classes are shed first
    so that the more important ones keep their objective
    (docs/decisions/0016-degradation-under-bursts.md)."""
    early_rejection: bool = True
    """Refuse at once (HTTP 429 with Retry-After, or send to the fallback) a request whose
    estimated wait, from the queue ahead and measured service times, ends past its
    deadline, instead of letting it wait to time out."""
    max_request_rows: PositiveInt | None = None
    """Most rows (the first dimension of the inputs) one request may carry; a larger one
    is refused at once with HTTP 413 / gRPC RESOURCE_EXHAUSTED saying so. Set it to what the
    model can run within ``timeout_s``: early rejection never refuses on an extrapolated
    batch cost (docs/decisions/0033), so this limit is what keeps requests too big for
    the deadline from running (and overrunning) at all. None: no limit."""
    fallback: list[str] = Field(default_factory=list)
    """Models that answer in this one's place, in order, when it cannot in time (queue
    full, breaker open, not loadable, deadline unreachable, shed); same input and
    output names and datatypes, checked when both are loaded."""
    max_queue_size: PositiveInt = 256
    """Requests that may wait for this model; beyond it, HTTP 429."""
    priority: int = Field(default=3, ge=1, le=10)
    """1 is the most important: evicted last, dequeued first."""
    timeout_s: float = Field(default=10.0, gt=0)
    """Default request deadline (queue plus execution); a request may shorten it.

    A request that has to wait for the model to load gets this much time after the
    load, so a cold model's first request does not time out by design; a deadline the
    client sets itself (``timeout`` parameter, ``X-Modelyard-Timeout-Ms``, gRPC
    deadline) still caps the request's total time, load included. Older name
    ``timeout_ms``."""
    overrun_grace_s: float = Field(default=2.0, ge=0)
    """How long a call may run on past its request's deadline before its worker is
    stopped (``isolation: process``). The caller gets its 504 at the deadline either way;
    a call that ends within the grace costs nothing more, so one slow call no longer
    restarts the worker. 0: stop the worker at the deadline. Calls too big to ever fit
    the deadline are refused up front by ``max_request_rows``."""
    load_timeout_s: float = Field(default=120.0, gt=0)
    """Longest a load may take (waiting for memory, starting, warming up); past it the
    load fails. Requests waiting for the load never shorten it. Older name
    ``load_timeout_ms``."""
    isolation: Isolation = "process"
    """``process``: own worker process; ``inline``: in the server process (tiny models)."""
    memory_limit_mb: float | None = Field(default=None, gt=0)
    """Kernel-enforced memory limit of the worker; default a margin over the footprint."""
    trusted: bool = False
    """Allow raw pickle files (scikit-learn); never set this for files you did not make."""
    python_class: str | None = Field(default=None, alias="class")
    """``module:Class`` of a user model (``runtime: python``), or the module class a
    safetensors state dict is loaded into (``runtime: torch``)."""
    share_weights: bool = False
    """Memory-map ONNX external-data weights so replicas share them."""
    huge_pages_min_mb: float | None = Field(default=10240.0, ge=0)
    """Weight files of at least this many MiB that the worker maps (a GGUF, safetensors,
    ONNX external data) get transparent huge pages (``madvise(MADV_HUGEPAGE)``) once
    loaded: the design notes' "2 MB pages for models over 10 GB"; null: never. Advice
    only: the kernel's THP mode decides (docs/seeds.md)."""
    intra_op_threads: PositiveInt = 1
    """Threads one inference may use (ONNX Runtime intra-op)."""
    devices: list[str] | Literal["auto"] = Field(default_factory=lambda: ["cpu"])
    """Devices the model may be placed on, in order of preference (``[cuda:0, cpu]``),
    or ``auto`` (any configured device). Each load and each replica goes to the allowed
    device where it fits at the lowest cost; a CUDA device that is missing is skipped
    only when the list goes on to another device, never silently replaced. The older
    spelling ``device: cuda:0`` (one device) still loads, as ``devices: [cuda:0]``."""
    replicas: ReplicasConfig = Field(default_factory=ReplicasConfig)
    """Workers of one version serving at once (``{min, max}``) and when to scale."""
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    """Circuit breaker settings."""
    version_policy: VersionPolicy = Field(default_factory=VersionPolicy)
    """Which versions are served."""
    default_version: str | None = None
    """Version or alias used when a request names none; default: the newest served."""
    options: dict[str, str] = Field(default_factory=dict)
    """Runtime-specific options (e.g. torch tensor names: ``inputs: "x:FP32:-1x4"``)."""
    warmup_inputs: dict[str, list[object]] | None = None
    """Sample inputs for warm-up (nested lists by input name); default: generated."""
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    """Context, threads, offload and parallel sequences of a generative model."""
    base: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    """A LoRA adapter over another model (``runtime: llama_cpp``): the name of the model
    it applies to; this model's own folder holds the adapter (a GGUF LoRA file, as
    llama.cpp's ``convert_lora_to_gguf.py`` writes it). The adapter runs inside the base's
    worker, as a context of its own over the base's loaded weights (its ``generation``
    settings: ``n_ctx``, ``parallel``…); loading it loads the base first. The base is
    charged once; each adapter's tensors and KV cache are charged to the adapter. A base
    that loaded adapters use is not evicted; unloading it unloads them first."""

    @property
    def is_generative(self) -> bool:
        """True when the runtime generates text (``llama_cpp``, ``transformers``)."""
        return self.runtime in GENERATIVE_RUNTIMES

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        return from_old_names(_one_device(data), _OLD_NAMES)

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.runtime == "python" and not self.python_class:
            raise ValueError("runtime 'python' needs 'class: module:Class'")
        if self.python_class and ":" not in self.python_class:
            raise ValueError("'class' must be 'module:Class'")
        if self.is_generative and self.isolation != "process":
            raise ValueError(f"runtime {self.runtime!r} runs in a worker process only")
        if isinstance(self.devices, list):
            self._check_devices(self.devices)
        if any(slo <= 0 for slo in self.latency_slo_by_priority_s.values()):
            raise ValueError("latency_slo_by_priority_s objectives must be > 0 seconds")
        if self.base is not None:
            if self.runtime != "llama_cpp":
                raise ValueError("'base' (a LoRA adapter over a model) needs runtime llama_cpp")
            if self.base == self.name:
                raise ValueError(f"model {self.name!r} cannot be its own base")
            if self.replicas.max > 1:  # its context lives in the base's one worker
                raise ValueError(
                    f"model {self.name!r}: a LoRA adapter runs in its base's worker and "
                    "takes no replicas (raise its generation.parallel instead)"
                )
        if self.name in self.fallback:
            raise ValueError(f"model {self.name!r} cannot be its own fallback")
        if len(set(self.fallback)) != len(self.fallback):
            raise ValueError(f"fallback of {self.name!r} names a model twice: {self.fallback}")
        return self

    def _check_devices(self, devices: list[str]) -> None:
        if not devices:
            raise ValueError("'devices' must name at least one device (or be 'auto')")
        for name in devices:
            if not re.match(DEVICE_NAME_PATTERN, name):
                raise ValueError(f"'devices': {name!r} is not a device name")
        if len(set(devices)) != len(devices):
            raise ValueError("'devices' names a device twice")

    @property
    def allowed_devices(self) -> list[str] | None:
        """The devices this model may use in order of preference; None for ``auto``."""
        if self.devices == AUTO:
            return None
        return list(self.devices)

    @property
    def device(self) -> str:
        """The device the model prefers: the first of ``devices`` (``cpu`` for ``auto``)."""
        return "cpu" if self.devices == AUTO else self.devices[0]
