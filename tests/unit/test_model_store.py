"""The shared model store (repository/store.py) and an actor's view of its files
(workers/ray_files.py), on real folders through fsspec's ``file://`` backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelyard.examples.mlp import build_add_onnx
from modelyard.repository.manifest import MANIFEST_NAME, ManifestError, write_manifest
from modelyard.repository.store import ModelStore, StoreError, store_relative_path
from modelyard.runtimes.base import RuntimeSpec
from modelyard.workers.ray_files import NodeFiles, node_cache_dir, version_files

pytest.importorskip("fsspec")


def stored_add(store: Path, k: float, name: str = "add") -> Path:
    """``name/1`` in ``store``: ``output = input + k`` with its manifest."""
    folder = store / name / "1"
    build_add_onnx(folder / "model.onnx", k)
    write_manifest(folder)
    return folder


def test_a_version_is_fetched_once_into_the_cache_and_verified(tmp_path: Path) -> None:
    source = stored_add(tmp_path / "store", 1.0)
    store = ModelStore((tmp_path / "store").as_uri(), tmp_path / "cache")
    first = store.fetch("add/1")
    assert first.fetched
    assert first.path.is_relative_to(tmp_path / "cache")
    assert (first.path / "model.onnx").read_bytes() == (source / "model.onnx").read_bytes()
    again = store.fetch("add/1")
    assert not again.fetched
    assert again.path == first.path
    # Nothing half-written is left beside the published copy.
    assert [p.name for p in first.path.parent.iterdir() if ".partial" in p.name] == []


def test_a_file_that_does_not_match_its_manifest_is_never_cached(tmp_path: Path) -> None:
    source = stored_add(tmp_path / "store", 1.0)
    (source / "model.onnx").write_bytes(b"not the model the manifest hashed")
    store = ModelStore((tmp_path / "store").as_uri(), tmp_path / "cache")
    with pytest.raises(ManifestError, match="SHA256"):
        store.fetch("add/1")
    assert not any(
        p.is_dir() and not p.name.startswith(".") for p in (tmp_path / "cache" / "add").iterdir()
    )


def test_a_version_without_a_manifest_is_refused(tmp_path: Path) -> None:
    build_add_onnx(tmp_path / "store" / "add" / "1" / "model.onnx", 1.0)
    store = ModelStore((tmp_path / "store").as_uri(), tmp_path / "cache")
    with pytest.raises(StoreError, match=MANIFEST_NAME):
        store.fetch("add/1")


@pytest.mark.parametrize("name", ["../../outside.onnx", "/etc/passwd", "a/../../b"])
def test_a_manifest_naming_a_file_outside_its_folder_is_refused(tmp_path: Path, name: str) -> None:
    source = stored_add(tmp_path / "store", 1.0)
    doc = json.loads((source / MANIFEST_NAME).read_text())
    doc["files"][name] = {"sha256": "0" * 64, "size": 1}
    (source / MANIFEST_NAME).write_text(json.dumps(doc))
    store = ModelStore((tmp_path / "store").as_uri(), tmp_path / "cache")
    with pytest.raises(StoreError, match="not a plain relative path"):
        store.fetch("add/1")
    with pytest.raises(StoreError, match="not a plain relative path"):
        store.fetch("../add/1")


def test_a_version_published_again_with_other_files_is_fetched_again(tmp_path: Path) -> None:
    stored_add(tmp_path / "store", 1.0)
    store = ModelStore((tmp_path / "store").as_uri(), tmp_path / "cache")
    first = store.fetch("add/1")
    stored_add(tmp_path / "store", 2.0)
    second = store.fetch("add/1")
    assert second.fetched
    assert second.path != first.path


def test_an_actor_loads_from_its_nodes_cache_and_a_tampered_copy_is_fetched_anew(
    tmp_path: Path,
) -> None:
    stored_add(tmp_path / "store", 1.0)
    files = NodeFiles((tmp_path / "store").as_uri(), str(tmp_path / "cache-{node}"), "add/1")
    spec = RuntimeSpec(kind="onnx", version_dir="add/1", model_name="add", device="a/cpu")
    found = version_files(spec, files, [], require_manifest=False)
    assert found.store_fetch == "fetched"
    assert found.verified
    assert Path(found.spec.version_dir).is_relative_to(tmp_path / "cache-a")
    assert version_files(spec, files, [], require_manifest=False).store_fetch == "cached"
    # A cached copy changed on the node is caught before the load and replaced.
    model = Path(found.spec.version_dir) / "model.onnx"
    model.write_bytes(b"tampered on the node")
    again = version_files(spec, files, [], require_manifest=False)
    assert again.store_fetch == "fetched"
    assert model.read_bytes() == (tmp_path / "store" / "add" / "1" / "model.onnx").read_bytes()


def test_paths_map_into_the_store_and_node_caches() -> None:
    root = Path("/srv/repo")
    assert store_relative_path(root / "add" / "1", root) == "add/1"
    with pytest.raises(StoreError, match="outside the model repository"):
        store_relative_path(Path("/elsewhere/add/1"), root)
    assert node_cache_dir("/var/cache/my-{node}", "a") == Path("/var/cache/my-a")
    assert node_cache_dir("", "b").parts[-2:] == ("modelyard-store", "b")
