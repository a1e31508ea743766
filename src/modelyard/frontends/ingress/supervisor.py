"""Starts, watches, restarts and stops the ingress processes of one server.

The supervisor binds the HTTP port itself, once per ingress: N listening sockets
with ``SO_REUSEPORT`` on one port, so the kernel spreads new connections evenly
over them (one shared socket would let whichever process wakes first take a whole
burst). Each ingress inherits its socket; the supervisor keeps its own copy open,
so connections that wait in a socket's backlog while its ingress restarts are
served by the new one. Each ingress reaches the manager over a Unix socket pair
(:mod:`~modelyard.frontends.ingress.tunnel`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter
from starlette.types import ASGIApp

from modelyard.config.settings import ServerSettings
from modelyard.frontends.http.server_config import accept_batch
from modelyard.frontends.ingress.tunnel import TunnelEnd

log = logging.getLogger("modelyard.ingress")

START_TIMEOUT_S = 60.0
"""How long an ingress process may take to import and start serving."""
STOP_TIMEOUT_S = 5.0
"""How long a stopping ingress may take to finish its requests before it is killed."""
_QUICK_EXIT_S = 2.0
"""An ingress that exits sooner than this after its start waits before its restart..."""
_MAX_BACKOFF_S = 5.0
"""...doubling each time, up to this."""


def _listening_sockets(host: str, port: int, count: int, backlog: int) -> list[socket.socket]:
    """``count`` listening sockets sharing one port (the first picks it when 0)."""
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = info[0]
    # SO_REUSEPORT would let these sockets join another server's on the same port (same
    # user) and silently take half its connections: a plain bind first proves the port
    # free (and picks it when 0).
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)
        address = (address[0], probe.getsockname()[1], *address[2:])
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            sock.listen(backlog)
            address = (address[0], sock.getsockname()[1], *address[2:])
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class _Slot:
    """One ingress position: its listening socket and its current process."""

    def __init__(self, index: int, listener: socket.socket) -> None:
        self.index = index
        self.listener = listener
        self.process: asyncio.subprocess.Process | None = None
        self.tunnel: TunnelEnd | None = None
        self.watcher: asyncio.Task[None] | None = None


class IngressSupervisor:
    """N ingress processes in front of one ASGI app (the manager's)."""

    def __init__(
        self,
        app: ASGIApp,
        settings: ServerSettings,
        tls_options: dict[str, Any],
        registry: CollectorRegistry,
    ) -> None:
        self.app = app
        self.count = settings.ingress_processes
        self.host = settings.host
        self.port = settings.http_port
        self.limits = settings.limits
        self.tls_options = tls_options
        self._logging = {"level": settings.log_level, "format": settings.log_format}
        self._slots: list[_Slot] = []
        self._stopping = False
        self.requests = Counter(
            "modelyard_ingress_requests",
            "HTTP requests forwarded to the manager, by ingress process id.",
            ["ingress"],
            registry=registry,
        )
        self.restarts = Counter(
            "modelyard_ingress_restarts",
            "Ingress processes restarted after they exited.",
            registry=registry,
        )

    @property
    def pids(self) -> list[int]:
        """Process ids of the ingress processes running now."""
        return [s.process.pid for s in self._slots if s.process and s.process.returncode is None]

    async def start(self) -> int:
        """Bind the port, start every ingress and wait until all serve; the port."""
        backlog = accept_batch(self.limits.max_connections)
        listeners = _listening_sockets(self.host, self.port, self.count, backlog)
        self.port = listeners[0].getsockname()[1]
        self._slots = [_Slot(i, sock) for i, sock in enumerate(listeners)]
        try:
            await asyncio.gather(*(self._spawn(slot) for slot in self._slots))
        except BaseException:
            await self.stop()
            raise
        for slot in self._slots:
            slot.watcher = asyncio.create_task(self._watch(slot), name="modelyard-ingress")
        return self.port

    def _options(self) -> bytes:
        tls = dict(self.tls_options)
        if "ssl_cert_reqs" in tls:
            tls["ssl_cert_reqs"] = int(tls["ssl_cert_reqs"])
        limits = self.limits.model_dump(mode="json")
        return orjson.dumps(
            {"host": self.host, "limits": limits, "tls": tls, "logging": self._logging}
        )

    async def _spawn(self, slot: _Slot) -> None:
        """Start the slot's process and wait for its hello."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        listen_fd, channel_fd = slot.listener.fileno(), theirs.fileno()
        command = [sys.executable, "-m", "modelyard.frontends.ingress.child"]
        try:
            # Its own session: a Ctrl-C in the terminal reaches the server, which then
            # stops its ingresses in order, not every process at once.
            slot.process = await asyncio.create_subprocess_exec(
                *command,
                str(listen_fd),
                str(channel_fd),
                self._options().decode(),
                pass_fds=(listen_fd, channel_fd),
                start_new_session=True,
            )
        finally:
            theirs.close()
        tunnel = TunnelEnd(self.app, self._count_request)
        slot.tunnel = tunnel
        loop = asyncio.get_running_loop()
        await loop.connect_accepted_socket(lambda: tunnel.protocol, sock=ours)
        hello = asyncio.ensure_future(tunnel.hello.wait())
        lost = asyncio.ensure_future(tunnel.lost.wait())
        try:
            await asyncio.wait(
                [hello, lost], timeout=START_TIMEOUT_S, return_when="FIRST_COMPLETED"
            )
        finally:
            hello.cancel()
            lost.cancel()
        if not tunnel.hello.is_set():
            raise OSError(f"ingress process {slot.process.pid} did not start serving")
        log.info("ingress %d serving (pid %d)", slot.index, slot.process.pid)

    def _count_request(self, pid: int) -> None:
        self.requests.labels(str(pid)).inc()

    async def _watch(self, slot: _Slot) -> None:
        """Restart the slot's process whenever it exits, until the server stops."""
        backoff_s = 0.1
        loop = asyncio.get_running_loop()
        while not self._stopping:
            tunnel, process = slot.tunnel, slot.process
            assert tunnel is not None
            assert process is not None
            started = loop.time()
            await tunnel.lost.wait()
            code = await process.wait()
            await tunnel.close()
            if self._stopping:
                return
            log.warning("ingress process %d exited (%s); restarting it", process.pid, code)
            self.restarts.inc()
            if loop.time() - started < _QUICK_EXIT_S:
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, _MAX_BACKOFF_S)
            else:
                backoff_s = 0.1
            try:
                await self._spawn(slot)
            except OSError as exc:
                log.error("ingress %d could not restart: %s", slot.index, exc)
                if slot.process is not None and slot.process.returncode is None:
                    slot.process.kill()

    async def stop(self) -> None:
        """Stop every ingress (in-flight requests finish first), then close the port."""
        self._stopping = True
        for slot in self._slots:
            if slot.watcher is not None:
                slot.watcher.cancel()
        for slot in self._slots:
            if slot.process is not None and slot.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.process.send_signal(signal.SIGTERM)
        for slot in self._slots:
            if slot.process is not None:
                try:
                    await asyncio.wait_for(slot.process.wait(), STOP_TIMEOUT_S)
                except TimeoutError:
                    slot.process.kill()
                    await slot.process.wait()
            if slot.tunnel is not None:
                await slot.tunnel.close()
            slot.listener.close()
        for slot in self._slots:
            if slot.watcher is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await slot.watcher
