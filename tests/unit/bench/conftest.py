"""Fixtures: the KServe v2 double of ``_kserve.py``, on this loop or in a thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from ._kserve import RunningServer, ServerState, start_server


@pytest.fixture
async def kserve() -> AsyncIterator[RunningServer]:
    """The double, on the test's own event loop."""
    state = ServerState()
    runner, url = await start_server(state)
    try:
        yield RunningServer(url, state)
    finally:
        await runner.cleanup()


@pytest.fixture
def threaded_kserve() -> Iterator[RunningServer]:
    """The double on a loop in another thread, for code that runs its own loop (the CLI)."""
    state = ServerState()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        started = asyncio.run_coroutine_threadsafe(start_server(state), loop)
        runner, url = started.result(timeout=5)
        try:
            yield RunningServer(url, state)
        finally:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=5)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()
