"""The page-cache tier: a model's files read into the page cache, and dropped again."""

from __future__ import annotations

import os
from pathlib import Path

from modelyard.repository import page_cache

MIB = 1024 * 1024


def _filesystem(path: Path) -> str:
    """The type of the filesystem ``path`` is on (from /proc/mounts; longest mount wins)."""
    best, kind = "", ""
    target = str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mount, fstype, *_ = line.split()
        if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) > len(
            best
        ):
            best, kind = mount, fstype
    return kind


def test_warm_reads_every_file_into_the_page_cache(tmp_path: Path) -> None:
    model = tmp_path / "m" / "1"
    model.mkdir(parents=True)
    (model / "model.onnx").write_bytes(os.urandom(MIB))
    (model / "weights.bin").write_bytes(os.urandom(3 * MIB))
    os.sync()
    page_cache.drop(model)
    asked = page_cache.warm(model)
    assert asked == 4 * MIB
    resident = page_cache.resident_fraction(model)
    assert resident is not None
    assert resident > 0.99
    if _filesystem(tmp_path) not in ("tmpfs", "ramfs"):
        # Memory-backed filesystems keep their pages whatever is advised.
        assert page_cache.drop(model) == 4 * MIB
        after = page_cache.resident_fraction(model)
        assert after is not None
        assert after < 0.5


def test_missing_and_unreadable_paths_are_skipped(tmp_path: Path) -> None:
    assert page_cache.warm(tmp_path / "nope") == 0
    assert page_cache.drop(tmp_path / "nope") == 0
    assert page_cache.resident_fraction(tmp_path / "nope") is None
    single = tmp_path / "model.onnx"
    single.write_bytes(b"x" * 4096)
    assert page_cache.warm(single) == 4096
