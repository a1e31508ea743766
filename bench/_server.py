"""A ``modelyard serve`` subprocess for the bench scripts, plus what each of them records.

The server runs in its own process (and session), so its event loop and the load
generator's never share a thread. Readiness is polled on ``/v2/health/ready``; logs go to
a file in the caller's temporary folder and their tail is shown if the server fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import httpx
import psutil
import yaml

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"

START_TIMEOUT_S = 120.0
"""How long a server may take to answer ready (preloading MiniLM takes a while on 2 cores)."""
STOP_GRACE_S = 20.0


def arg_parser(doc: str | None) -> argparse.ArgumentParser:
    """The argument parser every bench script starts from (its docstring as help)."""
    return argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_load_point_arguments(
    parser: argparse.ArgumentParser,
    *,
    concurrency: str,
    duration_s: float,
    warmup_s: float,
    quick: tuple[float, float],
) -> None:
    """The arguments of a bench that measures load points (concurrency levels), each for
    ``--duration-s`` after ``--warmup-s``, ``--repeats`` times; ``--quick``: one repeat of
    ``quick`` (duration, warm-up) seconds (see :func:`quick_load_points`)."""
    parser.add_argument("--quick", action="store_true", help=f"{quick[0]:g} s per point, 1 repeat")
    parser.add_argument("--concurrency", default=concurrency, help="levels (%(default)s)")
    parser.add_argument("--duration-s", type=float, default=duration_s, help="measured s per point")
    parser.add_argument("--warmup-s", type=float, default=warmup_s, help="warm-up s per point")
    parser.add_argument("--repeats", type=int, default=3, help="repeats (%(default)s)")
    parser.set_defaults(quick_points=quick)


def quick_load_points(args: argparse.Namespace) -> None:
    """With ``--quick``: the quick duration and warm-up, one repeat."""
    # Not a user's argument: kept out of the ``args`` a bench writes with its results.
    quick = vars(args).pop("quick_points")
    if args.quick:
        args.duration_s, args.warmup_s = quick
        args.repeats = 1


def install_uvloop() -> None:
    """Use uvloop for the client's event loop when it is installed, as the server does."""
    try:
        import uvloop
    except ImportError:
        return
    uvloop.install()


def free_port() -> int:
    """A port nothing listens on right now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def modelyard_command() -> list[str]:
    """The ``modelyard`` console script of the running interpreter's environment."""
    beside = Path(sys.executable).parent / "modelyard"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("modelyard")
    if found is None:
        raise SystemExit("the modelyard command is not installed in this environment")
    return [found]


def write_config(
    root: Path,
    models: Sequence[Mapping[str, Any]],
    *,
    name: str = "modelyard.yaml",
    budget_mb: float = 4096,
    log_level: str = "warning",
) -> Path:
    """Write a server YAML for ``models`` (paths relative to ``root``); return its path."""
    config = {
        "model_repository": ".",
        "log_level": log_level,
        # Off unless a Server asks for it with --grpc-port: the default 8081 would collide.
        "grpc_port": None,
        "devices": [{"name": "cpu", "memory_budget_mb": budget_mb}],
        "models": [dict(m) for m in models],
    }
    path = root / name
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


class Server:
    """One ``modelyard serve`` process; a context manager, so it is always stopped."""

    def __init__(
        self,
        config: Path,
        log_path: Path,
        *,
        grpc: bool = False,
        command: Sequence[str] | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.command = list(command) if command is not None else modelyard_command()
        self.extra_args = list(extra_args)
        """More ``modelyard serve`` flags (``--ray ADDRESS``)."""
        self.env = dict(env) if env is not None else None
        self.log_path = log_path
        self.http_port = free_port()
        self.grpc_port = free_port() if grpc else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None
        self.client = httpx.Client(base_url=self.url, timeout=300.0)

    @property
    def url(self) -> str:
        """Base URL of the REST endpoint."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        """``host:port`` of the gRPC endpoint."""
        assert self.grpc_port is not None
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int:
        """The server process's id."""
        assert self._proc is not None
        return self._proc.pid

    def __enter__(self) -> Server:
        command = [
            *self.command,
            "serve",
            "--config",
            str(self.config),
            "--http-port",
            str(self.http_port),
        ]
        if self.grpc_port is not None:
            command += ["--grpc-port", str(self.grpc_port)]
        command += self.extra_args
        self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            command,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(f"server exited ({self._proc.returncode}):\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if self.client.get("/v2/health/ready", timeout=2.0).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's output."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def post(self, path: str, body: object = None) -> httpx.Response:
        """POST JSON ``body`` (default ``{}``) and fail loudly on an error status."""
        response = self.client.post(path, json={} if body is None else body)
        if response.status_code != 200:
            raise RuntimeError(f"POST {path}: {response.status_code} {response.text[:300]}")
        return response

    def model_stats(self, name: str) -> dict[str, Any]:
        """The ``/v2/stats`` entry of model ``name`` (its newest version)."""
        body = self.client.get("/v2/stats").json()
        rows = [m for m in body["models"] if m["name"] == name]
        if not rows:
            raise RuntimeError(f"model {name} not in /v2/stats")
        return dict(max(rows, key=lambda m: str(m["version"])))

    def committed_stats(self, name: str, timeout_s: float = 10.0) -> dict[str, Any]:
        """:meth:`model_stats` once the model's measured footprint is committed (a worker's
        footprint is measured just after its model turns READY; ``footprint_pending``)."""
        give_up = time.monotonic() + timeout_s
        row = self.model_stats(name)
        while row.get("footprint_pending") and time.monotonic() < give_up:
            time.sleep(0.01)
            row = self.model_stats(name)
        return row

    def stop(self) -> None:
        """SIGTERM, wait, then SIGKILL the process group this script created for it."""
        self.client.close()
        if self._proc is not None:
            if self._proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=STOP_GRACE_S)
            # NOTE: the group is the session created for the server, so this reaches only
            # its workers, never the caller.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its live descendants.

    A descendant that exited since the last call drops out, so take differences over
    spans in which no worker starts or stops.
    """
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def environment() -> dict[str, Any]:
    """Versions and machine facts recorded beside every result."""
    import onnxruntime

    sha = "unknown"
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if dirty:
            sha += "+dirty-src"
    return {
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "modelyard_git": sha,
        "cpus": os.cpu_count(),
        "load_average_at_start": list(os.getloadavg()),
        "platform": platform.platform(),
    }


def write_results(name: str, payload: Mapping[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` (git-ignored); return its path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table; floats as they were formatted by the caller."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
