"""Per-worker memory limits: one interface, three backends picked at start-up.

* ``cgroup2``: a child group under the server's own cgroup with ``memory.max``;
  needs the memory controller delegated to the server's group (``cgroup.subtree_control``
  must accept ``+memory``, i.e. the server runs in a delegated subtree).
* ``cgroup1``: a child group under the server's group in the v1 ``memory`` hierarchy
  with ``memory.limit_in_bytes``.
* ``rlimit``: ``RLIMIT_AS`` set on the worker (its address space at start plus the
  limit), so large allocations fail with MemoryError, plus an RSS watchdog in the
  server that kills a worker whose private memory passes the limit.

With either cgroup backend the kernel OOM-kills a worker that passes its limit and
the group's ``oom_kill`` counter tells the server why it died. The limit covers what
the worker itself adds: pages it inherits from the fork server stay charged to the
server's group, so a limit is comparable with the measured footprint (USS).

Everything here is blocking file I/O on cgroupfs/procfs; call it from a thread.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

_log = logging.getLogger(__name__)

BackendName = Literal["cgroup2", "cgroup1", "rlimit"]
BackendChoice = Literal["auto", "cgroup2", "cgroup1", "rlimit"]
_GROUP_PREFIX = "modelyard-"


class MemoryLimitError(OSError):
    """A limit could not be put on a worker."""


class MemoryLimit(Protocol):
    """The limit on one worker."""

    @property
    def limit_bytes(self) -> int:
        """The limit in bytes."""
        ...

    @property
    def needs_watchdog(self) -> bool:
        """True when the server must watch the worker's memory itself."""
        ...

    def oom_killed(self) -> bool:
        """True if the kernel OOM-killed a process of this limit's group."""
        ...

    def release(self, attempts: int = 50) -> bool:
        """Remove what the limit created (the worker must have exited).

        False when the kernel still holds it after ``attempts`` tries (10 ms apart).
        """
        ...


class MemoryLimiter(Protocol):
    """A backend that can put a memory limit on a worker process."""

    @property
    def name(self) -> BackendName:
        """``cgroup2``, ``cgroup1`` or ``rlimit``, for logs and health."""
        ...

    def apply(self, pid: int, limit_bytes: int) -> MemoryLimit:
        """Limit ``pid`` to ``limit_bytes``; MemoryLimitError on failure."""
        ...

    def place(self, pid: int) -> MemoryLimit | None:
        """Put an idle spare worker where its limit will be (its own group, no limit
        yet), so that claiming it costs one :meth:`resize`; None when this backend has
        nothing to prepare (rlimit: :meth:`apply` at the claim). MemoryLimitError on
        failure."""
        ...

    def resize(self, limit: MemoryLimit, limit_bytes: int) -> MemoryLimit:
        """Set the limit of a group made by :meth:`place` to ``limit_bytes``."""
        ...

    def close(self) -> None:
        """Remove any group left behind by this server."""
        ...


# ---------------------------------------------------------------------------- cgroups


def _write(path: Path, value: str) -> None:
    with path.open("w") as f:
        f.write(value)


def _counter(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return 0
    return 0


@dataclass
class CgroupLimit:
    """A per-worker cgroup; removed by :meth:`release`."""

    path: Path
    limit_bytes: int
    events_file: str
    needs_watchdog: bool = False

    def oom_killed(self) -> bool:
        """The group's ``oom_kill`` counter is above zero."""
        return _counter(self.path / self.events_file, "oom_kill") > 0

    def release(self, attempts: int = 50) -> bool:
        """rmdir the group, retrying briefly while the kernel finishes the exit.

        Returns False if it is still busy after ``attempts`` (each 10 ms apart).
        """
        return _remove_group(self.path, attempts)


def _remove_group(path: Path, attempts: int = 50) -> bool:
    for attempt in range(attempts):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                _log.warning("could not remove cgroup %s: %s; leaving it", path, exc)
                return True
            if attempt + 1 < attempts:
                time.sleep(0.01)
    return False


class _CgroupLimiter:
    """Shared logic of both cgroup versions: a child group per worker under ``base``."""

    _events_file = ""
    _name: BackendName = "cgroup2"

    def __init__(self, base: Path, server_pid: int | None = None) -> None:
        self.base = base
        self._prefix = f"{_GROUP_PREFIX}{server_pid or os.getpid()}-"
        self._ids = itertools.count(1)

    @property
    def name(self) -> BackendName:
        """The backend's name."""
        return self._name

    def _configure(self, group: Path, limit_bytes: int) -> None:
        """Write ``limit_bytes`` into ``group``'s control files (each version its own)."""
        raise NotImplementedError

    def apply(self, pid: int, limit_bytes: int) -> MemoryLimit:
        """Create ``<base>/modelyard-<server pid>-<n>``, set the limit, move ``pid`` in."""
        group = self.base / f"{self._prefix}{next(self._ids)}"
        try:
            group.mkdir()
            self._configure(group, limit_bytes)
            _write(group / "cgroup.procs", str(pid))
        except OSError as exc:
            _remove_group(group, attempts=1)
            raise MemoryLimitError(f"could not limit worker {pid} with {group}: {exc}") from exc
        return CgroupLimit(group, limit_bytes, self._events_file)

    def place(self, pid: int) -> MemoryLimit | None:
        """Create a group with the kernel's default (no) limit and move ``pid`` in:
        the move is the slow step (5-13 ms), done before anyone waits for the worker."""
        group = self.base / f"{self._prefix}{next(self._ids)}"
        try:
            group.mkdir()
            _write(group / "cgroup.procs", str(pid))
        except OSError as exc:
            _remove_group(group, attempts=1)
            raise MemoryLimitError(f"could not place spare {pid} in {group}: {exc}") from exc
        return CgroupLimit(group, 0, self._events_file)

    def resize(self, limit: MemoryLimit, limit_bytes: int) -> MemoryLimit:
        """Write ``limit_bytes`` into the group's control files (one write each)."""
        if not isinstance(limit, CgroupLimit):
            raise MemoryLimitError(f"not a group of this backend: {limit!r}")
        try:
            self._configure(limit.path, limit_bytes)
        except OSError as exc:
            raise MemoryLimitError(f"could not limit {limit.path}: {exc}") from exc
        return CgroupLimit(limit.path, limit_bytes, self._events_file)

    def probe(self) -> None:
        """Create, configure and remove a group; OSError when this backend cannot work."""
        group = self.base / f"{self._prefix}probe"
        group.mkdir(exist_ok=True)
        try:
            self._configure(group, 1 << 30)
        finally:
            group.rmdir()

    def close(self) -> None:
        """Remove this server's leftover groups."""
        for path in self.base.glob(f"{self._prefix}*"):
            _remove_group(path, attempts=1)

    def remove_stale(self) -> None:
        """Remove empty groups left by servers that no longer run."""
        for path in self.base.glob(f"{_GROUP_PREFIX}*"):
            owner = path.name[len(_GROUP_PREFIX) :].partition("-")[0]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                with contextlib.suppress(OSError):
                    path.rmdir()


class Cgroup2Limiter(_CgroupLimiter):
    """cgroup v2: ``memory.max`` (and no swap) on a child group."""

    _events_file = "memory.events"
    _name: BackendName = "cgroup2"

    def _configure(self, group: Path, limit_bytes: int) -> None:
        _write(group / "memory.max", str(limit_bytes))
        with contextlib.suppress(OSError):
            _write(group / "memory.swap.max", "0")


class Cgroup1Limiter(_CgroupLimiter):
    """cgroup v1: ``memory.limit_in_bytes`` (and the same for memory+swap if present)."""

    _events_file = "memory.oom_control"
    _name: BackendName = "cgroup1"

    def _configure(self, group: Path, limit_bytes: int) -> None:
        _write(group / "memory.limit_in_bytes", str(limit_bytes))
        memsw = group / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            with contextlib.suppress(OSError):
                _write(memsw, str(limit_bytes))


# ----------------------------------------------------------------------------- rlimit


@dataclass
class RlimitLimit:
    """``RLIMIT_AS`` on the worker; the server's watchdog does the rest."""

    limit_bytes: int
    needs_watchdog: bool = True

    def oom_killed(self) -> bool:
        """Never: the kernel does not kill for RLIMIT_AS (allocations fail instead)."""
        return False

    def release(self, attempts: int = 50) -> bool:
        """Nothing to remove."""
        return True


def _vm_size(pid: int, proc_root: Path) -> int:
    for line in (proc_root / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


class RlimitLimiter:
    """``RLIMIT_AS`` of the worker's address space at start plus the limit."""

    def __init__(self, *, set_rlimit: bool = True, proc_root: Path = Path("/proc")) -> None:
        self._set_rlimit = set_rlimit
        self._proc_root = proc_root

    @property
    def name(self) -> BackendName:
        """Always ``rlimit``."""
        return "rlimit"

    def apply(self, pid: int, limit_bytes: int) -> MemoryLimit:
        """Set the rlimit with ``prlimit(2)``; the watchdog is the server's job."""
        if self._set_rlimit:
            try:
                cap = _vm_size(pid, self._proc_root) + limit_bytes
                resource.prlimit(pid, resource.RLIMIT_AS, (cap, cap))
            except (OSError, ValueError) as exc:
                raise MemoryLimitError(f"could not set RLIMIT_AS on worker {pid}: {exc}") from exc
        return RlimitLimit(limit_bytes)

    def place(self, pid: int) -> MemoryLimit | None:
        """Nothing to prepare: ``RLIMIT_AS`` is set when the spare is claimed."""
        return None

    def resize(self, limit: MemoryLimit, limit_bytes: int) -> MemoryLimit:
        """Never called (:meth:`place` made nothing); the limit as asked."""
        return RlimitLimit(limit_bytes)

    def close(self) -> None:
        """Nothing to clean up."""


# -------------------------------------------------------------------------- detection


@dataclass(frozen=True, slots=True)
class _Mount:
    root: str
    point: str
    fstype: str
    options: frozenset[str]


def _mounts(text: str) -> list[_Mount]:
    mounts = []
    for line in text.splitlines():
        pre, sep, post = line.partition(" - ")
        if not sep:
            continue
        fields, tail = pre.split(), post.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        options = frozenset(tail[2].split(","))
        mounts.append(_Mount(fields[3], fields[4], tail[0], options))
    return mounts


def _join(mount: _Mount, path: str) -> Path:
    root = mount.root.rstrip("/")
    rel = path[len(root) :] if root and path.startswith(root) else path
    return Path(mount.point) / rel.lstrip("/")


def cgroup_dirs(proc_root: Path = Path("/proc")) -> tuple[Path | None, Path | None]:
    """The server's own (cgroup v2 dir, cgroup v1 memory dir), each None if absent."""
    try:
        groups = (proc_root / "self" / "cgroup").read_text().splitlines()
        mounts = _mounts((proc_root / "self" / "mountinfo").read_text())
    except OSError:
        return None, None
    v2: Path | None = None
    v1: Path | None = None
    for line in groups:
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and not controllers:
            m2 = next((m for m in mounts if m.fstype == "cgroup2"), None)
            v2 = _join(m2, path) if m2 else None
        elif "memory" in controllers.split(","):
            m1 = next((m for m in mounts if m.fstype == "cgroup" and "memory" in m.options), None)
            v1 = _join(m1, path) if m1 else None
    return v2, v1


def _cgroup2_ready(base: Path) -> bool:
    try:
        if "memory" not in (base / "cgroup.controllers").read_text().split():
            return False
        control = base / "cgroup.subtree_control"
        if "memory" not in control.read_text().split():
            _write(control, "+memory")
    except OSError:
        return False
    return True


def detect_limiter(
    choice: BackendChoice = "auto", *, proc_root: Path = Path("/proc")
) -> MemoryLimiter:
    """The first backend that works here, in the order cgroup2, cgroup1, rlimit.

    ``choice`` forces one; a forced cgroup backend that cannot work raises
    MemoryLimitError. Probing creates and removes one group.
    """
    v2, v1 = cgroup_dirs(proc_root)
    errors: list[str] = []
    candidates: list[_CgroupLimiter] = []
    if choice in ("auto", "cgroup2"):
        if v2 is not None and _cgroup2_ready(v2):
            candidates.append(Cgroup2Limiter(v2))
        else:
            errors.append(f"cgroup2: memory controller not delegated to {v2}")
    if choice in ("auto", "cgroup1"):
        if v1 is not None:
            candidates.append(Cgroup1Limiter(v1))
        else:
            errors.append("cgroup1: no v1 memory hierarchy")
    for limiter in candidates:
        try:
            limiter.probe()
        except OSError as exc:
            errors.append(f"{limiter.name}: {exc}")
            continue
        limiter.remove_stale()
        return limiter
    if choice in ("auto", "rlimit"):
        if errors:
            _log.info("memory limits fall back to rlimit + watchdog (%s)", "; ".join(errors))
        return RlimitLimiter(proc_root=proc_root)
    raise MemoryLimitError(f"memory limit backend {choice!r} is not available: {errors}")
