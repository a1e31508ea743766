"""The error taxonomy: one transport-free code per kind of failure.

Front ends own the tables that map an :class:`ErrorCode` to a wire status
(``frontends/http/errors.py`` and ``frontends/grpc/errors.py``); nothing else
knows about HTTP or gRPC.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import ClassVar


class ErrorCode(StrEnum):
    """Transport-free error codes, one per row of the error table."""

    MODEL_NOT_FOUND = "model_not_found"
    INVALID_INPUT = "invalid_input"
    MODEL_NOT_READY = "model_not_ready"
    STATE_CONFLICT = "state_conflict"
    OVERLOADED = "overloaded"
    MEMORY_BUDGET = "memory_budget"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    CANCELLED = "cancelled"
    WORKER_CRASHED = "worker_crashed"
    MODEL_LOAD_FAILED = "model_load_failed"
    CIRCUIT_OPEN = "circuit_open"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    NOT_SUPPORTED = "not_supported"
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"
    INTERNAL = "internal"


CLIENT_ERROR_CODES = frozenset(
    {
        ErrorCode.MODEL_NOT_FOUND,
        ErrorCode.INVALID_INPUT,
        ErrorCode.STATE_CONFLICT,
        ErrorCode.PAYLOAD_TOO_LARGE,
        ErrorCode.NOT_SUPPORTED,
        ErrorCode.UNAUTHENTICATED,
        ErrorCode.PERMISSION_DENIED,
        ErrorCode.CANCELLED,
    }
)
"""Codes of answers the caller's own request caused (a wrong name, shape or token, a body
too large, a client that went away): counted apart from the model's and server's failures."""

_HIDDEN_PREFIXES: list[str] = []
"""Folder prefixes removed from every error message, longest first."""


def hide_path_prefix(folder: str) -> None:
    """Show paths under ``folder`` relative to it in every later error message.

    The app registers the model repository (and the parents of models declared
    outside it), so a client reads ``corrupt/1/model.onnx``, never the server's layout,
    even in messages that runtimes or worker processes wrote.
    """
    prefix = folder.rstrip("/") + "/"
    if prefix != "/" and prefix not in _HIDDEN_PREFIXES:
        _HIDDEN_PREFIXES.append(prefix)
        _HIDDEN_PREFIXES.sort(key=len, reverse=True)


def hide_paths(text: str) -> str:
    """``text`` with the registered folder prefixes removed."""
    for prefix in _HIDDEN_PREFIXES:
        if prefix in text:
            text = text.replace(prefix, "")
    return text


class ServerError(Exception):
    """Base of every error the server reports to a client."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL
    retryable: ClassVar[bool] = False
    """True when the client should back off and retry: both front ends then send a
    ``retry-after`` (header or trailing metadata), ``retry_after_s`` or else one second.
    The one list of such errors; see :func:`retry_after_value`."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        message = hide_paths(message)
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class InternalError(ServerError):
    """Anything not foreseen; the message still says what happened."""

    code = ErrorCode.INTERNAL


class ModelNotFoundError(ServerError):
    """The model (or the version of it) named by the request does not exist."""

    code = ErrorCode.MODEL_NOT_FOUND


class InvalidInputError(ServerError):
    """The request is malformed: JSON, datatype, shape, missing or unknown tensor."""

    code = ErrorCode.INVALID_INPUT


class PayloadTooLargeError(ServerError):
    """The request body is over the configured size limit."""

    code = ErrorCode.PAYLOAD_TOO_LARGE


class ModelNotReadyError(ServerError):
    """The model exists but cannot serve now (loading, unloading, failed, restarting)."""

    code = ErrorCode.MODEL_NOT_READY


class WorkerGoneError(ModelNotReadyError):
    """The replica's worker had died (it restarts) when the request's batch came to run:
    the request never ran, so it may be routed once more, to the restarted worker or
    another replica, within its deadline."""


class ModelStateConflictError(ServerError):
    """A lifecycle verb conflicts with the model's current state."""

    code = ErrorCode.STATE_CONFLICT


class OverloadedError(ServerError):
    """A bounded queue is full; the request was refused at once."""

    code = ErrorCode.OVERLOADED
    retryable = True


class DeadlineUnreachableError(OverloadedError):
    """Refused at admission: the queue ahead cannot be worked off before the request's
    deadline (estimated from measured service times); waiting would only time out."""


class LoadShedError(OverloadedError):
    """Refused at admission to keep a more important priority class within its latency
    objective (or this one within its own): lower classes are shed first."""


class MemoryBudgetError(ServerError):
    """No room on the device even after every allowed eviction."""

    code = ErrorCode.MEMORY_BUDGET
    retryable = True


class DeadlineExceededError(ServerError):
    """The request's deadline passed while it was queued or running."""

    code = ErrorCode.DEADLINE_EXCEEDED


class RequestCancelledError(ServerError):
    """The client went away before its answer was ready."""

    code = ErrorCode.CANCELLED


class WorkerCrashedError(ServerError):
    """The worker process serving the request died; the request failed with it."""

    code = ErrorCode.WORKER_CRASHED


class WorkerLostError(WorkerCrashedError):
    """The worker was lost from under the request (Ray mode: its node or its actor died).
    The request never got an answer, so it may run once more after the model restarts."""


class ModelLoadError(ServerError):
    """Loading the model failed (bad file, runtime error, failed verification).

    It is the model's state, not a server fault: clients may retry after the backoff
    its ``retry_after_s`` names (sooner if the model's files are replaced).
    """

    code = ErrorCode.MODEL_LOAD_FAILED
    retryable = True


class CircuitOpenError(ServerError):
    """The model's circuit breaker is open; requests fail fast until it probes again."""

    code = ErrorCode.CIRCUIT_OPEN
    retryable = True


class NotSupportedError(ServerError):
    """The request asks for something this server or model does not do."""

    code = ErrorCode.NOT_SUPPORTED


class UnauthenticatedError(ServerError):
    """The route needs a token and the request carried none (or not a Bearer one)."""

    code = ErrorCode.UNAUTHENTICATED


class PermissionDeniedError(ServerError):
    """The request's token does not grant the plane the route belongs to."""

    code = ErrorCode.PERMISSION_DENIED


_BY_CODE: dict[ErrorCode, type[ServerError]] = {
    cls.code: cls
    for cls in (
        InternalError,
        ModelNotFoundError,
        InvalidInputError,
        PayloadTooLargeError,
        ModelNotReadyError,
        ModelStateConflictError,
        OverloadedError,
        MemoryBudgetError,
        DeadlineExceededError,
        RequestCancelledError,
        WorkerCrashedError,
        ModelLoadError,
        CircuitOpenError,
        NotSupportedError,
        UnauthenticatedError,
        PermissionDeniedError,
    )
}


def retry_after_value(exc: ServerError) -> str | None:
    """The ``retry-after`` value (whole seconds, at least 1) both front ends send, or None.

    An explicit ``retry_after_s`` always counts; otherwise only :attr:`ServerError.retryable`
    errors get one, of one second.
    """
    if exc.retry_after_s is not None:
        return str(max(1, math.ceil(exc.retry_after_s)))
    return "1" if exc.retryable else None


def error_from_code(code: str, message: str) -> ServerError:
    """Rebuild a typed error from its code (as sent by a worker); unknown codes are internal."""
    try:
        cls = _BY_CODE[ErrorCode(code)]
    except ValueError:
        cls = InternalError
    return cls(message)
