"""WorkerFactory: starts worker processes, warm (forked) or cold (spawned).

The server creates one factory at start-up and closes it at shutdown::

    factory = WorkerFactory()             # or WorkerFactory(WorkerFactoryConfig(...))
    await factory.start()                 # fork server up, memory-limit backend chosen
    instance = ProcessInstance(factory)
    ...
    await factory.close()                 # fork server and any worker left are killed

With ``start_method="fork"`` (the default) workers are forked by the fork server
(``forkserver.py``), which reaps them and reports their exit status over its control
socket. With ``"spawn"`` each worker is a fresh ``python -m modelyard.workers.main``
whose exit the server watches through a pidfd (a fallback; ``bench/bench_isolation.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from modelyard.runtimes import WARMABLE_KINDS
from modelyard.workers.answers import AnswerGate
from modelyard.workers.channel import SharedRegion, socket_pair
from modelyard.workers.forkserver import DEFAULT_PRELOAD, preload_for
from modelyard.workers.handle import StartMethod, WorkerHandle, WorkerStartError
from modelyard.workers.limits import BackendChoice, MemoryLimiter, detect_limiter
from modelyard.workers.messages import (
    ForkServerReady,
    Message,
    MessageError,
    SpawnFailed,
    SpawnWorker,
    WorkerExited,
    WorkerSpawned,
    decode,
    encode,
)
from modelyard.workers.spares import Spare, SparePool

_log = logging.getLogger(__name__)

_THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True, slots=True)
class WorkerFactoryConfig:
    """How workers are started and limited.

    Not part of ``modelyard.yaml``: the server runs on the defaults. The knobs stay because
    tests and bench scripts set them (``start_method``, ``preload``, ``watchdog_interval_s``,
    ``stop_grace_s``), or because they are the escape hatch an operator needs first when a
    host misbehaves (``memory_limit_backend`` when cgroup detection picks a backend that
    fails, ``ready_timeout_s`` on a slow disk). Workers always run this interpreter
    (``sys.executable``): the fork server must import this very modelyard.
    """

    start_method: StartMethod = "fork"
    """``fork``: from the warm fork server; ``spawn``: a fresh interpreter per worker."""
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    """Modules the fork server imports before forking."""
    memory_limit_backend: BackendChoice = "auto"
    """``auto`` picks cgroup2, then cgroup1, then rlimit + watchdog."""
    watchdog_interval_s: float = 0.5
    """How often the RSS watchdog samples a worker (rlimit backend only)."""
    stop_grace_s: float = 2.0
    """How long ``stop()`` waits for a worker to exit before SIGKILL."""
    ready_timeout_s: float = 60.0
    """How long the fork server may take to import and report ready."""
    spare_workers: int = 0
    """Idle workers kept started ahead (``spares.py``; the server's ``spare_workers``); 0: none."""
    warm: tuple[str, ...] = ()
    """Runtime kinds a spare starts ahead while it idles (those the repository uses)."""


class WorkerFactory:
    """Starts workers; owns the fork server and the memory-limit backend."""

    def __init__(
        self, config: WorkerFactoryConfig | None = None, *, limiter: MemoryLimiter | None = None
    ) -> None:
        self.config = config or WorkerFactoryConfig()
        self._limiter = limiter
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: subprocess.Popen[bytes] | None = None
        self._ctl: socket.socket | None = None
        self._ready: asyncio.Future[ForkServerReady] | None = None
        self._spawns: dict[int, asyncio.Future[WorkerHandle]] = {}
        self._exits: dict[int, asyncio.Future[int | None]] = {}
        self._handles: dict[int, WorkerHandle] = {}
        self._tokens = itertools.count(1)
        self._restart_lock = asyncio.Lock()
        self._closed = False
        self._spares: SparePool | None = None
        self.answers = AnswerGate()
        """Calls to this factory's workers waiting for their first answer (``answers.py``)."""
        self.fork_server_info: ForkServerReady | None = None
        """What the fork server reported when ready (pid, threads, import time)."""

    @classmethod
    def for_runtimes(cls, kinds: Iterable[str], spare_workers: int = 0) -> WorkerFactory:
        """A factory on the defaults whose fork server also preloads what the runtime ``kinds``
        need (``RUNTIME_PRELOAD``) and that keeps ``spare_workers`` idle workers ready."""
        kinds = set(kinds)
        # onnx is the runtime of a model nothing declares (a discovered folder).
        warm = tuple(sorted((kinds or {"onnx"}) & WARMABLE_KINDS))
        return cls(
            WorkerFactoryConfig(preload=preload_for(kinds), spare_workers=spare_workers, warm=warm)
        )

    # -------------------------------------------------------------------- lifecycle

    @property
    def limiter(self) -> MemoryLimiter:
        """The memory-limit backend; set by :meth:`start`."""
        if self._limiter is None:
            raise RuntimeError("WorkerFactory.start() has not run")
        return self._limiter

    @property
    def memory_limit_backend(self) -> str:
        """Name of the active memory-limit backend: cgroup2, cgroup1 or rlimit."""
        return self.limiter.name

    @property
    def is_running(self) -> bool:
        """True between start() and close()."""
        return self._loop is not None and not self._closed

    @property
    def fork_server_alive(self) -> bool:
        """True while the fork server runs (a dead one is restarted by the next launch)."""
        return self.is_running and self._ctl is not None

    async def start(self) -> None:
        """Choose the limit backend and, for ``fork``, start the fork server."""
        self._loop = asyncio.get_running_loop()
        if self._limiter is None:
            choice = self.config.memory_limit_backend
            self._limiter = await asyncio.to_thread(detect_limiter, choice)
        _log.info("worker memory limits use the %s backend", self._limiter.name)
        if self.config.start_method == "fork":
            try:
                await self._start_fork_server()
            except BaseException:
                await self.close()
                raise
        if self.config.spare_workers > 0:
            cfg = self.config
            self._spares = SparePool(
                cfg.spare_workers, self.launch, self._limiter, cfg.warm, self.answers
            )
            self._spares.start()

    # ------------------------------------------------------------------------ spares

    @property
    def spare_pids(self) -> list[int]:
        """Process ids of the idle spare workers (none when spares are off)."""
        return self._spares.pids if self._spares is not None else []

    @property
    def warm_spare_pids(self) -> list[int]:
        """Those of them that have been told to warm their runtimes (``spares.py``)."""
        return self._spares.warm_pids if self._spares is not None else []

    def take_spare(self) -> Spare | None:
        """An idle spare worker for a load to claim, or None (spares off, none ready)."""
        if self._spares is None or not self.is_running:
            return None
        return self._spares.take()

    def refill_spares(self) -> None:
        """Start spares again up to the pool's size (after a claiming load is over)."""
        if self._spares is not None and self.is_running:
            self._spares.refill()

    async def __aenter__(self) -> WorkerFactory:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def _child_env(self) -> dict[str, str]:
        # One BLAS/OpenMP thread: the fork server must stay single-threaded, and a worker
        # gets its parallelism from the runtime's own intra-op setting.
        env = dict(os.environ)
        for name in _THREAD_ENV:
            env.setdefault(name, "1")
        return env

    async def _start_fork_server(self) -> None:
        loop = asyncio.get_running_loop()
        await self._reap_fork_server()
        ours, theirs = socket_pair()
        try:
            self._server = self._popen_fork_server(theirs)
        finally:
            theirs.close()
        ours.setblocking(False)
        self._ctl = ours
        self._ready = loop.create_future()
        loop.add_reader(ours.fileno(), self._on_ctl_readable)
        try:
            async with asyncio.timeout(self.config.ready_timeout_s):
                info = await self._ready
        except BaseException as exc:
            self._close_ctl("it did not report ready")
            await self._reap_fork_server()
            if isinstance(exc, Exception) and not isinstance(exc, WorkerStartError):
                raise WorkerStartError(f"the fork server did not start: {exc!r}") from exc
            raise
        self.fork_server_info = info
        msg = "fork server %d ready: imports took %.3fs, %d thread(s)"
        _log.info(msg, info.pid, info.import_s, info.threads)

    def _popen_fork_server(self, theirs: socket.socket) -> subprocess.Popen[bytes]:
        # Popen runs on the loop's thread on purpose (a few ms, once): the fork server
        # asks to die with the thread that started it (PR_SET_PDEATHSIG), and executor
        # threads come and go.
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "modelyard.workers.forkserver",
                "--ctl-fd",
                str(theirs.fileno()),
                "--parent-pid",
                str(os.getpid()),
                "--preload",
                ",".join(self.config.preload),
            ],
            pass_fds=(theirs.fileno(),),
            start_new_session=True,
            env=self._child_env(),
        )

    async def close(self) -> None:
        """Kill every worker still running and stop the fork server."""
        if self._closed:
            return
        spares, self._spares = self._spares, None
        if spares is not None:
            await spares.close()
        handles = list(self._handles.values())
        for handle in handles:
            handle.kill()
        if handles:
            # Let their exit reports arrive so that each instance learns what happened.
            await asyncio.wait([h.exited for h in handles], timeout=2.0)
        self._closed = True
        self._close_ctl("the worker factory closed")
        await self._reap_fork_server()
        if self._limiter is not None:
            await asyncio.to_thread(self._limiter.close)

    async def _reap_fork_server(self) -> None:
        """Wait for the (closed or dead) fork server to exit; SIGKILL it after 5 s."""
        server, self._server = self._server, None
        if server is None:
            return
        try:
            await asyncio.to_thread(server.wait, 5.0)
        except subprocess.TimeoutExpired:
            server.kill()
            await asyncio.to_thread(server.wait)

    def _close_ctl(self, why: str) -> None:
        ctl, self._ctl = self._ctl, None
        if ctl is not None:
            if self._loop is not None:
                self._loop.remove_reader(ctl.fileno())
            ctl.close()
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(WorkerStartError(f"fork server failed to start: {why}"))
        for spawn in self._spawns.values():
            if not spawn.done():
                spawn.set_exception(WorkerStartError(f"fork server gone: {why}"))
        self._spawns.clear()
        if self.config.start_method != "fork":
            return
        # The fork server's children die with it (PR_SET_PDEATHSIG) and their exit codes
        # are lost with it. Make sure of the kill, and report each exit once its pidfd
        # says the process has really gone.
        for handle in list(self._handles.values()):
            handle.kill()
            self._watch_orphan(handle)

    def _watch_orphan(self, handle: WorkerHandle) -> None:
        loop = self._loop
        pidfd = handle.pidfd
        if loop is None or pidfd is None or loop.is_closed():
            self._resolve_exit(handle.pid, None)
            return

        def gone() -> None:
            loop.remove_reader(pidfd)
            self._resolve_exit(handle.pid, None)

        loop.add_reader(pidfd, gone)

    # --------------------------------------------------------------- fork server I/O

    def _on_ctl_readable(self) -> None:
        ctl = self._ctl
        if ctl is None:
            return
        try:
            data = ctl.recv(64 * 1024)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            if not self._closed:
                _log.error("the fork server exited; its workers died; the next start restarts it")
            self._close_ctl("the fork server exited")
            return
        try:
            msg = decode(data)
        except MessageError as exc:
            _log.error("bad message from the fork server: %s", exc)
            return
        self._dispatch(msg)

    def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, WorkerSpawned):
            fut = self._spawns.pop(msg.token, None)
            handle = self._track(msg.pid)
            if fut is None or fut.done():
                handle.kill()  # nobody waits for it any more (the launch was cancelled)
            else:
                fut.set_result(handle)
        elif isinstance(msg, WorkerExited):
            self._resolve_exit(msg.pid, msg.returncode)
        elif isinstance(msg, SpawnFailed):
            fut = self._spawns.pop(msg.token, None)
            if fut is not None and not fut.done():
                fut.set_exception(WorkerStartError(msg.message))
        elif (
            isinstance(msg, ForkServerReady) and self._ready is not None and not self._ready.done()
        ):
            self._ready.set_result(msg)

    def _track(self, pid: int, proc: subprocess.Popen[bytes] | None = None) -> WorkerHandle:
        assert self._loop is not None
        exited: asyncio.Future[int | None] = self._loop.create_future()
        handle = WorkerHandle(pid, exited, proc)
        self._exits[pid] = exited
        self._handles[pid] = handle
        return handle

    def _resolve_exit(self, pid: int, returncode: int | None) -> None:
        fut = self._exits.pop(pid, None)
        self._handles.pop(pid, None)
        if fut is not None and not fut.done():
            fut.set_result(returncode)

    # ------------------------------------------------------------------------ launch

    async def launch(self, channel: socket.socket, region: SharedRegion) -> WorkerHandle:
        """Start a worker on ``channel`` (its end of the socket pair) and ``region``.

        The caller closes its copy of ``channel`` afterwards. WorkerStartError on failure.
        """
        if not self.is_running:
            raise WorkerStartError("the worker factory is not running")
        if self.config.start_method == "spawn":
            return self._spawn(channel, region)
        async with self._restart_lock:
            if self._ctl is None:
                _log.warning("restarting the fork server")
                await self._start_fork_server()
        ctl = self._ctl
        assert ctl is not None
        assert self._loop is not None
        token = next(self._tokens)
        fut: asyncio.Future[WorkerHandle] = self._loop.create_future()
        self._spawns[token] = fut
        try:
            socket.send_fds(
                ctl, [encode(SpawnWorker(token, region.size))], [channel.fileno(), region.fd]
            )
        except OSError as exc:
            self._spawns.pop(token, None)
            raise WorkerStartError(f"cannot reach the fork server: {exc}") from exc
        async with asyncio.timeout(self.config.ready_timeout_s):
            return await fut

    def _spawn(self, channel: socket.socket, region: SharedRegion) -> WorkerHandle:
        fds = (channel.fileno(), region.fd)
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "modelyard.workers.main",
                    "--channel-fd",
                    str(fds[0]),
                    "--region-fd",
                    str(fds[1]),
                    "--region-bytes",
                    str(region.size),
                ],
                pass_fds=fds,
                start_new_session=True,
                env=self._child_env(),
            )
        except OSError as exc:
            raise WorkerStartError(f"cannot start a worker: {exc}") from exc
        handle = self._track(proc.pid, proc)
        self._watch_spawned(handle, proc)
        return handle

    def _watch_spawned(self, handle: WorkerHandle, proc: subprocess.Popen[bytes]) -> None:
        loop = self._loop
        assert loop is not None
        try:
            pidfd = os.pidfd_open(proc.pid)
        except (OSError, AttributeError):
            pidfd = -1

        if pidfd >= 0:

            def readable() -> None:
                loop.remove_reader(pidfd)
                os.close(pidfd)
                self._resolve_exit(proc.pid, proc.wait())

            loop.add_reader(pidfd, readable)
            return

        # No pidfd (kernel before 5.3): a dedicated thread waits, not the shared executor.
        def wait() -> None:
            code = proc.wait()
            loop.call_soon_threadsafe(self._resolve_exit, proc.pid, code)

        threading.Thread(target=wait, name=f"wait-worker-{proc.pid}", daemon=True).start()
