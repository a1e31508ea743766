"""The budget's shared-file ledger: a memory-mapped weight file is charged once."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.manager.budget import MemoryBudget, SharedFile
from modelyard.manager.records import ModelKey
from modelyard.workers.footprint import (
    MappedFile,
    parse_mapped_private,
    parse_smaps_sample,
    weight_files,
)

A, B, C = ModelKey("a", "1"), ModelKey("a", "2"), ModelKey("c", "1")
WEIGHTS = SharedFile("/repo/a/weights.data", dev=1, inode=10, size=64, mtime_ns=5)
OTHER = SharedFile("/repo/c/weights.data", dev=1, inode=11, size=30, mtime_ns=5)


def test_two_models_mapping_one_file_are_charged_once() -> None:
    budget = MemoryBudget({"cpu": 100})
    assert budget.try_reserve("cpu", A, 6, [WEIGHTS])
    assert budget.try_reserve("cpu", B, 6, [WEIGHTS])
    dev = budget.device("cpu")
    assert dev.reserved_bytes == 6 + 6 + 64
    assert dev.shared_bytes == 64
    assert budget.files_of("cpu", A) == [WEIGHTS] == budget.files_of("cpu", B)


def test_a_model_whose_file_is_charged_reserves_only_its_private_part() -> None:
    budget = MemoryBudget({"cpu": 80})
    assert budget.try_reserve("cpu", A, 6, [WEIGHTS])
    # 6 + 64 + 6 = 76 fits in 80 only because the file is not charged again.
    assert budget.device("cpu").uncharged_bytes([WEIGHTS]) == 0
    assert budget.try_reserve("cpu", B, 6, [WEIGHTS])
    assert budget.device("cpu").reserved_bytes == 76
    # A model mapping a file nobody holds pays for the file: 76 + 1 + 30 > 80.
    assert not budget.try_reserve("cpu", C, 1, [OTHER])
    assert budget.device("cpu").reserved_bytes == 76, "a refused reservation changes nothing"
    assert OTHER not in budget.device("cpu").shared


def test_the_file_is_released_with_its_last_user() -> None:
    budget = MemoryBudget({"cpu": 100})
    budget.try_reserve("cpu", A, 6, [WEIGHTS])
    budget.try_reserve("cpu", B, 7, [WEIGHTS])
    # While B maps it too, releasing A gives back only A's private part.
    assert budget.reserved("cpu", A) == 6
    assert budget.release("cpu", A) == 6
    assert budget.device("cpu").reserved_bytes == 7 + 64
    # B is now the only user: releasing it frees the file as well.
    assert budget.reserved("cpu", B) == 7 + 64
    assert budget.release("cpu", B) == 7 + 64
    assert budget.device("cpu").reserved_bytes == 0
    assert budget.device("cpu").shared == {}


def test_resize_changes_the_private_part_and_keeps_the_files() -> None:
    budget = MemoryBudget({"cpu": 100})
    budget.try_reserve("cpu", A, 20, [WEIGHTS])
    assert budget.resize("cpu", A, 5)
    assert budget.device("cpu").reserved_bytes == 5 + 64
    assert not budget.resize("cpu", A, 40), "40 + 64 is over the budget"
    assert budget.reserved("cpu", A) == 5 + 64


def test_a_whole_budget_check_counts_files_once_even_if_listed_twice() -> None:
    budget = MemoryBudget({"cpu": 70})
    assert budget.try_reserve("cpu", A, 6, [WEIGHTS, WEIGHTS])
    assert budget.device("cpu").reserved_bytes == 70


def test_a_replaced_file_is_another_file(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx.data"
    path.write_bytes(b"x" * 10)
    before = MappedFile.of(path)
    path.unlink()
    path.write_bytes(b"y" * 12)
    after = MappedFile.of(path)
    assert before != after
    assert (after.path, after.size) == (str(path.resolve()), 12)


def test_hard_links_are_one_file(tmp_path: Path) -> None:
    first = tmp_path / "1.data"
    first.write_bytes(b"w" * 8)
    (tmp_path / "2.data").hardlink_to(first)
    one, two = MappedFile.of(first), MappedFile.of(tmp_path / "2.data")
    assert one == two
    assert one.path != two.path


def test_weight_files_are_the_version_folder_but_graph_and_manifest(tmp_path: Path) -> None:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(b"graph")
    (version / "model.onnx.data").write_bytes(b"w" * 100)
    (version / "modelyard-manifest.json").write_text("{}")
    shared = tmp_path / "shared.data"
    shared.write_bytes(b"s" * 50)
    (version / "linked.data").symlink_to(shared)
    files = {Path(f.path).name: f.size for f in weight_files(version)}
    assert files == {"model.onnx.data": 100, "shared.data": 50}


SMAPS = """\
7f0000000000-7f0000100000 r--p 00000000 08:01 42    /repo/a/1/model.onnx.data
Size:               1024 kB
Rss:                1024 kB
Pss:                1024 kB
Private_Clean:       512 kB
Private_Dirty:       256 kB
Shared_Clean:        256 kB
7f0000200000-7f0000300000 rw-p 00000000 00:00 0
Rss:                2048 kB
Private_Dirty:      2048 kB
7f0000400000-7f0000500000 r--p 00100000 08:01 42    /repo/a/1/model.onnx.data
Private_Clean:       100 kB
VmFlags: rd mr mw me
7f0000600000-7f0000700000 r--p 00000000 08:01 43    /usr/lib/libonnxruntime.so
Private_Clean:       300 kB
"""


@pytest.mark.parametrize(
    ("paths", "expected_kib"),
    [({"/repo/a/1/model.onnx.data"}, 512 + 256 + 100), (set(), 0), ({"/elsewhere"}, 0)],
)
def test_mapped_private_bytes_sum_only_the_named_files(paths: set[str], expected_kib: int) -> None:
    uss, mapped = parse_mapped_private(SMAPS, paths)
    assert uss == (512 + 256 + 2048 + 100 + 300) * 1024
    assert mapped == expected_kib * 1024


def test_freed_by_counts_a_shared_file_only_when_all_its_users_leave() -> None:
    budget = MemoryBudget({"cpu": 200})
    budget.try_reserve("cpu", A, 6, [WEIGHTS])
    budget.try_reserve("cpu", B, 7, [WEIGHTS])
    budget.try_reserve("cpu", C, 5, [OTHER])
    assert budget.freed_by("cpu", [A]) == 6
    assert budget.freed_by("cpu", [A, B]) == 6 + 7 + 64
    assert budget.freed_by("cpu", [A, B], keep=[WEIGHTS]) == 6 + 7, "a file the loader maps"
    assert budget.freed_by("cpu", [C]) == 5 + 30
    assert budget.freed_by("cpu", []) == 0


def test_one_read_of_smaps_gives_the_sample_and_the_mapped_part() -> None:
    sample, mapped = parse_smaps_sample(SMAPS, {"/repo/a/1/model.onnx.data"})
    assert sample.rss_bytes == (1024 + 2048) * 1024
    assert sample.pss_bytes == 1024 * 1024
    assert sample.uss_bytes == (512 + 256 + 2048 + 100 + 300) * 1024
    assert mapped == (512 + 256 + 100) * 1024


def test_a_path_that_only_ends_like_the_weight_file_is_not_it() -> None:
    _, mapped = parse_mapped_private(SMAPS, {"/1/model.onnx.data"})
    assert mapped == 0
