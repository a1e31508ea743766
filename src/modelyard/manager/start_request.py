"""What a model's worker is started with: its runtime spec, warm-up inputs and limits."""

from __future__ import annotations

import numpy as np

from modelyard.manager.admission import Admission
from modelyard.manager.placement import Placer
from modelyard.manager.records import ModelRecord
from modelyard.runtimes.base import RuntimeSpec
from modelyard.runtimes.llama_backend import SPARE_CONTEXT_OPTION
from modelyard.workers.instance import StartRequest

__all__ = ["start_request"]

_MIB = 1024 * 1024


def start_request(
    record: ModelRecord,
    device: str,
    placer: Placer,
    admission: Admission,
    *,
    serves_adapters: bool = False,
) -> StartRequest:
    """What a worker of ``record`` on ``device`` is started with; ``serves_adapters``:
    LoRA adapters name ``record`` as their base (its worker then keeps a context made
    ahead for the next one, so an adapter's switch does not wait for a context)."""
    cfg = record.config
    parsed = placer.devices[device].parsed
    limit = None
    gpu_limit = None
    if parsed.is_cuda:
        # ``memory_limit_mb`` caps the device memory of a CUDA model; the host limit
        # is left off, as RLIMIT_AS would refuse the CUDA driver's address space.
        if cfg.memory_limit_mb:
            gpu_limit = int(cfg.memory_limit_mb * _MIB)
    elif cfg.memory_limit_mb:
        limit = int(cfg.memory_limit_mb * _MIB)
    elif record.measured_bytes:
        # A margin over what the model was measured to need last time.
        limit = int(record.measured_bytes * 2 + 256 * _MIB)
        # Mapped weight files are not in the measured footprint, but their pages
        # count in the worker's private memory while it is their only mapper.
        limit += sum(f.size for f in admission.mapped_files(record))
    spec = RuntimeSpec(
        kind=cfg.runtime,
        version_dir=str(record.path),
        model_name=cfg.name,
        trusted=cfg.trusted,
        python_class=cfg.python_class,
        # A core set's workers run one thread per core of the set.
        intra_op_threads=len(parsed.cores) if parsed.cores else cfg.intra_op_threads,
        share_weights=cfg.share_weights,
        device=device,
        cores=parsed.cores,
        gpu_memory_limit_bytes=gpu_limit,
        options=placer.offload.runtime_options(record, device)
        | ({SPARE_CONTEXT_OPTION: "1"} if serves_adapters else {}),
        model_file=record.model_file,
        huge_pages_min_bytes=(
            None if cfg.huge_pages_min_mb is None else int(cfg.huge_pages_min_mb * _MIB)
        ),
    )
    warmup = {k: np.asarray(v) for k, v in cfg.warmup_inputs.items()} if cfg.warmup_inputs else None
    return StartRequest(spec, warmup, limit, awaited=record.requests_awaiting_load > 0)
