"""Memory-limit backends: finding the server's cgroup, group files, exit reasons."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from modelyard.workers.exits import describe_exit
from modelyard.workers.footprint import parse_smaps_rollup
from modelyard.workers.limits import (
    Cgroup1Limiter,
    Cgroup2Limiter,
    CgroupLimit,
    MemoryLimitError,
    RlimitLimiter,
    cgroup_dirs,
    detect_limiter,
)

MIB = 1024 * 1024

HYBRID_CGROUP = "4:memory:/svc/abc\n1:cpu:/\n0::/\n"
HYBRID_MOUNTS = (
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)
UNIFIED_CGROUP = "0::/system.slice/modelyard.service\n"
UNIFIED_MOUNTS = "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
NAMESPACED_MOUNTS = "30 25 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"


def _proc(tmp_path: Path, cgroup: str, mountinfo: str) -> Path:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "cgroup").write_text(cgroup)
    (tmp_path / "self" / "mountinfo").write_text(mountinfo)
    return tmp_path


@pytest.mark.parametrize(
    ("cgroup", "mounts", "v2", "v1"),
    [
        (HYBRID_CGROUP, HYBRID_MOUNTS, "/sys/fs/cgroup/unified", "/sys/fs/cgroup/memory/svc/abc"),
        (UNIFIED_CGROUP, UNIFIED_MOUNTS, "/sys/fs/cgroup/system.slice/modelyard.service", None),
        ("0::/kubepods/pod1/c\n", NAMESPACED_MOUNTS, "/sys/fs/cgroup/c", None),
        ("", "", None, None),
    ],
    ids=["hybrid", "unified", "mount-below-root", "none"],
)
def test_cgroup_dirs_are_found_from_proc(
    tmp_path: Path, cgroup: str, mounts: str, v2: str | None, v1: str | None
) -> None:
    found_v2, found_v1 = cgroup_dirs(_proc(tmp_path, cgroup, mounts))
    assert (str(found_v2) if found_v2 else None) == v2
    assert (str(found_v1) if found_v1 else None) == v1


def test_without_cgroups_auto_falls_back_to_rlimit(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "", "")
    assert detect_limiter("auto", proc_root=proc).name == "rlimit"
    with pytest.raises(MemoryLimitError, match="cgroup1"):
        detect_limiter("cgroup1", proc_root=proc)


@pytest.mark.parametrize(
    ("cls", "limit_file", "value"),
    [
        (Cgroup1Limiter, "memory.limit_in_bytes", "268435456"),
        (Cgroup2Limiter, "memory.max", "268435456"),
    ],
    ids=["v1", "v2"],
)
def test_a_cgroup_limit_creates_a_group_with_the_limit_and_the_pid(
    tmp_path: Path, cls: type[Cgroup1Limiter] | type[Cgroup2Limiter], limit_file: str, value: str
) -> None:
    limiter = cls(tmp_path, server_pid=7)
    limit = limiter.apply(1234, 256 * MIB)
    assert isinstance(limit, CgroupLimit)
    assert limit.path == tmp_path / "modelyard-7-1"
    assert (limit.path / limit_file).read_text() == value
    assert (limit.path / "cgroup.procs").read_text() == "1234"
    assert not limit.needs_watchdog


@pytest.mark.parametrize(
    ("cls", "limit_file"),
    [(Cgroup1Limiter, "memory.limit_in_bytes"), (Cgroup2Limiter, "memory.max")],
    ids=["v1", "v2"],
)
def test_a_spare_is_placed_without_a_limit_and_resized_when_claimed(
    tmp_path: Path, cls: type[Cgroup1Limiter] | type[Cgroup2Limiter], limit_file: str
) -> None:
    limiter = cls(tmp_path, server_pid=7)
    placed = limiter.place(1234)
    assert isinstance(placed, CgroupLimit)
    assert (placed.path / "cgroup.procs").read_text() == "1234"
    assert not (placed.path / limit_file).exists(), "no limit while it idles"

    limit = limiter.resize(placed, 256 * MIB)

    assert isinstance(limit, CgroupLimit)
    assert limit.path == placed.path
    assert limit.limit_bytes == 256 * MIB
    assert (limit.path / limit_file).read_text() == str(256 * MIB)


def test_resize_refuses_a_limit_of_another_backend(tmp_path: Path) -> None:
    with pytest.raises(MemoryLimitError, match="not a group"):
        Cgroup2Limiter(tmp_path).resize(RlimitLimiter(set_rlimit=False).apply(1, MIB), MIB)


def test_the_rlimit_backend_places_nothing_ahead() -> None:
    assert RlimitLimiter(set_rlimit=False).place(1) is None


@pytest.mark.parametrize(
    ("events_file", "text", "killed"),
    [
        ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n", True),
        ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n", False),
        ("memory.events", "low 0\nhigh 0\nmax 12\noom 1\noom_kill 2\n", True),
        ("memory.events", "", False),
    ],
    ids=["v1-killed", "v1-not", "v2-killed", "v2-empty"],
)
def test_oom_kills_are_read_from_the_groups_counter(
    tmp_path: Path, events_file: str, text: str, killed: bool
) -> None:
    (tmp_path / events_file).write_text(text)
    assert CgroupLimit(tmp_path, MIB, events_file).oom_killed() is killed


def test_release_removes_the_group(tmp_path: Path) -> None:
    group = tmp_path / "modelyard-7-1"
    group.mkdir()
    assert CgroupLimit(group, MIB, "memory.events").release(attempts=1)
    assert not group.exists()


def test_rlimit_limits_need_the_watchdog() -> None:
    limit = RlimitLimiter(set_rlimit=False).apply(1, 64 * MIB)
    assert limit.needs_watchdog
    assert limit.limit_bytes == 64 * MIB
    assert not limit.oom_killed()


@pytest.mark.parametrize(
    ("returncode", "oom", "limit", "expected"),
    [
        (-signal.SIGKILL, True, 200 * MIB, "killed by OOM (memory limit 200 MiB)"),
        (-signal.SIGKILL, False, None, "killed by signal SIGKILL (Killed)"),
        (-signal.SIGSEGV, False, None, "killed by signal SIGSEGV (Segmentation fault)"),
        (3, False, None, "exited with code 3"),
        (None, False, None, "exited; status unknown (the fork server has gone)"),
    ],
    ids=["oom", "sigkill", "segfault", "exit-code", "unknown"],
)
def test_exit_reasons_say_why(
    returncode: int | None, oom: bool, limit: int | None, expected: str
) -> None:
    assert describe_exit(returncode, oom_killed=oom, limit_bytes=limit) == expected


def test_smaps_rollup_gives_rss_uss_pss() -> None:
    text = (
        "55d0c-7ffd [rollup]\nRss:  1000 kB\nPss:  600 kB\nPss_Anon: 100 kB\n"
        "Shared_Clean: 500 kB\nPrivate_Clean: 100 kB\nPrivate_Dirty: 300 kB\n"
        "Private_Hugetlb: 0 kB\nSwap: 8 kB\n"
    )
    sample = parse_smaps_rollup(text)
    assert (sample.rss_bytes, sample.uss_bytes, sample.pss_bytes, sample.swap_bytes) == (
        1000 * 1024,
        400 * 1024,
        600 * 1024,
        8 * 1024,
    )
