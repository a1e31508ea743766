"""llama.cpp's process-wide start (its log callback, its backend) and the GGUF file a
worker maps. (A LoRA adapter runs in its base's worker, over the base's mapping:
``LlamaCppRuntime.attach_adapter``.)"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from modelyard.runtimes.base import RuntimeSpec, find_model_file

MAPPED, REPACKED = "mapped", "repacked"
"""The two ways llama.cpp holds a model's weights (the ``weights`` option)."""

SPARE_CONTEXT_OPTION = "spare_context"
"""Runtime option: keep one context made ahead for the next LoRA adapter (set by the
server for a model that adapters name as their base)."""

_backend_ready = False
_log_callback: Any = None


def init_backend(llama: Any) -> None:
    """Route llama.cpp's log to stderr (errors only) and start its backend, once per process."""
    global _backend_ready, _log_callback
    if _backend_ready:
        return

    # llama.cpp logs every tensor at load; keep its errors only (on the worker's stderr).
    @llama.llama_log_callback  # type: ignore[untyped-decorator]
    def log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        if level == 3:  # GGML_LOG_LEVEL_ERROR
            import sys

            sys.stderr.write(text.decode("utf-8", errors="replace"))

    _log_callback = log  # a ctypes callback must outlive its registration
    llama.llama_log_set(log, ctypes.c_void_p(0))
    llama.llama_backend_init()
    _backend_ready = True


def mapped_gguf(spec: RuntimeSpec) -> Path:
    """The GGUF file a ``llama_cpp`` worker maps (its model's own)."""
    return find_model_file(Path(spec.version_dir), (".gguf",), spec.model_file)


def weights_option(spec: RuntimeSpec) -> str:
    """``mapped`` (the default) or ``repacked`` from the ``weights`` option."""
    value = spec.options.get("weights") or MAPPED
    if value not in (MAPPED, REPACKED):
        raise ValueError(f"option 'weights' must be {MAPPED!r} or {REPACKED!r}, not {value!r}")
    return value
