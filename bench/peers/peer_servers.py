"""The three servers under test: how to start each, and its process tree while it runs.

Every server runs in its own session (``start_new_session``), so the whole tree it spawns
(MLServer's inference worker, Triton and its Python-backend stubs, modelyard's workers) can
be measured and, if a graceful stop fails, killed by process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import psutil

HERE = Path(__file__).resolve().parent
VENVS = HERE / ".venvs"

STOP_GRACE_S = 45.0
"""How long a server may take to exit after SIGTERM (Triton waits up to 30 s for its stubs)."""


@dataclass(frozen=True)
class ServerSpec:
    """How to start one server and talk to its control plane."""

    name: str
    http_port: int
    ports: tuple[int, ...]
    """Every port it binds; each must be free before it starts."""
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    repository_headers: Mapping[str, str] = field(default_factory=dict)
    """Headers its ``/v2/repository`` API needs (PyTriton restricts it behind a token)."""
    cold_start_via_repository: bool = True
    """Whether ``unload`` then ``load`` over ``/v2/repository`` brings a model back."""
    timings_file: Path | None = None
    """A JSON file the server script writes with its own load timings, if any."""

    @property
    def url(self) -> str:
        """Base URL of its REST endpoint."""
        return f"http://127.0.0.1:{self.http_port}"


@dataclass(frozen=True)
class MemorySample:
    """Memory of a whole process tree at one moment."""

    rss_bytes: int
    pss_bytes: int | None
    """Proportional set size: shared pages split between sharers; ``None`` if unreadable."""
    processes: int

    def to_dict(self) -> dict[str, float | int | None]:
        """MiB for people, bytes for tools."""
        return {
            "rss_mib": round(self.rss_bytes / 2**20, 1),
            "pss_mib": None if self.pss_bytes is None else round(self.pss_bytes / 2**20, 1),
            "rss_bytes": self.rss_bytes,
            "pss_bytes": self.pss_bytes,
            "processes": self.processes,
        }


class RunningServer:
    """One started server; use as a context manager so it is always stopped."""

    def __init__(self, spec: ServerSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self._log: BinaryIO | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._seen: dict[int, psutil.Process] = {}
        self.started_at = 0.0

    def __enter__(self) -> RunningServer:
        busy = [port for port in self.spec.ports if not port_is_free(port)]
        if busy:
            raise RuntimeError(f"{self.spec.name}: ports {busy} are in use; pick --base-port")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        env = {**os.environ, **self.spec.env}
        self.started_at = time.monotonic()
        self._proc = subprocess.Popen(
            self.spec.command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def exit_code(self) -> int | None:
        """The server's exit status, or ``None`` while it runs."""
        return None if self._proc is None else self._proc.poll()

    def tree(self) -> list[psutil.Process]:
        """The server process and every descendant alive now."""
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        for proc in procs:
            self._seen.setdefault(proc.pid, proc)
        return procs

    def memory(self) -> MemorySample:
        """Sum of RSS and PSS over the tree (PSS counts shared libraries once overall)."""
        rss = 0
        pss: int | None = 0
        count = 0
        for proc in self.tree():
            try:
                info = proc.memory_full_info()
            except psutil.AccessDenied:
                with contextlib.suppress(psutil.Error):
                    rss += proc.memory_info().rss
                    count += 1
                pss = None
                continue
            except psutil.NoSuchProcess:
                continue
            rss += info.rss
            count += 1
            if pss is not None:
                pss += getattr(info, "pss", 0)
        return MemorySample(rss_bytes=rss, pss_bytes=pss, processes=count)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of its combined stdout/stderr."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM the server, wait, then SIGKILL whatever of its tree is left."""
        if self._proc is None:
            return
        self.tree()  # remember the descendants before the root goes
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                print(
                    f"  {self.spec.name}: no exit {STOP_GRACE_S:.0f} s after SIGTERM; killing",
                    file=sys.stderr,
                )
        # NOTE: the group is the session this script created for the server, so this kill
        # reaches only processes the server started (stubs, workers) and not the caller's.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        for proc in self._seen.values():
            with contextlib.suppress(psutil.Error):
                if proc.is_running():
                    proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)
        self._seen.clear()
        if self._log is not None:
            self._log.close()
            self._log = None
        self._proc = None


def port_is_free(port: int) -> bool:
    """Whether nothing listens on ``127.0.0.1:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def venv_python(name: str) -> Path:
    """The interpreter of ``bench/peers/.venvs/<name>``."""
    return VENVS / name / "bin" / "python"


def package_versions(python: Path | str, names: Sequence[str]) -> dict[str, str | None]:
    """Installed versions of ``names`` in the environment of ``python``."""
    code = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for n in sys.argv[1:]:\n"
        "    try: out[n] = m.version(n)\n"
        "    except m.PackageNotFoundError: out[n] = None\n"
        "print(json.dumps(out))\n"
    )
    try:
        done = subprocess.run(
            [str(python), "-c", code, *names], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return dict.fromkeys(names)
    if done.returncode != 0:
        return dict.fromkeys(names)
    result: dict[str, str | None] = json.loads(done.stdout)
    return result
