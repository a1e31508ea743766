"""The manager's background tasks: loads, evictions and restarts it owns and cancels."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("modelyard.manager")


class TaskOwner:
    """Keeps every background task it spawned until it ends; :meth:`close` cancels them."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self.closing = False
        """Set once :meth:`close` started: no load, restart or eviction begins after it."""

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as an owned task."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        # Read the outcome so that nothing is reported as "never retrieved": a load's
        # waiters may all have given up, and its failure is in the record already.
        if not task.cancelled() and task.exception() is not None:
            log.debug("background task %s ended with %r", task.get_name(), task.exception())

    async def close(self) -> None:
        """Mark closing, cancel every owned task and wait until they have ended."""
        self.closing = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def __len__(self) -> int:
        return len(self._tasks)
