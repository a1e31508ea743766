"""Turning a runtime's own exception into the server's taxonomy."""

from __future__ import annotations

from modelyard.errors import InternalError, InvalidInputError, ServerError

# ONNX Runtime reports bad feeds (rank, dims, types) as these exception class names;
# matching by name keeps onnxruntime out of this module's imports.
_INPUT_ERROR_NAMES = frozenset({"InvalidArgument", "Fail", "InvalidGraph"})


def classify_runtime_error(exc: BaseException) -> ServerError:
    """InvalidInputError for input problems the runtime found, InternalError otherwise."""
    if isinstance(exc, ServerError):
        return exc
    name = type(exc).__name__
    message = f"{name}: {exc}"
    if name in _INPUT_ERROR_NAMES or isinstance(exc, (ValueError, TypeError)):
        return InvalidInputError(f"the model rejected the input: {message}")
    return InternalError(f"inference failed: {message}")
