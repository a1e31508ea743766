"""WorkerHandle: one started worker process, forked or spawned, as the server tracks it.

The factory (``factory.py``) creates a handle per worker it starts and resolves its
``exited`` future when the fork server reports the exit (forked workers) or the pidfd
watcher sees it (spawned workers); ``ProcessInstance`` holds the handle to kill the
worker and wait for its end.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from typing import Any, Literal

__all__ = ["StartMethod", "WorkerHandle", "WorkerStartError"]

StartMethod = Literal["fork", "spawn"]


class WorkerStartError(OSError):
    """A worker process could not be started (fork server gone, fork failed)."""


class WorkerHandle:
    """One started worker process: its pid, a future of its exit code, and kill()."""

    def __init__(
        self,
        pid: int,
        exited: asyncio.Future[int | None],
        proc: subprocess.Popen[bytes] | None = None,
    ) -> None:
        self.pid = pid
        self.start_method: StartMethod = "fork" if proc is None else "spawn"
        self.exited = exited
        """Resolves to the return code (negative: killed by that signal); None if unknown."""
        self._proc = proc
        self._pidfd: int | None = None
        if proc is None:
            # The fork server reaps this pid, so it could in principle be reused before
            # we hear of the exit; a pidfd names this process and no other.
            try:
                self._pidfd = os.pidfd_open(pid)
            except (OSError, AttributeError):
                self._pidfd = None

    def kill(self) -> None:
        """SIGKILL the worker unless it has already exited (pidfd: no pid-reuse race)."""
        if self.exited.done():
            return
        try:
            if self._proc is not None:
                self._proc.kill()
            elif self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    async def wait_gone(self) -> None:
        """Return once the process has exited.

        A forked worker's pidfd turns readable at the exit itself, after the kernel has
        torn down its memory; ``exited`` resolves one hop later, when the fork server has
        reaped it and reported the code (about 10 ms on a busy 2-core machine). A stop
        that frees a budget waits for the former. Without a pidfd: ``exited``.
        """
        if self.exited.done():
            return
        if self._pidfd is None:
            await asyncio.shield(self.exited)
            return
        loop = asyncio.get_running_loop()
        gone: asyncio.Future[None] = loop.create_future()
        # A duplicate: the factory may watch the pidfd itself (orphans of a dead fork
        # server), and a selector holds one reader per descriptor.
        fd = os.dup(self._pidfd)

        def readable() -> None:
            if not gone.done():
                gone.set_result(None)

        try:
            loop.add_reader(fd, readable)
            try:
                either: list[asyncio.Future[Any]] = [gone, self.exited]
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            finally:
                loop.remove_reader(fd)
        finally:
            os.close(fd)
            gone.cancel()

    @property
    def pidfd(self) -> int | None:
        """A pidfd of a forked worker (readable once it has exited); None if unsupported."""
        return self._pidfd

    def close(self) -> None:
        """Release the pidfd (after the exit is known)."""
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
