"""Why a benchmark could not run; the CLI prints the message and exits non-zero.

These are client-side failures (bad flags, unreachable target, missing tools). Errors the
*server* returns during a run are not exceptions: they are counted by code in the results.
"""

from __future__ import annotations


class BenchError(Exception):
    """Base of every error that stops a benchmark before or between phases."""


class BenchConfigError(BenchError):
    """A flag, file or combination of options the benchmark cannot use."""


class TargetError(BenchError):
    """The server could not be reached, or did not describe the models to send."""


class EngineUnavailableError(BenchError):
    """An optional engine or output (gRPC stubs, ``wrk``, matplotlib) is not installed."""
