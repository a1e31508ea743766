"""modelyard: a multi-model inference server (KServe v2 REST and gRPC).

The public API is what this module re-exports. The names are imported on first use
(PEP 562), so that ``import modelyard`` (and with it the ``modelyard`` command's
``--help``) does not pay for numpy, pydantic and the runtimes up front.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from modelyard.config import ModelConfig, ServerSettings, load_settings
    from modelyard.errors import ErrorCode, ServerError
    from modelyard.runtimes.base import TensorSpec

_EXPORTS = {
    "ErrorCode": "modelyard.errors",
    "ModelConfig": "modelyard.config",
    "ServerError": "modelyard.errors",
    "ServerSettings": "modelyard.config",
    "TensorSpec": "modelyard.runtimes.base",
    "load_settings": "modelyard.config",
}

__all__ = [
    "ErrorCode",
    "ModelConfig",
    "ServerError",
    "ServerSettings",
    "TensorSpec",
    "__version__",
    "load_settings",
]


def __getattr__(name: str) -> Any:
    """Import a re-exported name from its module on first access."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'modelyard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
