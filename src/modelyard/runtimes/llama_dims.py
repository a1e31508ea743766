"""The dimensions of a model llama.cpp has loaded, from the metadata it has read.

A switch's load needs two figures from the GGUF header before it creates the context:
the trained context length (the default ``n_ctx``) and the KV cache's size per token.
llama.cpp has parsed the header already; asking it for a few keys takes microseconds,
where a second parse in Python takes a millisecond or more on the switch's path.
"""

from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path
from typing import Any

from modelyard.repository.gguf import GGUFError, GGUFValue, LlamaDims, llama_dims, read_metadata


def model_dims(llama: Any, model: Any, path: Path) -> LlamaDims:
    """The model's dimensions from the metadata llama.cpp has already read (microseconds),
    else from the file's header (a millisecond or more of Python parsing)."""
    arch = _meta(llama, model, "general.architecture")
    if arch:
        meta: dict[str, GGUFValue] = {"general.architecture": arch}
        for key in _DIM_KEYS:
            value = _meta(llama, model, f"{arch}.{key}")
            if value is not None:
                try:
                    meta[f"{arch}.{key}"] = int(value)
                except ValueError:  # an array (per-layer counts): the header says
                    break
        else:
            with contextlib.suppress(GGUFError):
                return llama_dims(meta)
    return llama_dims(read_metadata(path))


_DIM_KEYS = (
    "context_length",
    "block_count",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "feed_forward_length",
)
_META_BYTES = 256


def _meta(llama: Any, model: Any, key: str) -> str | None:
    buf = ctypes.create_string_buffer(_META_BYTES)
    n = llama.llama_model_meta_val_str(model, key.encode(), buf, _META_BYTES)
    if n < 0 or n >= _META_BYTES:
        return None
    return buf.value.decode("utf-8", errors="replace")
