"""Where a Ray actor reads its version's files, and their check before the load.

Without a model store, the actor reads the path the server gave (every node must see the
repository there) and checks the manifest when there is one. With ``ray.model_store``,
the server sends the version's path inside the store instead; the actor fetches it into
its node's cache (repository/store.py: once per node, verified against the manifest's
SHA256, a cached copy checked again) and loads from the cache.
No Ray import here: the actors run as plain Python in tests.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from modelyard.repository.manifest import load_public_key, verify_manifest
from modelyard.repository.store import ModelStore
from modelyard.runtimes.base import RuntimeSpec
from modelyard.workers.cluster_nodes import device_node

__all__ = ["NodeFiles", "VersionFiles", "node_cache_dir", "version_files"]


@dataclasses.dataclass(frozen=True, slots=True)
class NodeFiles:
    """The store an actor fetches from: sent with the load, picklable."""

    uri: str
    """``ray.model_store``."""
    cache_dir: str
    """``ray.node_cache_dir`` (``{node}`` is the node's name); empty: the node's
    temporary folder."""
    relative: str
    """``MODEL/VERSION``: the version inside the store."""


@dataclasses.dataclass(frozen=True, slots=True)
class VersionFiles:
    """The spec to load (its ``version_dir`` local to this node) and how it was found."""

    spec: RuntimeSpec
    verified: bool
    """A manifest was checked on this node."""
    store_fetch: str
    """``fetched``, ``cached`` (from the store), or empty (the server's path)."""


def node_cache_dir(template: str, node: str) -> Path:
    """This node's cache folder for ``template`` (``ray.node_cache_dir``)."""
    if not template:
        return Path(tempfile.gettempdir()) / "modelyard-store" / (node or "local")
    return Path(template.replace("{node}", node or "local"))


def version_files(
    spec: RuntimeSpec, files: NodeFiles | None, public_keys: list[str], require_manifest: bool
) -> VersionFiles:
    """The version's files on this node, checked against its manifest (ManifestError or
    StoreError, both ModelLoadErrors, when they cannot be had or do not match)."""
    keys = [load_public_key(k) for k in public_keys]
    if files is None:
        verified = verify_manifest(
            Path(spec.version_dir), public_keys=keys, require=require_manifest
        )
        return VersionFiles(spec, verified, "")
    store = ModelStore(files.uri, node_cache_dir(files.cache_dir, device_node(spec.device)))
    stored = store.fetch(files.relative, keys)
    local = dataclasses.replace(spec, version_dir=str(stored.path))
    return VersionFiles(local, True, "fetched" if stored.fetched else "cached")
