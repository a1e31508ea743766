"""The opt-in request log: one JSON line per request and per finished load.

``{"t": s, "model": name, "version": v}`` for a request and ``{"t": s, "model": name,
"version": v, "event": "load", "bytes": n, "load_s": s}`` for a load (``load_s`` without
the load's wait for room in the budget or for a load slot), ``t`` in seconds
on the manager's clock from the log's opening, which writes ``{"t": 0, "event": "start",
"load_slots": n}`` (the server's ``load_slots``, so that a replay queues loads alike).
``modelyard plan --trace`` replays it (:func:`modelyard.simulation.traces.read_request_log`).
Bounded: it stops growing at ``max_mb`` with one warning; a line is written with one
buffered ``write`` (flushed every second and on close) so the request path pays no
system call per request.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import IO

from modelyard.clock import Clock
from modelyard.manager.records import ModelRecord

log = logging.getLogger("modelyard.manager")

_FLUSH_EVERY_S = 1.0


class RequestLog:
    """Appends request and load lines to a file until it reaches its size bound."""

    def __init__(
        self, path: Path, max_bytes: int, clock: Clock, *, load_slots: int | None = None
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._clock = clock
        self._origin = clock.monotonic()
        self._file: IO[str] | None = path.open("a", encoding="utf-8")
        self._written = path.stat().st_size
        self._flushed_at = self._origin
        if load_slots is not None:
            self._write({"event": "start", "load_slots": load_slots})

    def request(self, record: ModelRecord, now: float | None = None) -> None:
        """Log a request for ``record`` (at ``now``, on the clock; default: now)."""
        self._write({"model": record.key.name, "version": record.key.version}, now)

    def loaded(self, record: ModelRecord) -> None:
        """Log a finished load of ``record``: its reservation and how long it took.

        The time is the load's own (process start, runtime load, warm-up), without its
        wait for a place in the budget or a load slot: a replay models those waits
        itself, from the requests around it, and would count them twice.
        """
        t = record.timings
        self._write(
            {
                "model": record.key.name,
                "version": record.key.version,
                "event": "load",
                "bytes": record.reserved_bytes,
                "load_s": round(max(0.0, t.total_s - t.queue_wait_s), 6),
            }
        )

    def _write(self, row: dict[str, object], at: float | None = None) -> None:
        if self._file is None:
            return
        now = self._clock.monotonic()
        if at is None:
            at = now
        line = json.dumps({"t": round(at - self._origin, 6), **row}) + "\n"
        if self._written + len(line) > self.max_bytes:
            log.warning("request log %s is full at %d bytes", self.path, self.max_bytes)
            self.close()
            return
        self._file.write(line)
        self._written += len(line)
        if now - self._flushed_at >= _FLUSH_EVERY_S:
            self._file.flush()
            self._flushed_at = now

    def flush(self) -> None:
        """Write buffered lines out."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Flush and close (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None
