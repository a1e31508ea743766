"""The listening ports, checked before the slow part of the start.

Starting the fork server, the spare workers and the preloaded models takes seconds (tens
on a busy machine); a port already taken would otherwise be reported only after all of
that. A bind and close of each port first turns that into an error within a second. The
check can race with another program taking the port in between: the real bind still
reports that, only later.
"""

from __future__ import annotations

import socket


def unbindable_ports(host: str, ports: dict[str, int | None]) -> list[str]:
    """One line per named port of ``ports`` that cannot be bound on ``host`` now (port 0
    and ``None`` are skipped: the system picks a free one, or the port is off)."""
    problems = []
    for name, port in ports.items():
        if not port:
            continue
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except OSError as exc:
            problems.append(f"cannot serve {name} on {host}:{port}: {exc}")
            continue
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            # As the servers bind: SO_REUSEADDR, so a port in TIME_WAIT is not refused.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                problems.append(
                    f"cannot serve {name} on {host}:{port}: {exc.strerror or exc} "
                    "(another server on that port? choose another with "
                    f"--{name.lower()}-port)"
                )
    return problems
