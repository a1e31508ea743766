"""llama.cpp's process-wide start: its log callback (errors only) and its backend, once."""

from __future__ import annotations

import ctypes
from typing import Any

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
