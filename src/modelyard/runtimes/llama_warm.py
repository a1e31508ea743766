"""Start llama.cpp ahead in a spare worker: a throwaway model, loaded and freed.

A worker's first GGUF load pays costs that a later load in the same process does not,
even in a worker forked from a fork server that has imported llama-cpp-python and
started its backend: llama.cpp's first vocabulary read, jinja2's first compile of a chat
template, and every code path run for the first time (llama.cpp's loader, context, graph
allocator and CPU kernels; Python's runtime code) faulting its pages in, and, for Python,
copying the inherited pages its first calls write to. On a 60 MB model (2-core VM,
medians of 16 forked workers per variant, three runs, ``bench/bench_llm_first_load.py``,
BENCHMARKS.md §18) a throwaway load ahead cuts the load's CPU from 41-47 to 33-36 ms and
its page faults from 3,600-3,700 to 1,800; the template's compile from 7-13 to 4-5 ms.
A spare does that while it idles, on a model written here: one layer, width 32, a
byte-level vocabulary, zero weights (57 kB, in a temporary file).

The GGUF file is written in plain Python (the format's header, key/values, tensor
infos and aligned data), so the spare imports neither ``gguf`` nor anything else new.
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Iterable
from pathlib import Path

from modelyard.runtimes.base import RuntimeSpec

_ALIGN = 32
_U32, _I32, _F32, _BOOL, _STR, _ARR = 4, 5, 6, 7, 8, 9
_SCALAR = {_U32: "<I", _I32: "<i", _F32: "<f", _BOOL: "<?"}
_F32_TENSOR, _F16_TENSOR = 0, 1
_NORMAL, _CONTROL = 1, 3
_WIDTH, _FFN, _HEADS, _KV_HEADS, _CONTEXT = 32, 64, 2, 1, 512
_SPECIALS = ("<s>", "</s>", "<|im_start|>", "<|im_end|>")
_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML, the most common template shape: the process's first compile of a real template."""


def _byte_tokens() -> list[str]:
    # GPT-2's reversible map from bytes to printable characters (byte-level BPE).
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _kv(key: str, kind: int, value: str | float | bool) -> bytes:
    head = _string(key) + struct.pack("<I", kind)
    if isinstance(value, str):
        return head + _string(value)
    return head + struct.pack(_SCALAR[kind], value)


def _strings(key: str, items: list[str]) -> bytes:
    body = b"".join(_string(i) for i in items)
    return _string(key) + struct.pack("<IIQ", _ARR, _STR, len(items)) + body


def _ints(key: str, items: list[int]) -> bytes:
    body = struct.pack(f"<{len(items)}i", *items)
    return _string(key) + struct.pack("<IIQ", _ARR, _I32, len(items)) + body


def _tensors() -> Iterable[tuple[str, tuple[int, ...], int]]:
    """``(name, ggml dims, type)`` of a one-layer llama (dims innermost first)."""
    kv_width = _KV_HEADS * _WIDTH // _HEADS
    vocab = 256 + len(_SPECIALS)
    yield "token_embd.weight", (_WIDTH, vocab), _F16_TENSOR
    yield "blk.0.attn_norm.weight", (_WIDTH,), _F32_TENSOR
    yield "blk.0.attn_q.weight", (_WIDTH, _WIDTH), _F16_TENSOR
    yield "blk.0.attn_k.weight", (_WIDTH, kv_width), _F16_TENSOR
    yield "blk.0.attn_v.weight", (_WIDTH, kv_width), _F16_TENSOR
    yield "blk.0.attn_output.weight", (_WIDTH, _WIDTH), _F16_TENSOR
    yield "blk.0.ffn_norm.weight", (_WIDTH,), _F32_TENSOR
    yield "blk.0.ffn_gate.weight", (_WIDTH, _FFN), _F16_TENSOR
    yield "blk.0.ffn_up.weight", (_WIDTH, _FFN), _F16_TENSOR
    yield "blk.0.ffn_down.weight", (_FFN, _WIDTH), _F16_TENSOR
    yield "output_norm.weight", (_WIDTH,), _F32_TENSOR
    yield "output.weight", (_WIDTH, vocab), _F16_TENSOR


def warm_model_bytes() -> bytes:
    """A complete GGUF file: a one-layer llama with zero weights and a byte vocabulary."""
    tokens = _byte_tokens() + list(_SPECIALS)
    first_special = 256
    meta = [
        _kv("general.architecture", _STR, "llama"),
        _kv("general.name", _STR, "modelyard-warm"),
        _kv("llama.context_length", _U32, _CONTEXT),
        _kv("llama.embedding_length", _U32, _WIDTH),
        _kv("llama.block_count", _U32, 1),
        _kv("llama.feed_forward_length", _U32, _FFN),
        _kv("llama.attention.head_count", _U32, _HEADS),
        _kv("llama.attention.head_count_kv", _U32, _KV_HEADS),
        _kv("llama.attention.layer_norm_rms_epsilon", _F32, 1e-5),
        _kv("llama.rope.dimension_count", _U32, _WIDTH // _HEADS),
        _kv("tokenizer.ggml.model", _STR, "gpt2"),
        _kv("tokenizer.ggml.pre", _STR, "gpt-2"),
        _strings("tokenizer.ggml.tokens", tokens),
        _ints("tokenizer.ggml.token_type", [_NORMAL] * 256 + [_CONTROL] * len(_SPECIALS)),
        # One merge ("w a"): llama.cpp refuses a BPE vocabulary without any.
        _strings("tokenizer.ggml.merges", [f"{tokens[119]} {tokens[97]}"]),
        _kv("tokenizer.ggml.bos_token_id", _U32, first_special),
        _kv("tokenizer.ggml.eos_token_id", _U32, first_special + 1),
        _kv("tokenizer.ggml.add_bos_token", _BOOL, True),
        _kv("tokenizer.chat_template", _STR, _TEMPLATE),
    ]
    infos: list[bytes] = []
    offset = 0
    for name, dims, kind in _tensors():
        infos.append(
            _string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, kind, offset)
        )
        count = 1
        for d in dims:
            count *= d
        size = count * (4 if kind == _F32_TENSOR else 2)
        offset += -(-size // _ALIGN) * _ALIGN
    header = struct.pack("<4sIQQ", b"GGUF", 3, len(infos), len(meta))
    head = header + b"".join(meta) + b"".join(infos)
    head += bytes(-len(head) % _ALIGN)
    # Zero weights everywhere, norms included: the output is meaningless, the code
    # paths are the real ones.
    return head + bytes(offset)


_GPU_BACKENDS = ("cuda", "hip", "musa", "vulkan", "metal", "sycl", "opencl", "cann")


def gpu_backends_in(folder: Path) -> list[str]:
    """The GPU backends whose ggml libraries are in ``folder`` (llama-cpp-python's
    ``lib``), found by name: asking llama.cpp itself would start them."""
    names = [p.name for p in folder.glob("*ggml-*")] if folder.is_dir() else []
    return [b for b in _GPU_BACKENDS if any(f"ggml-{b}" in n for n in names)]


def prewarm() -> bool:
    """Load the throwaway model (which compiles its chat template and decodes one token)
    and free it again; False, warming nothing, where llama.cpp has a GPU backend or its
    libraries are not where they can be inspected.

    A GPU build's load starts the GPU API (CUDA's driver, a context per device) in a
    spare that belongs to no device yet: a later ``cuda:N`` load could no longer
    restrict the process to its GPU (``CUDA_VISIBLE_DEVICES`` is read once, at start),
    and an idle spare would hold a context on every GPU. Run in a spare worker, never in
    the fork server (one decode thread starts no OpenMP pool, but a generation would
    start a thread). A request on the model was tried too and dropped: it took nothing
    measurable off the first request. Raises if the load fails; the caller only reports
    it, and the model's own load then pays the first-load costs itself.
    """
    import llama_cpp

    from modelyard.runtimes.llama_cpp import LlamaCppRuntime

    lib = Path(llama_cpp.__file__).parent / "lib"
    if not lib.is_dir() or gpu_backends_in(lib):
        return False
    runtime = LlamaCppRuntime()
    with tempfile.TemporaryDirectory(prefix="modelyard-warm-") as folder:
        (Path(folder) / "warm.gguf").write_bytes(warm_model_bytes())
        try:
            # llama.cpp's smallest context (256), one thread: no OpenMP pool.
            options = {"n_ctx": "256", "n_threads": "1"}
            runtime.load(RuntimeSpec("llama_cpp", folder, "warm", options=options))
            runtime.warm_up()
            runtime.chat_template()
        finally:
            runtime.close()
    return True
