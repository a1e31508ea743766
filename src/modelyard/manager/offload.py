"""Layer offload: how many layers of a GGUF model go to the GPU it is placed on.

Seed 000's layer-level loading, as a placement decision rather than a runtime guess.
A ``llama_cpp`` model placed on ``cuda:N`` with ``n_gpu_layers: auto`` (the default)
gets as many layers as fit in the device's free budget: placement makes room for one
layer at least (the cheapest device, evicting only what that takes, per its rules), and
then every layer that fits in the free budget plus what is leaving (those evictions
included) is offloaded. A load never evicts a model only to offload more layers: free
room first, as placement does everywhere. A fixed ``n_gpu_layers`` is kept as it is.

The device part (offloaded blocks, their KV cache, the compute buffers, and the worker's
CUDA context and pools, which NVML's per-process figure counts) is reserved on
the GPU as the worker's private memory; the rest (the blocks left on the CPU, their KV
cache, the embeddings, the host's buffers) is reserved on the host's ``cpu`` device
under the same key, and both are given back together. The arithmetic comes from the
GGUF header (``manager/llm_memory.py``); the event log (``offloaded``) and the model's
stats (``offload``) say how many layers went where and why, and the worker is started
with that ``n_gpu_layers``. On a CPU device ``auto`` is 0: a GPU is never used outside
its own budget.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from modelyard.config.model_config import SERVER_KEYS
from modelyard.errors import ModelLoadError
from modelyard.manager.admission import Admission
from modelyard.manager.devices import DeviceTable
from modelyard.manager.events import EventLog
from modelyard.manager.llm_memory import (
    GPU_WORKER_BYTES,
    LayerSplit,
    gguf_estimate,
    model_gguf,
    split_layers,
)
from modelyard.manager.records import Holder, ModelRecord
from modelyard.repository.gguf import GGUFError

__all__ = ["HOST_DEVICE", "OffloadPlan", "Offloader"]

log = logging.getLogger("modelyard.offload")

_MIB = 1024 * 1024
HOST_DEVICE = "cpu"
"""The device whose budget holds a GPU model's host part (when configured)."""


@dataclass(frozen=True, slots=True)
class OffloadPlan:
    """Where a GGUF model's layers went on one load, and why."""

    device: str
    gpu_layers: int
    """The ``n_gpu_layers`` the worker is started with."""
    layers: int
    """Repeating blocks in the model (``n_gpu_layers`` may be one more: the output)."""
    device_bytes: int
    """Reserved on ``device`` before the load (replaced by the measured footprint)."""
    host_bytes: int
    """Reserved on :data:`HOST_DEVICE` (0 when no such device is configured)."""
    host_device: str | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        """The stats view's ``offload`` entry."""
        return {
            "device": self.device,
            "gpu_layers": self.gpu_layers,
            "layers": self.layers,
            "device_bytes": self.device_bytes,
            "host_device": self.host_device,
            "host_bytes": self.host_bytes,
            "reason": self.reason,
        }


class Offloader:
    """Chooses ``n_gpu_layers`` for GGUF models on GPUs and reserves both parts."""

    def __init__(
        self, devices: DeviceTable, admission: Admission, events: EventLog | None = None
    ) -> None:
        self.devices = devices
        self._admission = admission
        self._events = events

    def applies(self, record: ModelRecord, device: str) -> bool:
        """True when ``record`` is a GGUF model and ``device`` a GPU (not a LoRA adapter:
        its base's worker holds the layers; it charges its own bytes where the base is)."""
        dev = self.devices.devices.get(device)
        return (
            record.config.runtime == "llama_cpp"
            and record.config.base is None
            and dev is not None
            and dev.parsed.is_cuda
        )

    def split(self, record: ModelRecord) -> LayerSplit | None:
        """The model's memory layer by layer (None when its header cannot be read)."""
        try:
            return split_layers(model_gguf(record), record.config.generation, GPU_WORKER_BYTES)
        except (OSError, GGUFError):
            return None

    def demand(self, record: ModelRecord, device: str, need: int, *, replica: bool) -> int:
        """The private bytes placement must find for ``record`` on ``device``: on a GPU,
        a fixed ``n_gpu_layers``'s device part, or with ``auto`` one layer's (more are
        added as they fit); elsewhere ``need``. An extra replica keeps ``need`` (its
        first replica's measured footprint)."""
        split = self.split(record) if self.applies(record, device) and not replica else None
        if split is None:
            return need
        fixed = record.config.generation.n_gpu_layers
        return split.device_bytes(1 if fixed == "auto" else fixed)

    def gpu_layers(self, record: ModelRecord, device: str) -> int:
        """The ``n_gpu_layers`` a worker of ``record`` on ``device`` is started with."""
        if not self.applies(record, device):
            return 0  # no GPU outside its budget (a CUDA build would use GPU 0)
        plan = record.offload
        if plan is not None and self.applies(record, plan.device):
            return plan.gpu_layers  # extra replicas on a GPU match the first one
        fixed = record.config.generation.n_gpu_layers
        if fixed != "auto":
            return fixed
        split = self.split(record)
        return split.most if split is not None else 0

    def runtime_options(self, record: ModelRecord, device: str) -> dict[str, str]:
        """The runtime's options: the config's, plus a generative model's ``generation:``
        settings (n_ctx, n_threads, parallel, n_batch, and ``n_gpu_layers`` as chosen for
        ``device``) as strings; brownout's stay in the server, which applies them."""
        cfg = record.config
        options = dict(cfg.options)
        if cfg.is_generative:
            gen = cfg.generation
            for key, value in gen.model_dump(exclude=SERVER_KEYS).items():
                if value is not None:
                    options[key] = str(value)
            if cfg.runtime == "llama_cpp":
                options["n_gpu_layers"] = str(self.gpu_layers(record, device))
            elif gen.n_gpu_layers == "auto":
                del options["n_gpu_layers"]
        return options

    def choose(self, record: ModelRecord, split: LayerSplit, *, may_evict: bool) -> OffloadPlan:
        """How many layers of ``record`` go to its GPU (see the module doc)."""
        device = record.device
        admission = self._admission
        budget = admission.budget
        account = budget.device(device)
        base = account.free_bytes + account.reservations.get(record.key, 0)
        leaving = admission.leaving(device)
        available = base + budget.freed_by(device, leaving)
        fixed = record.config.generation.n_gpu_layers
        gone: list[str] = []
        if fixed != "auto":
            n = min(fixed, split.most)
            why = f"n_gpu_layers {fixed} set in the config"
        else:
            floor = split.device_bytes(1)
            if may_evict and available < floor:
                # Placement chose this device counting these evictions: whatever they
                # give back beyond one layer is room for more layers.
                plan = admission.plan(record, device, floor - base, [], leaving)
                if plan is not None:
                    spares, victims = plan
                    keys: list[Holder] = list(leaving) + [rep.key for _, rep in spares]
                    keys += [k for v in victims for k in admission.holders(v, device)]
                    available = base + budget.freed_by(device, keys)
                    gone = [str(rep.key) for _, rep in spares] + [str(v.key) for v in victims]
            # At least one layer: with less room, admission waits for loads in progress
            # (placement counted them) or refuses with its reason.
            n = max(1, split.most_that_fit(available))
            after = f" after evicting {', '.join(gone)}" if gone else ""
            why = (
                f"n_gpu_layers auto: {n} of {split.most} fit in {available / _MIB:.1f} MiB "
                f"free on {device}{after}"
            )
        host = HOST_DEVICE if HOST_DEVICE in self.devices.devices else None
        where = (
            f"host part charged to {host}"
            if host
            else f"host part not budgeted: no '{HOST_DEVICE}' device is configured"
        )
        return OffloadPlan(
            device=device,
            gpu_layers=n,
            layers=split.layers,
            device_bytes=split.device_bytes(n),
            host_bytes=split.host_bytes(n) if host else 0,
            host_device=host,
            reason=f"{why}: {split.describe(n)}; {where}",
        )

    def _on_host(self, record: ModelRecord, need: int) -> OffloadPlan | None:
        """A GGUF model on a CPU device: every layer stays there, as its stats say."""
        estimate = gguf_estimate(record)
        if estimate is None:
            return None
        layers = estimate.dims.layers
        fixed = record.config.generation.n_gpu_layers
        asked = "auto" if fixed == "auto" else f"{fixed} (set in the config)"
        reason = (
            f"n_gpu_layers {asked} on {record.device}: 0 of {layers + 1} offloaded, every "
            "layer on the CPU (a CPU device uses no GPU)"
        )
        return OffloadPlan(record.device, 0, layers, need, 0, None, reason)

    async def admit(
        self, record: ModelRecord, need: int, deadline: float | None, *, may_evict: bool
    ) -> None:
        """Reserve what a load of ``record`` on its device needs: ``need`` bytes, or for
        a GGUF model on a GPU, the device part of its chosen layers there and the host
        part on the CPU (both or neither)."""
        admission = self._admission
        if record.config.base is not None:  # an adapter: no layers of its own to place
            record.offload = None
            await admission.admit(record, need, deadline, may_evict=may_evict)
            return
        if not self.applies(record, record.device):
            record.offload = self._on_host(record, need)
            await admission.admit(record, need, deadline, may_evict=may_evict)
            return
        split = self.split(record)
        if split is None:
            raise ModelLoadError(f"model {record.key}: cannot read its GGUF header")
        plan = self.choose(record, split, may_evict=may_evict)
        record.offload = plan
        await admission.admit(record, plan.device_bytes, deadline, may_evict=may_evict)
        if plan.host_device is not None:
            try:
                await admission.admit(
                    record,
                    plan.host_bytes,
                    deadline,
                    may_evict=may_evict,
                    device=plan.host_device,
                    files=[],  # the CPU layers' pages are in host_bytes, private
                )
            except BaseException:
                admission.release(record)
                raise
            record.reserved_bytes = admission.budget.reserved(record.device, record.key)
        if self._events is not None:
            self._events.add("offloaded", record.key, plan.reason)
        log.info("offloading %s: %s", record.key, plan.reason)
