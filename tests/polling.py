"""``wait_until``: the one way tests wait for a state, instead of sleeping a fixed time.

A fixed sleep that orders requests ("the blocker is running by now") is a guess: too
short on a loaded machine (a flaky test), too long everywhere else (a slow one). Polling
a predicate waits exactly as long as needed and says what never happened.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

Predicate = Callable[[], bool | Awaitable[bool]]


async def wait_until(
    predicate: Predicate, timeout_s: float = 10.0, *, interval_s: float = 0.01, what: str = ""
) -> None:
    """Return once ``predicate()`` (plain or async) is true; fail the test after ``timeout_s``.

    ``what`` names the awaited state in the failure message.
    """
    give_up = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() >= give_up:
            raise AssertionError(f"not reached within {timeout_s} s: {what or predicate!r}")
        await asyncio.sleep(interval_s)
