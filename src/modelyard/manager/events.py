"""A bounded log of lifecycle events (loads, evictions, crashes) for the dashboard."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from modelyard.manager.records import ModelKey


@dataclass(frozen=True, slots=True)
class Event:
    """One lifecycle event."""

    time_unix: float
    kind: str
    model: str
    version: str
    message: str

    def to_dict(self) -> dict[str, object]:
        """JSON form."""
        return {
            "time": self.time_unix,
            "kind": self.kind,
            "model": self.model,
            "version": self.version,
            "message": self.message,
        }


class EventLog:
    """The most recent ``maxlen`` events, newest last."""

    def __init__(self, maxlen: int = 200) -> None:
        self._events: deque[Event] = deque(maxlen=maxlen)
        self.listeners: list[object] = []

    def add(self, kind: str, key: ModelKey, message: str) -> None:
        """Record an event (wall-clock time: it is shown to people, not used for deadlines)."""
        self._events.append(Event(time.time(), kind, key.name, key.version, message))

    def recent(self, limit: int = 50) -> list[Event]:
        """The newest ``limit`` events, newest first."""
        return list(reversed(self._events))[:limit]
