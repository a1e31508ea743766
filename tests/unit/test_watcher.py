"""The repository watcher: when a version folder is offered, and offered again."""

from __future__ import annotations

from pathlib import Path

from modelyard.repository.watcher import RepositoryWatcher


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_a_refused_version_is_offered_again_only_after_its_files_change(tmp_path: Path) -> None:
    clock = _Clock()
    watcher = RepositoryWatcher(settle_s=1.0, clock=clock)
    _write(tmp_path / "2" / "model.onnx", b"half")
    assert watcher.scan(tmp_path, set()).ready == []
    clock.now = 1.5
    assert watcher.scan(tmp_path, set()).ready == ["2"]
    # Refused: not offered again while its files are as they were.
    clock.now = 5.0
    assert watcher.scan(tmp_path, {"2"}, {"2"}).ready == []
    _write(tmp_path / "2" / "model.onnx", b"the whole file")
    assert watcher.scan(tmp_path, {"2"}, {"2"}).ready == [], "not before it settles"
    clock.now = 6.5
    assert watcher.scan(tmp_path, {"2"}, {"2"}).ready == ["2"]
    # A version that was accepted is not offered again, whatever happens to its files.
    _write(tmp_path / "2" / "extra.txt", b"x")
    clock.now = 9.0
    assert watcher.scan(tmp_path, {"2"}, set()).ready == []


def test_a_removed_version_restored_byte_for_byte_is_new_again(tmp_path: Path) -> None:
    clock = _Clock()
    watcher = RepositoryWatcher(settle_s=0.0, clock=clock)
    _write(tmp_path / "1" / "model.onnx", b"model")
    watcher.note_taken(tmp_path / "1")
    assert watcher.scan(tmp_path, set(), set()).ready == [], "known at start-up"
    moved = tmp_path.parent / f"{tmp_path.name}-saved"
    (tmp_path / "1").rename(moved)
    assert watcher.scan(tmp_path, {"1"}).removed == ["1"]
    moved.rename(tmp_path / "1")
    assert watcher.scan(tmp_path, set()).ready == ["1"]
