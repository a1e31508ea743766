"""Big request bodies decoded off the event loop, each client within its share.

One event loop serves every REST client: a body that takes a second to parse (an 8 MB
JSON request with 10^5 inputs) or to inflate (a gzip bomb) would stall every other
request for that second. Work on a body of :data:`OFFLOAD_FROM_BYTES` or more (and every
inflation, whose output size is unknown until done) runs on a small thread pool instead.
Threads share the interpreter lock, but CPython hands it back to the loop every few
milliseconds (and zlib releases it while it inflates), so the loop keeps answering.

The pool has :data:`SLOTS` threads; one client (by address) holds at most
:data:`SLOTS_PER_CLIENT` of them, so one client's stream of big bodies waits behind
itself, not in front of everyone else's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

OFFLOAD_FROM_BYTES = 64 * 1024
"""Bodies this large or larger are decoded on the pool (smaller ones take well under a
millisecond on the loop, less than the hop to a thread would cost them)."""
SLOTS = max(2, min(4, os.cpu_count() or 2))
"""Threads decoding at once, every client together."""
SLOTS_PER_CLIENT = max(1, SLOTS // 2)
"""Threads one client address may hold at once."""

_POOL = ThreadPoolExecutor(max_workers=SLOTS, thread_name_prefix="modelyard-decode")


class DecodeGate:
    """The pool's slots, shared fairly between clients, on one event loop."""

    def __init__(self) -> None:
        self._slots = asyncio.Semaphore(SLOTS)
        self._clients: dict[str | None, tuple[asyncio.Semaphore, int]] = {}
        """Each client's semaphore, and how many of its requests hold or wait for it."""

    async def run(self, client: str | None, work: Callable[..., T], *args: object) -> T:
        """``work(*args)`` on the pool, once ``client`` has a slot within its share.

        The slots are given back when the work ends, not when the caller stops waiting
        (a client that disconnects cannot leave work running beyond its share)."""
        share, users = self._clients.get(client) or (asyncio.Semaphore(SLOTS_PER_CLIENT), 0)
        self._clients[client] = (share, users + 1)
        try:
            await share.acquire()
        except BaseException:
            self._forget(client)
            raise
        try:
            await self._slots.acquire()
        except BaseException:
            share.release()
            self._forget(client)
            raise
        loop = asyncio.get_running_loop()

        def done(_: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._release, client, share)

        job = _POOL.submit(work, *args)
        job.add_done_callback(done)
        return await asyncio.wrap_future(job)

    def _release(self, client: str | None, share: asyncio.Semaphore) -> None:
        self._slots.release()
        share.release()
        self._forget(client)

    def _forget(self, client: str | None) -> None:
        share, users = self._clients[client]
        if users == 1:
            del self._clients[client]
        else:
            self._clients[client] = (share, users - 1)


_GATES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, DecodeGate] = (
    weakref.WeakKeyDictionary()
)


def gate() -> DecodeGate:
    """The running loop's gate (asyncio semaphores belong to one loop)."""
    loop = asyncio.get_running_loop()
    found = _GATES.get(loop)
    if found is None:
        found = _GATES[loop] = DecodeGate()
    return found


async def decode_off_loop(
    client: str | None, size: int, work: Callable[..., T], *args: object
) -> T:
    """``work(*args)``: on the loop for a body under :data:`OFFLOAD_FROM_BYTES`, else on
    the pool within ``client``'s share."""
    if size < OFFLOAD_FROM_BYTES:
        return work(*args)
    return await gate().run(client, work, *args)
