"""Why a worker died, and the errors it sent, turned back into words and exceptions."""

from __future__ import annotations

import signal

from modelyard.errors import ServerError, error_from_code
from modelyard.workers.messages import ErrorInfo

_MIB = 1024 * 1024


def _signal_name(signum: int) -> str:
    try:
        sig = signal.Signals(signum)
    except ValueError:
        return f"signal {signum}"
    desc = signal.strsignal(sig)
    return f"signal {sig.name} ({desc})" if desc else f"signal {sig.name}"


def describe_exit(returncode: int | None, *, oom_killed: bool, limit_bytes: int | None) -> str:
    """Why a worker died, in words, from its return code and the limit's OOM counter."""
    if oom_killed:
        limit = f" (memory limit {limit_bytes // _MIB} MiB)" if limit_bytes else ""
        return f"killed by OOM{limit}"
    if returncode is None:
        return "exited; status unknown (the fork server has gone)"
    if returncode < 0:
        return f"killed by {_signal_name(-returncode)}"
    return f"exited with code {returncode}"


def rebuild_error(info: ErrorInfo) -> ServerError:
    """The typed error a worker sent as data; the worker's traceback becomes a note."""
    err = error_from_code(info.code, info.message)
    if info.traceback_text:
        err.add_note(f"worker traceback:\n{info.traceback_text}")
    return err
