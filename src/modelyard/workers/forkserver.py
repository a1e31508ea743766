"""The warm parent: a process that has imported the runtimes and forks workers on request.

Started once per server (``python -m modelyard.workers.forkserver``) by
:class:`~modelyard.workers.factory.WorkerFactory`. After its imports it never creates
a session or a thread pool, so each worker starts from a clean, single-threaded copy
of an interpreter that already has numpy and ONNX Runtime loaded: a start costs a
``fork()`` (milliseconds) instead of a fresh interpreter and ``import onnxruntime``.

NOTE: importing ONNX Runtime's extension module starts one idle std::thread (it sleeps
in a timed condition wait; no inference thread pool exists until a session is made).
``fork()`` copies only the calling thread, so children never run it; they exit with
``os._exit`` so no static destructor tries to join it. Loading with
``preload=("numpy",)`` keeps the fork server strictly single-threaded at the cost of
~30 ms of import per worker start.

It is the parent of every worker, so it reaps them and reports each exit status; the
server learns *why* a worker died (signal, exit code) from those reports.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from collections.abc import Iterable

from modelyard.workers.messages import (
    ForkServerReady,
    SpawnFailed,
    SpawnWorker,
    WorkerExited,
    WorkerSpawned,
    decode,
    encode,
)

DEFAULT_PRELOAD: tuple[str, ...] = (
    "numpy",
    # numpy imports its random module on first use (~20 ms here): the generated warm-up
    # inputs that every worker makes use it.
    "numpy.random",
    "onnxruntime",
    "psutil",
    "modelyard.runtimes.onnx",
    "modelyard.runtimes.python",
    "modelyard.runtimes.warmup",
    "modelyard.workers.main",
)
"""Modules the fork server imports before it forks anything."""

RUNTIME_PRELOAD: dict[str, tuple[str, ...]] = {
    # llama-cpp-python's package import (its high-level API, jinja2, the shared
    # libraries) costs 75-180 ms per worker on a 2-core VM, and its backend's start
    # another 2-8 ms: more than the whole load of a 60 MB GGUF file. Neither starts a
    # thread, so the fork server can do both once for all workers.
    "llama_cpp": ("jinja2.sandbox", "modelyard.runtimes.llama_cpp:prepare_fork_server"),
    # skops.io lists every scikit-learn estimator as it is imported, importing all of
    # scikit-learn (and torch through its array-API shim, where torch is installed):
    # 1-3 s on an idle 2-core machine, tens of seconds on a busy one. Paid once here
    # instead of by the first request to each skops model.
    "sklearn": ("skops.io",),
}
"""Extra preloads per runtime kind, used when the repository declares such a model.

An entry ``module:function`` imports the module, then calls the function (no arguments).
"""


def preload_for(kinds: Iterable[str], base: tuple[str, ...] = DEFAULT_PRELOAD) -> tuple[str, ...]:
    """``base`` plus the modules of :data:`RUNTIME_PRELOAD` for the runtime ``kinds``."""
    extra = [m for k in sorted(set(kinds)) for m in RUNTIME_PRELOAD.get(k, ())]
    return tuple(dict.fromkeys([*base, *extra]))


_CTL_BUFFER_BYTES = 64 * 1024


def thread_count() -> int:
    """Threads of this process, from ``/proc``."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


class _ForkServer:
    def __init__(self, ctl: socket.socket) -> None:
        self._ctl = ctl
        self._children: set[int] = set()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector = selectors.DefaultSelector()

    def run(self) -> None:
        # SIGCHLD needs a Python-level handler for the wakeup fd to be written.
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self._wake_w)
        self._selector.register(self._ctl, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        while True:
            for key, _ in self._selector.select():
                if key.fileobj is self._ctl:
                    if not self._on_request():
                        self._shutdown()
                        return
                else:
                    self._drain_wakeups()
                    self._reap()

    def _send(self, msg: WorkerSpawned | SpawnFailed | WorkerExited) -> None:
        self._ctl.send(encode(msg))

    def _on_request(self) -> bool:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self._ctl, _CTL_BUFFER_BYTES, 2)
        except OSError:
            return False
        if not data:
            return False
        req = decode(data)
        if not isinstance(req, SpawnWorker) or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            token = req.token if isinstance(req, SpawnWorker) else -1
            self._send(SpawnFailed(token, f"bad spawn request: {req!r} with {len(fds)} fds"))
            return True
        channel_fd, region_fd = fds
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(channel_fd)
            os.close(region_fd)
            self._send(SpawnFailed(req.token, f"fork failed: {exc}"))
            return True
        if pid == 0:
            self._child(channel_fd, region_fd, req.region_bytes)
        os.close(channel_fd)
        os.close(region_fd)
        self._children.add(pid)
        self._send(WorkerSpawned(req.token, pid))
        return True

    def _child(self, channel_fd: int, region_fd: int, region_bytes: int) -> None:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self._selector.close()
            self._ctl.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            from modelyard.workers.main import die_with_parent, serve

            die_with_parent()
            code = serve(channel_fd, region_fd, region_bytes)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._children.discard(pid)
            try:
                self._send(WorkerExited(pid, os.waitstatus_to_exitcode(status)))
            except OSError:
                return

    def _shutdown(self) -> None:
        # The server has gone (or closed us): no worker may outlive it.
        for pid in list(self._children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in list(self._children):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def main(argv: list[str] | None = None) -> None:
    """Entry point: import, report ready, then serve fork requests until EOF."""
    parser = argparse.ArgumentParser(prog="modelyard-forkserver")
    parser.add_argument("--ctl-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--preload", default=",".join(DEFAULT_PRELOAD))
    args = parser.parse_args(argv)

    from modelyard.workers.huge_pages import trim_heap
    from modelyard.workers.main import die_with_parent

    die_with_parent()
    if os.getppid() != args.parent_pid:
        os._exit(0)  # the server died before we could ask to die with it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    t0 = time.perf_counter()
    for name in filter(None, args.preload.split(",")):
        module_name, _, hook = name.partition(":")
        try:
            module = importlib.import_module(module_name)
            if hook:
                getattr(module, hook)()
        except Exception as exc:  # a worker that needs it then fails its load, typed
            print(f"modelyard fork server: cannot preload {name}: {exc}", file=sys.stderr)
    import_s = time.perf_counter() - t0
    # Freeze what exists now so that the collector never touches (and copies) the
    # inherited pages in the children.
    gc.collect()
    gc.freeze()
    # The imports' temporary blocks, freed, would otherwise stay in the heap every
    # worker inherits; handed back now, before the first fork.
    trim_heap()
    ctl = socket.socket(fileno=args.ctl_fd)
    ctl.setblocking(True)
    ctl.send(encode(ForkServerReady(os.getpid(), thread_count(), import_s)))
    _ForkServer(ctl).run()
    os._exit(0)


if __name__ == "__main__":
    main()
