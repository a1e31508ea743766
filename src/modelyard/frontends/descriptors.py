"""One descriptor budget for the server's ports, from the process's file limit.

Every accepted connection holds a file descriptor; when they run out, accepting fails
for every client of every port, and so does opening a model file or a worker's socket.
So each port gets its own share of the descriptors left after what the server needs
besides connections, and a flood on one port can use up only its own share.
"""

from __future__ import annotations

import contextlib
import logging
import resource

log = logging.getLogger("modelyard")

SPARE_DESCRIPTORS = 256
"""Descriptors the server needs besides client connections: listening sockets, the
workers' socket pairs and shared-memory regions, model and log files."""
PORTS = 2
"""Ports sharing the budget: REST and gRPC (REST alone still leaves gRPC's share)."""
_TARGET_LIMIT = 65536
"""The soft limit asked for at start-up when the hard limit allows (most distributions
start processes at 1,024 soft with a hard limit far above)."""
_MIN_PER_PORT = 32


def raise_file_limit(wanted: int = _TARGET_LIMIT) -> int:
    """Raise the soft file limit toward ``wanted`` (bounded by the hard limit); return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return wanted if soft == resource.RLIM_INFINITY else soft
    raised = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
    if raised > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            log.info("raised the soft file limit from %d to %d", soft, raised)
            return raised
    return soft


def port_share() -> int:
    """Descriptors one port's connections may hold: an even share of the soft file limit
    (raised first, when the hard limit allows) less the server's own needs."""
    limit = raise_file_limit()
    return max(_MIN_PER_PORT, (limit - SPARE_DESCRIPTORS) // PORTS)
