"""A bounded log of lifecycle events (loads, evictions, crashes) for the dashboard."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
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
    duration_s: float | None = None
    """How long the thing took (loads), when it has a duration."""

    def to_dict(self) -> dict[str, object]:
        """JSON form."""
        return {
            "time": self.time_unix,
            "kind": self.kind,
            "model": self.model,
            "version": self.version,
            "message": self.message,
            "duration_s": self.duration_s,
        }


class EventLog:
    """The most recent ``maxlen`` events, newest last."""

    def __init__(self, maxlen: int = 200) -> None:
        self._events: deque[Event] = deque(maxlen=maxlen)
        self.listeners: list[Callable[[Event], None]] = []
        """Called with every new event (metrics count them); must not raise or block."""

    def add(self, kind: str, key: ModelKey, message: str, duration_s: float | None = None) -> None:
        """Record an event (wall-clock time: it is shown to people, not used for deadlines)."""
        event = Event(time.time(), kind, key.name, key.version, message, duration_s)
        self._events.append(event)
        for listener in self.listeners:
            listener(event)

    def recent(self, limit: int = 50) -> list[Event]:
        """The newest ``limit`` events, newest first."""
        return list(reversed(self._events))[:limit]
