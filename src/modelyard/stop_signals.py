"""The server's stop on SIGINT/SIGTERM: one owner of the signals, and a bounded stop.

uvicorn installs its own handlers while it serves and re-raises a captured signal only
once its own shutdown has ended, which by default waits, without bound, for every open
connection: a request that never ended (a stuck call, a slow stream) kept the whole
server, gRPC listener included, from stopping at SIGTERM. Here the App owns the signals
(:func:`watch_stop_signals`) and uvicorn runs without handlers (:class:`SignallessServer`).

The first signal starts the App's stop and a watchdog *thread* that exits the process
once ``drain_timeout_s`` has passed; a second signal exits at once. A thread, not a loop
timer: it holds even when what overruns is the loop itself (a blocking call) or
``asyncio.run``'s own cleanup, which joins the default executor's threads (an inline
model's call that never returns never joins). Worker processes die with the server
(``die_with_parent``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator

import uvicorn

__all__ = ["SignallessServer", "watch_stop_signals"]

log = logging.getLogger("modelyard")


class SignallessServer(uvicorn.Server):
    """uvicorn's server without its own signal handlers (see the module docstring)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Install nothing: the App owns SIGINT and SIGTERM."""
        yield


def exit_now(why: str, code: int) -> None:
    """End the process at once, saying why."""
    log.error("%s; exiting now", why)
    logging.shutdown()
    os._exit(code)


def watch_stop_signals(
    loop: asyncio.AbstractEventLoop, stop: asyncio.Event, drain_timeout_s: float
) -> None:
    """On SIGINT or SIGTERM set ``stop`` and start the watchdog that exits the process
    ``drain_timeout_s`` later; on a second one, exit at once (code 1 either way)."""

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():
            exit_now(f"second {sig.name} while stopping", 1)
        log.info("%s: stopping (at most %.1f s)", sig.name, drain_timeout_s)
        why = f"the stop took more than drain_timeout_s={drain_timeout_s}"
        watchdog = threading.Timer(drain_timeout_s, exit_now, (why, 1))
        watchdog.daemon = True
        watchdog.start()
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
