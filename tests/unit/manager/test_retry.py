"""LoadBackoff: when requests may retry a failed load."""

from __future__ import annotations

import os
from pathlib import Path

from modelyard.manager.retry import MAX_RETRY_S, LoadBackoff, folder_fingerprint


def _version(tmp_path: Path) -> Path:
    folder = tmp_path / "m" / "1"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"broken")
    (folder / "sub" / "weights.bin").write_bytes(b"w" * 10)
    return folder


def test_the_wait_doubles_with_each_failure_up_to_a_cap(tmp_path: Path) -> None:
    folder = _version(tmp_path)
    backoff = LoadBackoff()
    delays = [backoff.failed(100.0, folder) for _ in range(9)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, MAX_RETRY_S, MAX_RETRY_S, MAX_RETRY_S]
    assert backoff.wait_s(100.0 + 10, folder) == MAX_RETRY_S - 10
    assert backoff.wait_s(100.0 + MAX_RETRY_S, folder) == 0.0


def test_no_failure_means_no_wait(tmp_path: Path) -> None:
    assert LoadBackoff().wait_s(0.0, _version(tmp_path)) == 0.0


def test_new_files_reset_the_backoff(tmp_path: Path) -> None:
    folder = _version(tmp_path)
    backoff = LoadBackoff()
    backoff.failed(0.0, folder)
    backoff.failed(0.0, folder)
    assert backoff.wait_s(0.5, folder) == 1.5, "unchanged files: keep waiting"
    (folder / "sub" / "weights.bin").write_bytes(b"w" * 11)
    assert backoff.wait_s(0.5, folder) == 0.0
    assert backoff.failures == 0
    assert backoff.failed(1.0, folder) == 1.0, "the count starts over"


def test_the_fingerprint_sees_names_sizes_and_times(tmp_path: Path) -> None:
    folder = _version(tmp_path)
    before = folder_fingerprint(folder)
    assert [name for name, _, _ in before] == ["model.onnx", os.path.join("sub", "weights.bin")]
    os.utime(folder / "model.onnx", ns=(1, 1))
    touched = folder_fingerprint(folder)
    assert touched != before
    (folder / "extra.txt").write_text("x")
    assert folder_fingerprint(folder) != touched
    assert folder_fingerprint(tmp_path / "missing") == ()
