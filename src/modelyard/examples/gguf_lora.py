"""Tiny random LoRA adapters in GGUF, for the llama models of :mod:`gguf_llama` (no hub).

The file is what llama.cpp's ``convert_lora_to_gguf.py`` writes: ``general.type`` is
``adapter``, ``adapter.type`` is ``lora`` with its ``adapter.lora.alpha``, and each
adapted weight ``W`` (``blk.N.attn_q.weight``…) has two tensors ``….lora_a`` (rank x
in) and ``….lora_b`` (out x rank); llama.cpp adds ``scale x alpha / rank x B A x`` to
``W x``. Random but deterministic (same arguments, byte-identical file), F32 or F16.

Needs the ``gguf`` package (the ``llm`` extra).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from modelyard.examples.gguf_llama import LlamaShape

TARGETS = ("attn_q", "attn_v", "ffn_up", "ffn_down")
"""The weights adapted by default: attention and feed-forward, as common fine-tunes do."""


def _dims(shape: LlamaShape, target: str) -> tuple[int, int]:
    """``(in, out)`` features of one block's weight ``target``."""
    kv_width = shape.kv_heads * shape.head_dim
    return {
        "attn_q": (shape.width, shape.width),
        "attn_k": (shape.width, kv_width),
        "attn_v": (shape.width, kv_width),
        "attn_output": (shape.width, shape.width),
        "ffn_gate": (shape.width, shape.feed_forward),
        "ffn_up": (shape.width, shape.feed_forward),
        "ffn_down": (shape.feed_forward, shape.width),
    }[target]


def write_lora_gguf(
    path: Path,
    shape: LlamaShape,
    *,
    rank: int = 8,
    alpha: float = 16.0,
    seed: int = 0,
    targets: tuple[str, ...] = TARGETS,
    dtype: str = "f32",
) -> Path:
    """Write a random LoRA adapter for a llama model of ``shape`` to ``path`` (atomically),
    its tensors in ``dtype``: ``f32``, or ``f16`` (half the bytes, as
    ``convert_lora_to_gguf.py --outtype f16`` writes them)."""
    if dtype not in ("f32", "f16"):
        raise ValueError(f"dtype must be 'f32' or 'f16', not {dtype!r}")
    kind = np.float16 if dtype == "f16" else np.float32
    import gguf

    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    writer.add_name(f"modelyard-example-lora-{path.stem}")
    for i in range(shape.layers):
        for target in targets:
            n_in, n_out = _dims(shape, target)
            # B A x is of the size of W x (the base's weights are scaled by 1/sqrt(in)):
            # an adapter that visibly changes the greedy text, not one that breaks it.
            # F32 explicitly: a float32 array over a NumPy float64 scalar is float64, which
            # the writer would store as F64 (llama.cpp crashes on an F64 adapter).
            a = rng.standard_normal((rank, n_in), dtype=np.float32) / np.float32(np.sqrt(n_in))
            b = rng.standard_normal((n_out, rank), dtype=np.float32) / np.float32(np.sqrt(rank))
            writer.add_tensor(f"blk.{i}.{target}.weight.lora_a", a.astype(kind))
            writer.add_tensor(f"blk.{i}.{target}.weight.lora_b", b.astype(kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path
