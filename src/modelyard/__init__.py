"""modelyard: a multi-model inference server (KServe v2 REST and gRPC).

The public API is what this module re-exports.
"""

__version__ = "0.1.0"

from modelyard.config import ModelConfig, ServerSettings, load_settings
from modelyard.errors import ErrorCode, ServerError
from modelyard.runtimes.base import TensorSpec

__all__ = [
    "ErrorCode",
    "ModelConfig",
    "ServerError",
    "ServerSettings",
    "TensorSpec",
    "__version__",
    "load_settings",
]
