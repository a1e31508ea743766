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

On a ``cuda:N`` device the same sums are split by layer (:class:`LayerSplit`): llama.cpp
offloads the *last* ``n_gpu_layers`` repeating blocks (and the output matrix when
``n_gpu_layers`` exceeds the block count), each with its share of the KV cache; the token
embeddings always stay on the CPU. What is offloaded is copied into device memory (the
worker's own, not the page cache); what stays is read from the mapped file on the host.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from modelyard.config.model_config import GenerationConfig
from modelyard.manager.records import ModelRecord
from modelyard.repository.gguf import (
    GGUFError,
    LlamaDims,
    llama_dims,
    read_metadata,
    tensor_sizes,
)
from modelyard.runtimes.base import find_model_file

_MIB = 1024 * 1024
KV_ELEMENT_BYTES = 2
"""F16 keys and values (llama.cpp's default cache type)."""
DEFAULT_MAX_CONTEXT = 4096
"""The context a model gets without ``n_ctx``: its trained length, at most this (the same
rule as ``runtimes/llama_cpp.py``)."""
RUNTIME_OVERHEAD_BYTES = 24 * _MIB
"""llama.cpp's libraries and the worker's own allocations, measured on the example models."""
GPU_WORKER_BYTES = 512 * _MIB
"""What a worker holds on a GPU before any layer: the CUDA context, cuBLAS's workspace and
llama.cpp's pools (300-500 MiB on recent drivers). NVML's per-process figure, the
footprint charged after the load, includes them, so the layers are planned around them."""


@dataclass(frozen=True, slots=True)
class GgufEstimate:
    """A GGUF model's reservation, part by part, with the arithmetic behind it."""

    file_bytes: int
    kv_cache_bytes: int
    compute_bytes: int
    n_ctx: int
    parallel: int
    dims: LlamaDims
    weight_copy_bytes: int = 0
    """Weights copied into the worker's own buffers (``weights: repacked``): the file's
    size, charged as private memory instead of as a shared mapped file."""

    @property
    def private_bytes(self) -> int:
        """What the worker itself holds (a mapped file is charged apart, once per file)."""
        return self.kv_cache_bytes + self.compute_bytes + self.weight_copy_bytes

    @property
    def total_bytes(self) -> int:
        """Weights plus private memory."""
        return (0 if self.weight_copy_bytes else self.file_bytes) + self.private_bytes

    def arithmetic(self) -> str:
        """The sum in words, for refusals and logs."""
        d = self.dims
        held = "a repacked copy" if self.weight_copy_bytes else "the file, mapped"
        return (
            f"weights {self.file_bytes / _MIB:.1f} MiB ({held}) + KV cache "
            f"{self.kv_cache_bytes / _MIB:.1f} MiB (n_ctx {self.n_ctx} x parallel "
            f"{self.parallel} x {d.layers} layers x {d.kv_heads} KV heads x "
            f"{d.head_dim_k}+{d.head_dim_v} head size (K+V) x {KV_ELEMENT_BYTES} bytes) + "
            f"compute buffers {self.compute_bytes / _MIB:.1f} MiB = "
            f"{self.total_bytes / _MIB:.1f} MiB"
        )


def context_tokens(dims: LlamaDims, config: GenerationConfig) -> int:
    """The context per sequence the runtime will create."""
    return config.n_ctx or min(dims.context_length, DEFAULT_MAX_CONTEXT)


_HEADERS_KEPT = 256
_headers: dict[tuple[str, int, int, int], tuple[LlamaDims, int]] = {}


def header_dims(path: Path) -> tuple[LlamaDims, int]:
    """The dimensions in the GGUF header at ``path`` and the file's size (GGUFError if
    the header cannot be read), kept by the file's identity (path, inode, size, modification
    time: a file rewritten or replaced is read again).

    A switch to a model asked for its header four or five times on the event loop (the
    request's context check, the estimate, the placement, the offload plan, the worker's
    options), each a Python parse of the whole key/value section (0.3-1 ms).
    """
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    found = _headers.get(key)
    if found is None:
        if len(_headers) >= _HEADERS_KEPT:
            del _headers[next(iter(_headers))]  # the oldest: insertion order
        found = _headers[key] = (llama_dims(read_metadata(path)), st.st_size)
    return found


def estimate_gguf(path: Path, config: GenerationConfig) -> GgufEstimate:
    """The reservation of the GGUF file at ``path`` under ``config`` (GGUFError if the
    header cannot be read)."""
    dims, file_bytes = header_dims(path)
    n_ctx = context_tokens(dims, config)
    kv = n_ctx * config.parallel * dims.kv_bytes_per_token(KV_ELEMENT_BYTES)
    n_batch = max(config.parallel, config.n_batch)
    # One ubatch of F32 activations: logits over the vocabulary and the intermediate
    # tensors of a layer (hidden and feed-forward widths); fitted on the example models
    # (10 and 60 MB: 25 and 45 MiB measured besides the KV cache, 35 and 44 estimated).
    step = n_batch * (dims.vocab_size + 10 * dims.width + 3 * dims.feed_forward) * 4
    return GgufEstimate(
        file_bytes=file_bytes,
        kv_cache_bytes=kv,
        compute_bytes=step + RUNTIME_OVERHEAD_BYTES,
        n_ctx=n_ctx,
        parallel=config.parallel,
        dims=dims,
        weight_copy_bytes=file_bytes if config.weights == "repacked" else 0,
    )


def model_gguf(record: ModelRecord) -> Path:
    """The GGUF model file of ``record``: its own, or an adapter's base file, whose header
    sizes the adapter's context (OSError when there is none, or an adapter's base is not
    resolved yet)."""
    if record.config.base is not None:
        if record.base_file is None:
            raise FileNotFoundError(f"the base of {record.key} is not resolved")
        return record.base_file
    return find_model_file(record.path, (".gguf",), record.model_file)


def adapter_bytes(record: ModelRecord) -> int:
    """The size of an adapter's own GGUF file (read into its base's worker), else 0."""
    if record.config.base is None:
        return 0
    try:
        return find_model_file(record.path, (".gguf",), record.model_file).stat().st_size
    except OSError:
        return 0


def context_length_of(record: ModelRecord) -> int | None:
    """The context per sequence a generative model will have, read from its file's header
    before it loads (None when unknown: not GGUF, or the header cannot be read)."""
    cfg = record.config
    if cfg.runtime != "llama_cpp":
        return cfg.generation.n_ctx
    try:
        return context_tokens(header_dims(model_gguf(record))[0], cfg.generation)
    except (OSError, GGUFError):
        return cfg.generation.n_ctx


def gguf_estimate(record: ModelRecord) -> GgufEstimate | None:
    """The header-based estimate of a ``llama_cpp`` model (None for other runtimes, or
    when the file cannot be read: the load then fails with the reason). An adapter's is
    its base's, plus the adapter's own bytes in its private part."""
    if record.config.runtime != "llama_cpp":
        return None
    try:
        estimate = estimate_gguf(model_gguf(record), record.config.generation)
    except (OSError, GGUFError):
        return None
    adapter = adapter_bytes(record)
    if adapter:
        estimate = replace(estimate, compute_bytes=estimate.compute_bytes + adapter)
    return estimate


@dataclass(frozen=True, slots=True)
class LayerSplit:
    """A GGUF model's memory layer by layer: what ``n_gpu_layers = n`` puts on the
    device and what it leaves on the host.

    ``n`` runs from 0 (all on the CPU) to ``layers + 1``: the last ``min(n, layers)``
    repeating blocks go to the device with their KV cache, and ``layers + 1`` moves the
    output matrix (and its norm) too, as llama.cpp counts it. The device also holds the
    compute buffers of one step once anything runs there; the host keeps its own, the
    runtime's fixed cost, the embeddings and every block not offloaded.
    """

    estimate: GgufEstimate
    input_bytes: int
    """Token embeddings and anything else outside the blocks and the output: host only."""
    layer_bytes: tuple[int, ...]
    """Weight bytes of each repeating block, ``blk.0`` first."""
    output_bytes: int
    """The output matrix and the final norm (``output.weight``, ``output_norm.weight``)."""
    device_fixed_bytes: int = 0
    """The worker's fixed cost on the device once anything runs there
    (:data:`GPU_WORKER_BYTES` on a GPU)."""

    @property
    def layers(self) -> int:
        """Repeating blocks."""
        return len(self.layer_bytes)

    @property
    def most(self) -> int:
        """The largest useful ``n_gpu_layers``: every block and the output."""
        return self.layers + 1

    @property
    def kv_layer_bytes(self) -> int:
        """One block's KV cache (``n_ctx x parallel`` tokens)."""
        return self.estimate.kv_cache_bytes // max(1, self.layers)

    @property
    def step_bytes(self) -> int:
        """The compute buffers of one decode step (without the runtime's fixed cost)."""
        return self.estimate.compute_bytes - RUNTIME_OVERHEAD_BYTES

    def _on_device(self, n: int) -> int:
        return min(max(n, 0), self.layers)

    def device_bytes(self, n: int) -> int:
        """Device memory with ``n_gpu_layers = n``."""
        k = self._on_device(n)
        weights = sum(self.layer_bytes[self.layers - k :]) if k else 0
        output = self.output_bytes if n > self.layers else 0
        fixed = self.step_bytes + self.device_fixed_bytes if n > 0 else 0
        return weights + output + k * self.kv_layer_bytes + fixed

    def host_bytes(self, n: int) -> int:
        """Host memory with ``n_gpu_layers = n``: the blocks left (weights read from the
        mapped file, and their KV cache), the embeddings, the output unless offloaded,
        the compute buffers and the runtime."""
        left = self.layers - self._on_device(n)
        output = 0 if n > self.layers else self.output_bytes
        return (
            self.input_bytes
            + sum(self.layer_bytes[:left])
            + output
            + left * self.kv_layer_bytes
            + self.estimate.compute_bytes
        )

    def most_that_fit(self, available_bytes: int) -> int:
        """The largest ``n_gpu_layers`` whose device bytes fit in ``available_bytes``."""
        best = 0
        for n in range(1, self.most + 1):
            if self.device_bytes(n) > available_bytes:
                break
            best = n
        return best

    def describe(self, n: int) -> str:
        """Where ``n_gpu_layers = n`` puts what, in MiB."""
        k = self._on_device(n)
        fixed = self.step_bytes + self.device_fixed_bytes if n > 0 else 0
        out = " and the output" if n > self.layers else ""
        host = "the embeddings" + ("" if n > self.layers else " and the output")
        return (
            f"{k} of {self.layers} layers{out} on the device "
            f"({(self.device_bytes(n) - fixed) / _MIB:.1f} MiB weights and KV cache + "
            f"{fixed / _MIB:.1f} MiB compute and runtime = {self.device_bytes(n) / _MIB:.1f} "
            f"MiB), {self.layers - k} layers and {host} "
            f"on the host ({self.host_bytes(n) / _MIB:.1f} MiB)"
        )


def split_layers(path: Path, config: GenerationConfig, device_fixed_bytes: int = 0) -> LayerSplit:
    """The layer-by-layer memory of the GGUF file at ``path`` with the worker's fixed
    cost on the device (GGUFError if its header cannot be read)."""
    estimate = estimate_gguf(path, config)
    sizes = tensor_sizes(path)
    layers = [0] * estimate.dims.layers
    other = output = 0
    for name, nbytes in sizes.items():
        block, _, rest = name.partition(".")
        index, _, _ = rest.partition(".")
        if block == "blk" and index.isdigit() and int(index) < len(layers):
            layers[int(index)] += nbytes
        elif name.startswith(("output.", "output_norm.")):
            output += nbytes
        else:
            other += nbytes
    return LayerSplit(estimate, other, tuple(layers), output, device_fixed_bytes)
