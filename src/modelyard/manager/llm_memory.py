"""The memory a GGUF model will take, computed from its header before any worker starts.

Three parts, as llama.cpp allocates them:

* **weights**: the file's size. The file is memory-mapped, so its pages are the page
  cache's, held once however many workers (replicas, versions hard-linked to one file)
  map it; the budget charges it once per file through its shared-file ledger.
* **KV cache**: ``n_ctx x parallel x layers x KV heads x head size x element size x 2``
  (keys and values), private to the worker.
* **compute buffers**: the scratch of one decode step for ``n_batch`` tokens (logits over
  the vocabulary, activations, attention scores over the context), plus the runtime's own
  fixed cost in the worker; a first guess that the measured footprint replaces.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelyard.config.model_config import GenerationConfig
from modelyard.manager.records import ModelRecord
from modelyard.repository.gguf import GGUFError, LlamaDims, llama_dims, read_metadata
from modelyard.runtimes.base import find_model_file

_MIB = 1024 * 1024
KV_ELEMENT_BYTES = 2
"""F16 keys and values (llama.cpp's default cache type)."""
DEFAULT_MAX_CONTEXT = 4096
"""The context a model gets without ``n_ctx``: its trained length, at most this (the same
rule as ``runtimes/llama_cpp.py``)."""
RUNTIME_OVERHEAD_BYTES = 24 * _MIB
"""llama.cpp's libraries and the worker's own allocations, measured on the example models."""


@dataclass(frozen=True, slots=True)
class GgufEstimate:
    """A GGUF model's reservation, part by part, with the arithmetic behind it."""

    file_bytes: int
    kv_cache_bytes: int
    compute_bytes: int
    n_ctx: int
    parallel: int
    dims: LlamaDims

    @property
    def private_bytes(self) -> int:
        """What the worker itself holds (the file is charged apart, once per file)."""
        return self.kv_cache_bytes + self.compute_bytes

    @property
    def total_bytes(self) -> int:
        """Weights plus private memory."""
        return self.file_bytes + self.private_bytes

    def arithmetic(self) -> str:
        """The sum in words, for refusals and logs."""
        d = self.dims
        return (
            f"weights {self.file_bytes / _MIB:.1f} MiB (the file, mapped) + KV cache "
            f"{self.kv_cache_bytes / _MIB:.1f} MiB (n_ctx {self.n_ctx} x parallel "
            f"{self.parallel} x {d.layers} layers x {d.kv_heads} KV heads x "
            f"{d.head_dim_k}+{d.head_dim_v} head size (K+V) x {KV_ELEMENT_BYTES} bytes) + "
            f"compute buffers {self.compute_bytes / _MIB:.1f} MiB = "
            f"{self.total_bytes / _MIB:.1f} MiB"
        )


def context_tokens(dims: LlamaDims, config: GenerationConfig) -> int:
    """The context per sequence the runtime will create."""
    return config.n_ctx or min(dims.context_length, DEFAULT_MAX_CONTEXT)


def estimate_gguf(path: Path, config: GenerationConfig) -> GgufEstimate:
    """The reservation of the GGUF file at ``path`` under ``config`` (GGUFError if the
    header cannot be read)."""
    dims = llama_dims(read_metadata(path))
    n_ctx = context_tokens(dims, config)
    kv = n_ctx * config.parallel * dims.kv_bytes_per_token(KV_ELEMENT_BYTES)
    n_batch = max(config.parallel, config.n_batch)
    # One ubatch of F32 activations: logits over the vocabulary and the intermediate
    # tensors of a layer (hidden and feed-forward widths); fitted on the example models
    # (10 and 60 MB: 25 and 45 MiB measured besides the KV cache, 35 and 44 estimated).
    step = n_batch * (dims.vocab_size + 10 * dims.width + 3 * dims.feed_forward) * 4
    return GgufEstimate(
        file_bytes=path.stat().st_size,
        kv_cache_bytes=kv,
        compute_bytes=step + RUNTIME_OVERHEAD_BYTES,
        n_ctx=n_ctx,
        parallel=config.parallel,
        dims=dims,
    )


def context_length_of(record: ModelRecord) -> int | None:
    """The context per sequence a generative model will have, read from its file's header
    before it loads (None when unknown: not GGUF, or the header cannot be read)."""
    cfg = record.config
    if cfg.runtime != "llama_cpp":
        return cfg.generation.n_ctx
    try:
        path = find_model_file(record.path, (".gguf",), record.model_file)
        return context_tokens(llama_dims(read_metadata(path)), cfg.generation)
    except (OSError, GGUFError):
        return cfg.generation.n_ctx
